"""User-controlled text never reaches the terminal raw (simulator/cli/common.py: ``safe``,
``printable``): console markup in a scenario name, an unknown key or a file name is shown
literally, and control characters (ESC, BEL, C1 CSI, bidi overrides) are written as visible
escapes. The hostile strings are built here, the CLI runs in a subprocess with a timeout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from simulator.cli.common import one_line, printable, safe

ROOT = Path(__file__).resolve().parents[1]
ESC, BEL, CSI = "\x1b", "\x07", "\x9b"
HOSTILE = [
    "[/oops]",
    "[link=https://example.invalid]click[/link]",
    "[bold red]not bold[/]",
    f"{ESC}]0;retitled{BEL}name",
    f"{ESC}[31mred{ESC}[0m",
    f"{CSI}2Jcleared",
    "right\u202eleft",
    "line\nbreak",
    "back\\[slash]",
]
RAW = (ESC, BEL, CSI, "\u202e")


def _dtsim(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DTSIM_DEBUG"}
    env.update({"PYTHONPATH": str(ROOT), "COLUMNS": "200"})
    return subprocess.run([sys.executable, "-m", "simulator.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=180, env=env)


def _scenario(tmp_path: Path, name: str, extra: str = "") -> Path:
    path = tmp_path / "s.yaml"
    quoted = name.encode("unicode_escape").decode("ascii").replace('"', '\\"')  # a YAML double-quoted string
    path.write_text(f'name: "{quoted}"\nmodel: gpt3-125m\ncluster: {{node: p4d.24xlarge, nodes: 1}}\n'
                    f"training: {{micro_batch: 1, global_batch: 8}}\n{extra}")
    return path


@settings(max_examples=200, derandomize=True, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=40) | st.sampled_from(HOSTILE))
def test_safe_text_renders_literally_and_without_control_characters(text: str) -> None:
    """Whatever the text, ``safe`` embedded between tags (as every command uses it) renders
    through rich without a markup error, shows exactly ``printable(text)`` (markup taken
    literally, the closing tag still a tag), and leaves no control character behind."""
    console = Console(record=True, width=10_000, color_system=None, force_terminal=False, soft_wrap=True)
    console.print(f"[bold]{safe(text)}[/bold]|[red]{safe(text)}[/]", end="")
    shown = console.export_text()
    assert shown == printable(text) + "|" + printable(text)
    assert not any(ch in shown for ch in RAW) and "\n" not in shown
    assert not any(0x80 <= ord(ch) <= 0x9F or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in shown)


def test_printable_writes_escapes_and_one_line_collapses() -> None:
    """ESC is written as the four characters \\x1b, BEL as \\x07; newlines become \\n."""
    assert printable(f"{ESC}]0;t{BEL}") == "\\x1b]0;t\\x07"
    assert printable("a\nb") == "a\\nb" and printable("plain [text]") == "plain [text]"
    assert one_line("a\n  b\nc") == "a b c" and len(one_line("x" * 1000, 50)) == 50


@pytest.mark.parametrize("name", HOSTILE, ids=range(len(HOSTILE)))
def test_run_prints_a_hostile_scenario_name_literally(tmp_path: Path, name: str) -> None:
    done = _dtsim("run", str(_scenario(tmp_path, name)))
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and not any(ch in done.stdout for ch in RAW)
    assert printable(name) in done.stdout  # the title, shown literally


def test_unknown_key_and_file_name_are_escaped(tmp_path: Path) -> None:
    """A hostile unknown key (error path) and a hostile file name (missing file) come back as
    one escaped line, exit 2."""
    key = f"bogus{ESC}[31m[/x]"
    path = _scenario(tmp_path, "ok", extra=f'"{key.encode("unicode_escape").decode()}": 1\n')
    done = _dtsim("run", str(path))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "unknown field" in done.stderr and "\\x1b[31m[/x]" in done.stderr and ESC not in done.stderr
    missing = _dtsim("run", str(tmp_path / f"[/oops]{ESC}]0;t{BEL}.yaml"))
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1, missing.stderr
    assert "[/oops]" in missing.stderr and not any(ch in missing.stderr for ch in RAW)


def test_report_counts() -> None:
    """The hostile inputs this module feeds the CLI: one per HOSTILE name plus two (key, file name)."""
    assert len(HOSTILE) + 2 == 11
