"""One self-contained HTML report of a run: summary, figures, scenario.

plotly.js is embedded once, inline, so the file opens offline and can be mailed around.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import plotly.io as pio
from plotly.offline import get_plotlyjs

from simulator.results.moe import moe_lines
from simulator.results.simulation import Simulation
from simulator.scenario.notes import bandwidth_lines, overlap_settings, setting_notes, why_lines
from simulator.units import MILLISECOND, format_bytes, format_time
from simulator.viz.breakdown import breakdown_figure
from simulator.viz.faults import perturbations_figure, samples_figure
from simulator.viz.links import link_heatmap_figure, top_links_figure
from simulator.viz.memory import memory_figure
from simulator.viz.timeline import timeline_figure

__all__ = ["write_report", "report_html", "summary_rows", "report_figures", "effective_settings", "KEY_SETTINGS",
           "oom_banner"]

_PLOTLY_CONFIG = {"displaylogo": False, "responsive": True}

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto; max-width: 1280px;
       padding: 0 1rem; color: #222; }
h1 { font-size: 1.5rem; margin-bottom: .2rem; } h2 { font-size: 1.15rem; margin-top: 2rem; }
.sub { color: #666; font-size: .9rem; }
table.summary { border-collapse: collapse; margin-top: 1rem; }
table.summary td { padding: .25rem .8rem; border-bottom: 1px solid #eee; vertical-align: top; }
table.summary td:first-child { font-weight: 600; white-space: nowrap; }
.oom { color: #c00; font-weight: 700; } .ok { color: #080; }
.oom-banner { background: #fde8e8; border: 2px solid #c00; color: #900; padding: .8rem 1rem; margin: 1rem 0;
              font-weight: 600; }
pre.scenario { background: #f6f6f6; padding: 1rem; overflow-x: auto; font-size: .8rem; }
.figure { margin-top: 1rem; }
table.settings { border-collapse: collapse; font-size: .85rem; }
table.settings th, table.settings td { padding: .15rem .7rem; border-bottom: 1px solid #eee; text-align: left; }
table.settings td:first-child { font-family: ui-monospace, monospace; }
.note { color: #555; font-size: .85rem; max-width: 70rem; }
"""


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole > 0 else "-"


def summary_rows(result: Any, scenario: Any) -> list[tuple[str, str]]:
    """(metric, value) pairs of the summary table, as plain text."""
    par = scenario.parallelism
    cluster = scenario.cluster
    step = result.step_time_s
    layout = f"tp {par.tp} x pp {par.pp} x cp {par.cp} x dp {result.dp}, sharding {par.sharding}"
    if par.pp > 1:
        layout += f", {par.pipeline_schedule}" + (f" v={par.virtual_stages}" if par.virtual_stages > 1 else "")
    mem = max(result.memory, key=lambda m: m.peak_bytes)
    b = result.breakdown
    invalid = " (not valid: out of memory)" if result.oom else ""
    rows = [
        ("cluster", f"{cluster.n_nodes} x {cluster.node_type.name} = {result.world_size} x {cluster.gpu_name}"),
        *(("", line) for line in bandwidth_lines(cluster)),
        ("layout", layout),
        ("framework", scenario.framework),
        *(("", f"{path} = {json.dumps(value) if not isinstance(value, str) else value} ({source})")
          for path, value, source in scenario.framework_settings() if path not in _effective_paths(scenario)),
        *(("", f"{path} = {text} ({source})") for path, text, source in overlap_settings(scenario)),
        ("batch", f"micro-batch {scenario.training.micro_batch} x {result.micro_batches} micro-batches x dp "
                  f"{result.dp} = {result.global_batch} sequences of {scenario.model.seq_len} tokens, "
                  f"{scenario.training.precision}, recompute {scenario.training.recompute}"),
        ("model", f"{scenario.model.label}: {result.params / 1e9:.2f} B parameters"),
        ("step time", format_time(step) + invalid),
        ("throughput", f"{result.tokens_per_s:,.0f} tokens/s ({result.samples_per_s:,.1f} samples/s){invalid}"),
        ("per GPU", f"{result.tflops_per_gpu:.1f} TFLOP/s model, {result.hardware_tflops_per_gpu:.1f} hardware; "
                    f"MFU {100 * result.mfu:.1f}%, HFU {100 * result.hfu:.1f}%{invalid}"),
        *moe_lines(result.moe),
        ("peak memory", f"{format_bytes(mem.peak_bytes)} of {format_bytes(mem.capacity_bytes)} (rank {mem.rank}): "
                        + ("OUT OF MEMORY" if result.oom else "fits")
                        + f"; caching allocator: allocated {format_bytes(result.peak_allocated_bytes)}, "
                        f"reserved {format_bytes(result.peak_reserved_bytes)}"),
    ]
    if result.oom_detail is not None:
        rows.append(("", result.oom_detail.message))
    rows.append(("critical rank", f"rank {b.rank} (stage {b.stage})"))
    rows.append(("  compute", f"{format_time(b.compute_s)} ({_pct(b.compute_s, step)})"))
    for kind, value in b.exposed_comm_s.items():
        rows.append((f"  exposed {kind} comm", f"{format_time(value)} ({_pct(value, step)}), in flight "
                                               f"{format_time(b.comm_s.get(kind, 0.0))}"))
    if b.bubble_s > 0:
        rows.append(("  pipeline bubble", f"{format_time(b.bubble_s)} ({_pct(b.bubble_s, step)})"))
    if b.idle_s > 0:
        rows.append(("  idle", f"{format_time(b.idle_s)} ({_pct(b.idle_s, step)})"))
    rows += [("why", line) for line in why_lines(scenario, b, step)]
    rows += [("note", line) for line in setting_notes(scenario)]
    for link in result.links[:3]:
        rows.append(("busy link", f"{link.label}: {100 * link.utilisation:.0f}% of {link.kind} capacity"))
    rows += [
        ("calibration", result.calibration),
        ("FLOPs convention", result.flops_convention),
        ("engine", f"{result.engine.get('tasks')} tasks on {result.engine.get('simulated_ranks')} simulated ranks, "
                   f"{result.engine.get('network')} network, symmetry {result.engine.get('symmetry')}"),
        ("simulator", f"dtsim {result.simulator_version}, scenario hash {result.scenario_hash[:16]}"),
    ]
    return rows


def _effective_paths(scenario: Any) -> set[str]:
    return {path for path, _, _ in overlap_settings(scenario)}


def oom_banner(result: Any) -> str:
    """The HTML banner of a run that does not fit ('' when it fits)."""
    if not result.oom:
        return ""
    mem = max(result.memory, key=lambda m: m.peak_bytes)
    detail = f"<br>{html.escape(result.oom_detail.message)}" if result.oom_detail is not None else ""
    return (f'<div class="oom-banner" role="alert">OUT OF MEMORY: this configuration does not fit '
            f"({format_bytes(mem.peak_bytes)} needed on rank {mem.rank}, {format_bytes(mem.capacity_bytes)} "
            "available). Step time, throughput and MFU below are what it would reach if it fitted; they are not "
            f"achievable as configured.{detail}</div>")


def report_figures(sim: Simulation) -> list[tuple[str, Any]]:
    """(section title, plotly figure) of every figure in the report, in order; a run with a
    ``faults`` section adds the table of its perturbations, and one with ``sim.samples`` > 1 the
    step-time distribution (:mod:`simulator.viz.faults`)."""
    figures = [
        ("Time breakdown", breakdown_figure(sim.result)),
        ("Timeline", timeline_figure(sim)),
        ("Memory", memory_figure(sim)),
        ("Link utilisation", link_heatmap_figure(sim)),
        ("Busiest links", top_links_figure(sim)),
    ]
    optional = [("Step-time distribution", samples_figure(sim.result)),
                ("Perturbations", perturbations_figure(sim.result))]
    return figures + [(title, fig) for title, fig in optional if fig is not None]


# the settings a 3D-parallel run is read by, listed first in the effective-settings table
KEY_SETTINGS = (
    "framework", "parallelism.tp", "parallelism.pp", "parallelism.cp", "parallelism.dp",
    "parallelism.sequence_parallel", "parallelism.pipeline_schedule", "parallelism.virtual_stages",
    "parallelism.sharding", "training.micro_batch", "training.global_batch", "training.precision",
    "training.recompute",
)


def effective_settings(result: Any, scenario: Any) -> list[tuple[str, str, str]]:
    """(setting, effective value, source) rows of the report's settings table: the
    :data:`KEY_SETTINGS`, then every framework-profile setting that differs from dtsim's
    defaults (``framework_setting_rows``, what ``dtsim run`` prints), with the setting that
    decides gradient overlap shown by its value where the profile leaves it null
    (``scenario.notes.overlap_settings``). Source is the
    framework's name, ``scenario`` or ``default``; ``dp: auto`` shows the size it resolved to."""
    from simulator.scenario.framework import framework_setting_rows, setting_row

    rows = [setting_row(scenario, path) for path in KEY_SETTINGS]
    rows = [(p, f"auto (= {result.dp})" if p == "parallelism.dp" and v == "auto" else v, src) for p, v, src in rows]
    overlap = {path: (path, text, source) for path, text, source in overlap_settings(scenario)}
    rows = [overlap.pop(p, (p, v, src)) for p, v, src in rows]
    seen = set(KEY_SETTINGS)
    profile = [overlap.pop(row[0], row) for row in framework_setting_rows(scenario) if row[0] not in seen]
    return rows + profile + list(overlap.values())


def _settings_html(result: Any, scenario: Any) -> str:
    body = "\n".join(f"<tr><td>{html.escape(p)}</td><td>{html.escape(v)}</td><td>{html.escape(src)}</td></tr>"
                     for p, v, src in effective_settings(result, scenario))
    return ('<h2>Effective settings</h2>\n<table class="settings">\n'
            f"<tr><th>setting</th><th>value</th><th>source</th></tr>\n{body}\n</table>")


def _figure_note(fig: Any) -> str:
    """The explanation a figure carries in ``layout.meta["note"]`` as a paragraph, or nothing."""
    meta = fig.layout.meta
    note = meta.get("note") if isinstance(meta, dict) else None
    return f'\n<p class="note">{html.escape(note)}</p>' if note else ""


def report_html(sim: Simulation, scenario: Any) -> str:
    """The report as one HTML string: title, summary table, figures (plotly.js inline,
    once, in the head), and the resolved scenario as JSON."""
    result = sim.result
    title = html.escape(result.name)
    table = "\n".join(
        f"<tr><td>{html.escape(k)}</td><td{_cls(k, v)}>{html.escape(v)}</td></tr>" for k, v in summary_rows(result, scenario)
    )
    sections = []
    for i, (heading, fig) in enumerate(report_figures(sim)):
        div = pio.to_html(fig, full_html=False, include_plotlyjs=False, div_id=f"figure-{i}", config=_PLOTLY_CONFIG)
        sections.append(f'<h2>{html.escape(heading)}</h2>\n<div class="figure">{div}</div>{_figure_note(fig)}')
    scenario_json = json.dumps(scenario.model_dump(mode="json", by_alias=True), indent=2)
    step_ms = result.step_time_s / MILLISECOND
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>dtsim: {title}</title>
<style>{_CSS}</style>
<script type="text/javascript">{get_plotlyjs()}</script>
</head>
<body>
<h1>{"OUT OF MEMORY: " if result.oom else ""}{title}</h1>
{oom_banner(result)}
<div class="sub">one training iteration: {step_ms:.1f} ms · dtsim {html.escape(result.simulator_version)} ·
scenario {html.escape(result.scenario_hash[:16])} · {html.escape(result.calibration)}</div>
<table class="summary">
{table}
</table>
{_settings_html(result, scenario)}
{chr(10).join(sections)}
<h2>Scenario (resolved)</h2>
<pre class="scenario">{html.escape(scenario_json, quote=False)}</pre>
</body>
</html>
"""


def _cls(key: str, value: str) -> str:
    if key == "peak memory":
        return ' class="oom"' if value.endswith("OUT OF MEMORY") else ' class="ok"'
    return ""


def write_report(sim: Simulation, scenario: Any, path: str | Path) -> Path:
    """Write :func:`report_html` of ``sim`` (simulated from ``scenario``) to ``path``.

    The link heatmap needs ``run_simulation(scenario, record_series=True)``; without it that
    figure says the loads were not recorded."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report_html(sim, scenario), encoding="utf-8")
    return out
