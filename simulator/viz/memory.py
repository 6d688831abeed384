"""Memory over one iteration: a total line per pipeline stage, and the highest-peak rank by category."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from simulator.results.metrics import MEMORY_CATEGORIES, memory_timeline
from simulator.results.rows import Row
from simulator.results.simulation import Simulation
from simulator.units import MILLISECOND, GiB
from simulator.viz.style import TEMPLATE, colour, stage_colours
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


def memory_figure(sim: Simulation, *, ranks: Iterable[int] | None = None, max_ranks: int = 16) -> go.Figure:
    """Memory (GiB) over time (ms) in two panels, readable for any number of stages.

    Top: one line per rank of :func:`timeline_ranks` (one per pipeline stage by default, at
    most ``max_ranks``), the total a rank holds, coloured by stage (:func:`stage_colours`),
    each rank's peak marked (``peak``; ``OOM`` when over capacity). Bottom: the rank with the
    highest peak, stacked by category. Both panels draw the GPU capacity as a red dashed line;
    if that rank runs out of memory, the OOM moment (its total first above the capacity) is a
    red vertical line with the peak bytes needed."""
    chosen = timeline_ranks(sim, ranks, max_ranks)
    capacity_gib = sim.result.gpu_memory_bytes / GiB
    peaks = {m.rank: m for m in sim.result.memory}
    worst = max(chosen, key=lambda r: (peaks[r].peak_bytes if r in peaks else 0.0, -chosen.index(r)))
    stage_of = sim.facts.stage_of
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.1, row_heights=[0.5, 0.5],
                        subplot_titles=["total per rank (one per pipeline stage)",
                                        f"rank {worst} (stage {stage_of.get(worst, 0)}), highest peak: by category"])
    shades = stage_colours(sim.facts.pp)
    series = {rank: memory_series(sim, rank) for rank in chosen}
    for rank in chosen:
        times, values = series[rank]
        stage = stage_of.get(rank, 0)
        name = f"stage {stage} (rank {rank})"
        totals = [sum(values[c][i] for c in MEMORY_CATEGORIES) / GiB for i in range(len(times))]
        fig.add_trace(go.Scatter(
            x=[t / MILLISECOND for t in times], y=totals, name=name, legendgroup="stage", mode="lines",
            legendgrouptitle={"text": "total per stage"}, line={"shape": "hv", "width": 1.5, "color": shades[stage]},
            hovertemplate=name + ": %{y:.2f} GiB at %{x:.2f} ms<extra></extra>",
        ), row=1, col=1)
        peak = peaks.get(rank)
        if peak is not None:
            oom = peak.peak_bytes > peak.capacity_bytes
            fig.add_trace(go.Scatter(
                x=[peak.peak_time_s / MILLISECOND], y=[peak.peak_bytes / GiB], mode="markers",
                marker={"symbol": "x" if oom else "diamond", "size": 10, "color": "#d62728" if oom else shades[stage]},
                name="OOM" if oom else "peak", legendgroup="peak", showlegend=False,
                hovertemplate=f"{name} " + ("OOM: " if oom else "peak: ") + "%{y:.2f} GiB at %{x:.2f} ms<extra></extra>",
            ), row=1, col=1)
    times, values = series[worst]
    x = [t / MILLISECOND for t in times]
    for c in MEMORY_CATEGORIES:
        if not any(v > 0 for v in values[c]):
            continue
        fig.add_trace(go.Scatter(
            x=x, y=[v / GiB for v in values[c]], name=c, legendgroup="category", stackgroup="category",
            legendgrouptitle={"text": f"rank {worst} by category"},
            line={"shape": "hv", "width": 0.5, "color": colour(c)},
            hovertemplate=c + " %{y:.2f} GiB at %{x:.2f} ms<extra>rank " + str(worst) + "</extra>",
        ), row=2, col=1)
    for row_index in (1, 2):
        fig.add_hline(y=capacity_gib, line={"dash": "dash", "color": "#d62728"}, row=row_index, col=1,
                      annotation_text=f"capacity {capacity_gib:.0f} GiB", annotation_position="top left")
        fig.update_yaxes(title_text="GiB", rangemode="tozero", row=row_index, col=1)
    peak = peaks.get(worst)
    if peak is not None and peak.peak_bytes > peak.capacity_bytes:
        totals = [sum(values[c][i] for c in MEMORY_CATEGORIES) for i in range(len(times))]
        first_over = next(t for t, total in zip(times, totals, strict=True) if total > peak.capacity_bytes)
        fig.add_vline(x=first_over / MILLISECOND, line={"color": "#d62728"}, row=2, col=1,
                      annotation_text=f"OOM at {first_over / MILLISECOND:.1f} ms; "
                                      f"peak needs {peak.peak_bytes / GiB:.1f} GiB",
                      annotation_font_color="#d62728")
    fig.update_xaxes(title_text="time (ms)", row=2, col=1)
    title = "Memory over the iteration" + (" — OUT OF MEMORY" if sim.result.oom else "")
    fig.update_layout(template=TEMPLATE, title=title, height=720, legend={"groupclick": "toggleitem", "traceorder": "grouped"},
                      margin={"l": 60, "r": 20, "t": 70, "b": 40})
    return fig
