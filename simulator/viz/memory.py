"""Memory over one iteration per rank, by category, against the device's capacity."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from simulator.results.metrics import MEMORY_CATEGORIES, memory_timeline
from simulator.results.rows import Row
from simulator.results.simulation import Simulation
from simulator.units import MILLISECOND, GiB
from simulator.viz.style import MEMORY_COLOURS, TEMPLATE
from simulator.viz.timeline import timeline_ranks

__all__ = ["memory_figure", "memory_series"]


def memory_series(sim: Simulation, rank: int) -> tuple[list[float], dict[str, list[float]]]:
    """Times (s) and bytes per category of ``rank``'s memory, one point per change, closed
    at the step end: the state after each point holds until the next (step function)."""
    rows: list[Row] = [r for r in sim.rows if r.rank == rank]
    timeline = memory_timeline(sim.facts.initial_memory.get(rank, {}), rows)
    times = [t for t, _ in timeline]
    values: dict[str, list[float]] = defaultdict(list)
    for _, cats in timeline:
        for c in MEMORY_CATEGORIES:
            values[c].append(cats.get(c, 0.0))
    end = max(sim.result.step_time_s, times[-1])
    times.append(end)
    for c in MEMORY_CATEGORIES:
        values[c].append(values[c][-1])
    return times, dict(values)


def memory_figure(sim: Simulation, *, ranks: Iterable[int] | None = None, max_ranks: int = 4) -> go.Figure:
    """Stacked memory (GiB) over time (ms) by category, one panel per rank (at most
    ``max_ranks``, the critical rank included), the GPU capacity as a red dashed line, each
    rank's peak marked, and for a rank that runs out of memory the OOM moment (when its
    total first exceeds the capacity) as a red vertical line with the peak bytes needed."""
    chosen = timeline_ranks(sim, ranks, max_ranks)
    capacity_gib = sim.result.gpu_memory_bytes / GiB
    fig = make_subplots(rows=len(chosen), cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=[f"rank {r}" for r in chosen])
    peaks = {m.rank: m for m in sim.result.memory}
    for row_index, rank in enumerate(chosen, start=1):
        times, values = memory_series(sim, rank)
        x = [t / MILLISECOND for t in times]
        for c in MEMORY_CATEGORIES:
            if not any(v > 0 for v in values[c]):
                continue
            fig.add_trace(go.Scatter(
                x=x, y=[v / GiB for v in values[c]], name=c, legendgroup=c, showlegend=row_index == 1,
                stackgroup=f"rank{rank}", line={"shape": "hv", "width": 0.5, "color": MEMORY_COLOURS.get(c)},
                hovertemplate=c + " %{y:.2f} GiB at %{x:.2f} ms<extra>rank " + str(rank) + "</extra>",
            ), row=row_index, col=1)
        fig.add_hline(y=capacity_gib, line={"dash": "dash", "color": "#d62728"}, row=row_index, col=1,
                      annotation_text=f"capacity {capacity_gib:.0f} GiB", annotation_position="top left")
        peak = peaks.get(rank)
        if peak is not None:
            oom = peak.peak_bytes > peak.capacity_bytes
            fig.add_trace(go.Scatter(
                x=[peak.peak_time_s / MILLISECOND], y=[peak.peak_bytes / GiB], mode="markers",
                marker={"symbol": "x" if oom else "diamond", "size": 11, "color": "#d62728" if oom else "#333"},
                name="OOM" if oom else "peak", legendgroup="peak", showlegend=False,
                hovertemplate=("OOM: " if oom else "peak: ") + "%{y:.2f} GiB at %{x:.2f} ms<extra></extra>",
            ), row=row_index, col=1)
            if oom:
                totals = [sum(values[c][i] for c in MEMORY_CATEGORIES) for i in range(len(times))]
                first_over = next(t for t, total in zip(times, totals, strict=True) if total > peak.capacity_bytes)
                fig.add_vline(x=first_over / MILLISECOND, line={"color": "#d62728"}, row=row_index, col=1,
                              annotation_text=f"OOM at {first_over / MILLISECOND:.1f} ms; "
                                              f"peak needs {peak.peak_bytes / GiB:.1f} GiB",
                              annotation_font_color="#d62728")
        fig.update_yaxes(title_text="GiB", row=row_index, col=1)
    fig.update_xaxes(title_text="time (ms)", row=len(chosen), col=1)
    title = "Memory over the iteration" + (" — OUT OF MEMORY" if sim.result.oom else "")
    fig.update_layout(template=TEMPLATE, title=title, height=160 + 240 * len(chosen),
                      legend={"title": "category"}, margin={"l": 60, "r": 20, "t": 70, "b": 40})
    return fig
