"""Where each rank's step went: stacked compute, exposed communication by group, bubble, idle."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from simulator.results.metrics import COMM_PRIORITY
from simulator.units import MILLISECOND
from simulator.viz.style import TEMPLATE, colour

__all__ = ["breakdown_figure", "breakdown_parts"]


def breakdown_parts(result: Any) -> tuple[list[str], dict[str, list[float]]]:
    """x labels (one per simulated rank, i.e. per pipeline stage under symmetry) and the
    stacked parts in seconds: ``compute``, ``exposed <kind>`` for every communication kind
    in priority order (tp, cp, shard, dp, pp, offload, then others), ``bubble``, ``idle``.
    Per rank the parts add up to the step time (``Breakdown``'s contract)."""
    entries = sorted(result.stage_breakdown, key=lambda b: b.rank)
    kinds = {k for b in entries for k in b.exposed_comm_s}
    ordered = [k for k in COMM_PRIORITY if k in kinds] + sorted(kinds - set(COMM_PRIORITY))
    labels = [f"rank {b.rank}<br>stage {b.stage}" + (" ★" if b.rank == result.breakdown.rank else "")
              for b in entries]
    parts: dict[str, list[float]] = {"compute": [b.compute_s for b in entries]}
    for kind in ordered:
        parts[f"exposed {kind}"] = [b.exposed_comm_s.get(kind, 0.0) for b in entries]
    parts["bubble"] = [b.bubble_s for b in entries]
    parts["idle"] = [b.idle_s for b in entries]
    return labels, parts


def breakdown_figure(result: Any) -> go.Figure:
    """Stacked bars (ms) of :func:`breakdown_parts`, the step time as a dashed line; ★ marks
    the critical rank (the one whose last task ends the step)."""
    labels, parts = breakdown_parts(result)
    fig = go.Figure()
    for name, values in parts.items():
        if not any(v > 0 for v in values):
            continue
        fig.add_trace(go.Bar(
            x=labels, y=[v / MILLISECOND for v in values], name=name, marker={"color": colour(name)},
            hovertemplate="%{x}: " + name + " %{y:.3f} ms<extra></extra>",
        ))
    step_ms = result.step_time_s / MILLISECOND
    fig.add_hline(y=step_ms, line={"dash": "dash", "color": "#555"},
                  annotation_text=f"step {step_ms:.1f} ms", annotation_position="top left")
    fig.update_layout(
        template=TEMPLATE, barmode="stack", title="Time breakdown per rank (one per pipeline stage)",
        yaxis={"title": "time (ms)"}, xaxis={"title": None}, legend={"title": "part"},
        height=420, margin={"l": 60, "r": 20, "t": 60, "b": 40},
    )
    return fig
