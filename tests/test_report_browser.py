"""The HTML report renders in a real browser (Debian's chromium, headless).

The test loads a copy of the report with a small probe script in front of everything else:
it records uncaught errors, rejected promises and ``console.error`` calls, and after the
page has loaded writes what it found (plots, plotly's SVG layers, errors) into the DOM,
which ``--dump-dom`` prints. Chromium's own console log (``--enable-logging=stderr``) must
not show an uncaught exception either. If chromium is missing, the test installs it with
apt-get (as root; CI does the same in .ci/run) and skips only when that is impossible.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

import simulator
from simulator.viz.report import effective_settings, write_report

pytestmark = pytest.mark.browser

PROBE = """<script>
window.__dtsimErrors = [];
window.addEventListener('error', function (e) { window.__dtsimErrors.push('error: ' + (e.message || e)); });
window.addEventListener('unhandledrejection', function (e) {
  window.__dtsimErrors.push('unhandled rejection: ' + e.reason); });
(function () {
  var original = console.error;
  console.error = function () {
    window.__dtsimErrors.push('console.error: ' + Array.prototype.join.call(arguments, ' '));
    return original.apply(console, arguments);
  };
})();
window.addEventListener('load', function () {
  setTimeout(function () {
    var count = function (selector) { return document.querySelectorAll(selector).length; };
    var pre = document.createElement('pre');
    pre.id = 'dtsim-probe';
    pre.textContent = JSON.stringify({
      errors: window.__dtsimErrors,
      plotly: window.Plotly ? window.Plotly.version : null,
      plots: count('.js-plotly-plot'),
      main_svg: count('svg.main-svg'),
      bars: count('.barlayer .point'),
      heatmap_images: count('.heatmaplayer image'),
      scatter_traces: count('.scatterlayer .trace'),
      settings_rows: count('table.settings tr'),
    });
    document.body.appendChild(pre);
  }, 1000);
});
</script>
"""

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--enable-logging=stderr", "--v=0", "--virtual-time-budget=30000"]


def _chromium() -> str:
    """Path of chromium; installs Debian's package when missing and possible, else skips."""
    for candidate in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    if shutil.which("apt-get") and hasattr(os, "geteuid") and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=900, check=False)
        subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], env=env, capture_output=True, timeout=1800,
                       check=False)
        if os.access("/usr/bin/chromium", os.X_OK):
            return "/usr/bin/chromium"
    pytest.skip("chromium is not installed and cannot be installed here (needs root and apt-get)")


def _render(chromium: str, page: Path, profile: Path) -> tuple[dict[str, Any], str]:
    proc = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", page.as_uri()],
                          capture_output=True, text=True, timeout=240, check=False)
    found = re.search(r'<pre id="dtsim-probe">(.*?)</pre>', proc.stdout, re.S)
    assert found, f"no probe output (exit {proc.returncode}); stderr tail:\n{proc.stderr[-3000:]}"
    return json.loads(html.unescape(found.group(1))), proc.stderr


def _probed_copy(report: Path, out: Path) -> Path:
    text = report.read_text(encoding="utf-8")
    assert "<head>" in text
    out.write_text(text.replace("<head>", "<head>\n<meta charset=\"utf-8\">\n" + PROBE, 1), encoding="utf-8")
    return out


def test_report_renders_in_chromium(tmp_path: Path) -> None:
    chromium = _chromium()
    sc = simulator.load_scenario("scenarios/quickstart.yaml", overrides=["parallelism.tp=2", "parallelism.pp=2"])
    result = simulator.run_simulation(sc, record_series=True)
    report = write_report(result, sc, tmp_path / "report.html")
    probe, stderr = _render(chromium, _probed_copy(report, tmp_path / "probed.html"), tmp_path / "profile")
    assert probe["errors"] == []
    assert probe["plotly"] is not None
    assert probe["plots"] == 5  # breakdown, timeline, memory, link heatmap, busiest links
    assert probe["main_svg"] >= 2 * probe["plots"]  # plotly draws two stacked main-svg per plot
    bars_expected = len(result.rows) + len(result.result.links[:10])  # timeline tasks + busiest links ...
    assert probe["bars"] >= bars_expected  # ... + the breakdown's stacked parts
    assert probe["heatmap_images"] == 1
    assert probe["scatter_traces"] >= len(result.result.memory)  # memory: a line per stage, a rank's stack
    assert probe["settings_rows"] == 1 + len(effective_settings(result.result, sc))  # header + one per setting
    console = [line for line in stderr.splitlines() if ":CONSOLE" in line]
    assert not [line for line in console if "Uncaught" in line or "console.error" in line], console


def test_probe_sees_errors(tmp_path: Path) -> None:
    """The probe reports a broken page, so the test above can fail."""
    chromium = _chromium()
    page = tmp_path / "broken.html"
    page.write_text("<html><head></head><body><script>console.error('boom'); notDefined();</script></body></html>")
    probe, stderr = _render(chromium, _probed_copy(page, tmp_path / "probed.html"), tmp_path / "profile")
    assert probe["plots"] == 0
    assert probe["errors"][0] == "console.error: boom"
    assert "notDefined is not defined" in probe["errors"][1]
    assert any("Uncaught" in line for line in stderr.splitlines() if ":CONSOLE" in line)
