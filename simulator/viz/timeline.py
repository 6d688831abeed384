"""Timeline of one iteration: a row per rank and stream, a bar per task, hover with details."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import plotly.graph_objects as go

from simulator.results.export import STREAM_ORDER, assign_lanes, row_args
from simulator.results.ranks import rank_label, select_ranks
from simulator.results.rows import Row, expand_fused
from simulator.units import MILLISECOND
from simulator.viz.style import TEMPLATE, colour

__all__ = ["timeline_figure", "timeline_ranks"]


def _stream_key(stream: str) -> tuple[int, str]:
    head = stream.split(".", 1)[0]
    return (STREAM_ORDER.index(head) if head in STREAM_ORDER else len(STREAM_ORDER), stream)


def timeline_ranks(result: Any, ranks: Iterable[int] | None = None, max_ranks: int = 8) -> list[int]:
    """The simulated ranks a timeline shows: those standing for ``ranks`` (all simulated
    ones for None), at most ``max_ranks``, the critical rank always among them."""
    chosen = select_ranks(result.facts, ranks)
    if len(chosen) <= max_ranks:
        return chosen
    critical = result.breakdown.rank
    keep = chosen[:max_ranks]
    if critical in chosen and critical not in keep:
        keep = [*keep[: max_ranks - 1], critical]
    return sorted(keep)


def _details(row: Row) -> str:
    args = row_args(row)
    args.pop("category", None)
    return "<br>".join(f"{k}: {v}" for k, v in args.items())


def timeline_figure(result: Any, *, ranks: Iterable[int] | None = None, max_ranks: int = 8,
                    max_slices: int = 25_000) -> go.Figure:
    """Gantt chart of ``result``'s iteration: y = rank and stream (a lane per set of
    concurrent operations on one stream), x = time (ms), one bar per task coloured by
    category; hover shows name, start, duration and the task's details (FLOPs, achieved
    TFLOP/s, bytes, algorithm, micro-batch, layer ...).

    At most ``max_ranks`` ranks (:func:`timeline_ranks`) and about ``max_slices`` bars, so
    the page stays responsive: ranks are taken whole, the critical rank first, then in rank
    order while they fit; if the critical rank alone has more tasks, its first
    ``max_slices`` are drawn. The title says what was left out.
    """
    candidates = timeline_ranks(result, ranks, max_ranks)
    wanted = set(candidates)
    by_rank: dict[int, list[Row]] = defaultdict(list)
    for r in result.rows:
        if r.rank in wanted:
            by_rank[r.rank].append(r)
    for rank in wanted:  # fused runs of layers are drawn as their kernels and collectives
        by_rank[rank] = expand_fused(by_rank[rank])
    critical = result.breakdown.rank
    preference = sorted(candidates, key=lambda rank: (rank != critical, rank))
    chosen: list[int] = []
    budget = max_slices
    for rank in preference:
        if not chosen or len(by_rank[rank]) <= budget:
            chosen.append(rank)
            budget -= len(by_rank[rank])
    chosen.sort()
    left_out = [rank for rank in candidates if rank not in chosen]
    order: list[str] = []
    bars: dict[str, dict[str, list[Any]]] = defaultdict(lambda: {"y": [], "base": [], "x": [], "custom": []})
    shown = total = 0
    for rank in chosen:
        rows = by_rank.get(rank, [])
        total += len(rows)
        streams: dict[str, list[Row]] = defaultdict(list)
        for r in rows:
            streams[r.stream].append(r)
        for stream in sorted(streams, key=_stream_key):
            items = streams[stream]
            lanes = assign_lanes([(r.start_s, r.end_s) for r in items])
            labels = [f"r{rank} {stream}" + ("" if lane == 0 else f" #{lane + 1}") for lane in range(max(lanes) + 1)]
            order += labels
            for r, lane in zip(items, lanes, strict=True):
                if shown >= max_slices:
                    continue
                shown += 1
                bar = bars[r.category]
                bar["y"].append(labels[lane])
                bar["base"].append(r.start_s / MILLISECOND)
                bar["x"].append(r.duration_s / MILLISECOND)
                bar["custom"].append([r.name, r.start_s / MILLISECOND, r.duration_s / MILLISECOND, _details(r)])
    fig = go.Figure()
    for category in sorted(bars, key=_stream_key):
        bar = bars[category]
        fig.add_trace(go.Bar(
            y=bar["y"], x=bar["x"], base=bar["base"], orientation="h", name=category,
            marker={"color": colour(category), "line": {"width": 0}}, customdata=bar["custom"],
            hovertemplate="<b>%{customdata[0]}</b><br>start %{customdata[1]:.3f} ms, "
                          "duration %{customdata[2]:.3f} ms<br>%{customdata[3]}<extra>%{y}</extra>",
        ))
    step_ms = result.step_time_s / MILLISECOND
    title = f"Timeline of one iteration ({step_ms:.1f} ms): " + ", ".join(
        rank_label(result.facts, r).split(" for ")[0] for r in chosen)
    if shown < total:
        title += f" (first {shown} of {total} tasks)"
    if left_out:
        title += f"<br>ranks {', '.join(map(str, left_out))} left out to keep the page light"
    fig.add_vline(x=step_ms, line={"dash": "dash", "color": "#555"})
    fig.update_layout(
        template=TEMPLATE, title=title, barmode="overlay", bargap=0.15, height=140 + 26 * len(order),
        xaxis={"title": "time (ms)", "range": [0, step_ms * 1.01]},
        yaxis={"categoryorder": "array", "categoryarray": order[::-1], "title": None},
        legend={"title": "category", "orientation": "h", "y": -0.12 if len(order) > 4 else -0.3},
        margin={"l": 150, "r": 20, "t": 60, "b": 40},
    )
    return fig
