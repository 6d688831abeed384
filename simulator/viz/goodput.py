"""Goodput figures: where a run's wall-clock goes, ETTR and time-to-train against cluster size
and against the checkpoint interval, and the goodput report (``dtsim goodput --report``).

The figures take the estimates of :mod:`simulator.goodput` (plain numbers); the cluster-size
curve re-estimates the same job with data-parallel replicas added or removed
(:meth:`~simulator.goodput.model.GoodputInputs.scaled`: the step time of the simulated point,
tokens per step in proportion to dp), so it shows the failures, not the step's own scaling
(a sweep over cluster.nodes simulates each size: ``scenarios/sweeps/llama3-405b-goodput-nodes.yaml``).
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from simulator.viz.style import TEMPLATE

__all__ = ["breakdown_figure", "ettr_vs_nodes_figure", "ettr_vs_interval_figure", "goodput_report_html",
           "BREAKDOWN_PARTS"]

BREAKDOWN_PARTS = (("productive steps", "productive_s", "#4c78a8"), ("checkpoint writes", "checkpoint_s", "#f58518"),
                   ("lost work", "lost_s", "#e45756"), ("restarts", "restart_s", "#bab0ac"))
_DAY = 86400.0


def breakdown_figure(est: Any) -> go.Figure:
    """One horizontal bar of the expected wall-clock in days, split into its four parts."""
    fig = go.Figure()
    run = est.run
    for label, attr, colour in BREAKDOWN_PARTS:
        seconds = getattr(run, attr)
        fig.add_bar(y=["wall-clock"], x=[seconds / _DAY], name=label, orientation="h", marker_color=colour,
                    hovertemplate=f"{label}: %{{x:.2f}} days ({seconds / run.wall_s:.1%})<extra></extra>")
    fig.update_layout(barmode="stack", template=TEMPLATE, height=220, xaxis_title="days",
                      title=f"Expected wall-clock {run.wall_s / _DAY:.1f} days, ETTR {est.ettr:.1%}")
    return fig


def ettr_vs_nodes_figure(nodes: Sequence[int], estimates: Sequence[Any], *, marked: int | None = None) -> go.Figure:
    """ETTR (left) and expected days to train (right) against node count."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("ETTR", "expected time-to-train"))
    fig.add_scatter(x=list(nodes), y=[e.ettr for e in estimates], mode="lines+markers", name="ETTR", row=1, col=1)
    fig.add_scatter(x=list(nodes), y=[e.wall_s / _DAY for e in estimates], mode="lines+markers", name="with failures",
                    row=1, col=2)
    fig.add_scatter(x=list(nodes), y=[e.steps * e.step_time_s / _DAY for e in estimates], mode="lines",
                    name="no failures", line={"dash": "dot"}, row=1, col=2)
    for col in (1, 2):
        fig.update_xaxes(type="log", title_text="nodes", row=1, col=col)
        if marked is not None:
            fig.add_vline(x=marked, line={"dash": "dash", "color": "#999"}, row=1, col=col)
    fig.update_yaxes(tickformat=".0%", row=1, col=1)
    fig.update_yaxes(type="log", title_text="days", row=1, col=2)
    fig.update_layout(template=TEMPLATE, height=380, title="Cluster size against ETTR and time-to-train "
                      "(data-parallel replicas added or removed at the simulated step time)")
    return fig


def ettr_vs_interval_figure(intervals_s: Sequence[float], estimates: Sequence[Any], *,
                            optimum_s: float | None = None) -> go.Figure:
    """ETTR against the checkpoint interval (minutes), the optimum marked."""
    fig = go.Figure()
    fig.add_scatter(x=[t / 60 for t in intervals_s], y=[e.ettr for e in estimates], mode="lines+markers", name="ETTR")
    if optimum_s is not None:
        fig.add_vline(x=optimum_s / 60, line={"dash": "dash", "color": "#999"},
                      annotation_text=f"optimum {optimum_s / 60:.1f} min")
    fig.update_layout(template=TEMPLATE, height=380, xaxis={"type": "log", "title": "checkpoint interval (minutes)"},
                      yaxis={"title": "ETTR", "tickformat": ".1%"}, title="Checkpoint interval against ETTR")
    return fig


def goodput_report_html(title: str, rows: Sequence[tuple[str, str]], figures: Sequence[tuple[str, go.Figure]],
                        estimate_json: dict[str, Any]) -> str:
    """A self-contained HTML page: the summary table, the figures and the estimate as JSON."""
    table = "\n".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in rows)
    sections = "\n".join(
        f"<h2>{html.escape(h)}</h2>\n" + pio.to_html(f, full_html=False, include_plotlyjs=False, div_id=f"g{i}")
        for i, (h, f) in enumerate(figures))
    data = html.escape(json.dumps(estimate_json, indent=2, default=str), quote=False)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>dtsim goodput: {html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em}}td{{padding:2px 12px}}pre{{background:#f6f6f6;padding:1em}}</style>
<script type="text/javascript">{get_plotlyjs()}</script></head>
<body><h1>Goodput: {html.escape(title)}</h1>
<table>{table}</table>
{sections}
<h2>Estimate (JSON)</h2><pre>{data}</pre>
</body></html>
"""
