"""Timeline of one iteration: a row per rank and stream, a bar per task, hover with details.

By default one rank per pipeline stage (the 1F1B staircase reads top to bottom); every
communication bar is one collective or transfer in flight, launch to completion.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import plotly.graph_objects as go

from simulator.results.export import STREAM_ORDER, assign_lanes, row_args
from simulator.results.ranks import rank_label, select_ranks
from simulator.results.rows import Row, expand_fused
from simulator.results.simulation import Simulation
from simulator.units import MILLISECOND
from simulator.viz.style import TEMPLATE, colour, comm_outline

__all__ = ["timeline_figure", "timeline_ranks", "lane_notes"]

# what each stream's lanes hold, for the note under the figure
_STREAM_NOTES = {
    "compute": "kernels in launch order: forward, backward, activation recomputation and the optimizer step",
    "tp": "tensor-parallel collectives",
    "cp": "context-parallel collectives",
    "ep": "expert-parallel token dispatch and combine (all-to-all, or all-gather / reduce-scatter)",
    "dp": "data-parallel gradient collectives (one bar per bucket)",
    "shard": "sharded-parameter gathers and gradient reduce-scatters",
    "pp": "collectives over the pipeline group (e.g. the tied-embedding gradient sync)",
    "pp.send.act": "activations sent to the next stage",
    "pp.recv.act": "activations received from the previous stage",
    "pp.send.grad": "gradients sent to the previous stage",
    "pp.recv.grad": "gradients received from the next stage",
    "pp.send.act.reverse": "DualPipe's reverse direction: activations sent to its next stage",
    "pp.recv.act.reverse": "DualPipe's reverse direction: activations received from its previous stage",
    "pp.send.grad.reverse": "DualPipe's reverse direction: gradients sent to its previous stage",
    "pp.recv.grad.reverse": "DualPipe's reverse direction: gradients received from its next stage",
    "offload": "copies between the GPU and its host",
}


def _stream_key(stream: str) -> tuple[int, str]:
    head = stream.split(".", 1)[0]
    return (STREAM_ORDER.index(head) if head in STREAM_ORDER else len(STREAM_ORDER), stream)


def _one_per_stage(sim: Simulation) -> list[int]:
    """The lowest simulated rank of each pipeline stage (tp, cp and dp coordinates 0 where
    simulated), the critical rank standing for its own stage; in stage order."""
    facts = sim.facts
    per_stage: dict[int, int] = {}
    for rank in sorted(facts.represents):
        per_stage.setdefault(facts.stage_of[rank], rank)
    critical = sim.result.breakdown.rank
    if critical in facts.stage_of:
        per_stage[facts.stage_of[critical]] = critical
    return [per_stage[s] for s in sorted(per_stage)]


def timeline_ranks(sim: Simulation, ranks: Iterable[int] | None = None, max_ranks: int = 16) -> list[int]:
    """The simulated ranks a timeline shows, in pipeline-stage order.

    For ``ranks`` None one rank per pipeline stage (:func:`_one_per_stage`), so the pipeline
    schedule's staircase shows; else the simulated ranks standing for ``ranks``. At most
    ``max_ranks``: evenly spaced ones, first and last kept, the critical rank always among
    them (in place of its nearest pick)."""
    chosen = _one_per_stage(sim) if ranks is None else select_ranks(sim.facts, ranks)
    stage = sim.facts.stage_of
    chosen = sorted(chosen, key=lambda r: (stage.get(r, 0), r))
    if len(chosen) <= max_ranks:
        return chosen
    n = len(chosen)
    keep = [chosen[i] for i in sorted({round(i * (n - 1) / max(max_ranks - 1, 1)) for i in range(max_ranks)})]
    critical = sim.result.breakdown.rank
    if critical in chosen and critical not in keep:
        inner = keep[1:-1] or keep
        nearest = min(inner, key=lambda r: abs(chosen.index(r) - chosen.index(critical)))
        keep[keep.index(nearest)] = critical
    return sorted(keep, key=lambda r: (stage.get(r, 0), r))


def _details(row: Row) -> str:
    args = row_args(row)
    args.pop("category", None)
    return "<br>".join(f"{k}: {v}" for k, v in args.items())


def _expanded_count(rows: list[Row]) -> int:
    """How many bars ``expand_fused(rows)`` draws, without building them."""
    count = 0
    for r in rows:
        fused = r.info.fused if r.info is not None and r.category == "compute" else None
        count += len(fused.parts) if fused is not None and fused.parts else 1
    return count


def lane_notes(streams: Iterable[str], stacked: bool) -> str:
    """One sentence per stream shown (what its lane holds), and what ``#2`` lanes are."""
    shown = sorted(set(streams), key=_stream_key)
    notes = [f"{s}: {_STREAM_NOTES.get(s, _STREAM_NOTES.get(s.split('.', 1)[0], 'tasks on this stream'))}"
             for s in shown]
    text = "Lanes, per rank — " + "; ".join(notes) + ". Each communication bar is one collective or transfer " \
           "in flight, from launch to completion (waiting for peers included); darker outlines separate " \
           "back-to-back ones."
    if stacked:
        text += " A lane suffixed #2, #3 … holds operations in flight on the same stream while an earlier one " \
                "still runs (overlapping intervals are stacked, never merged)."
    return text


def timeline_figure(sim: Simulation, *, ranks: Iterable[int] | None = None, max_ranks: int = 16,
                    max_slices: int = 25_000) -> go.Figure:
    """Gantt chart of ``result``'s iteration: y = rank and stream (a lane per set of
    concurrent operations on one stream), x = time (ms), one bar per task coloured by
    category; hover shows name, start, duration and the task's details (FLOPs, achieved
    TFLOP/s, bytes, algorithm, micro-batch, layer ...). Communication bars are translucent
    with a darker outline, so back-to-back collectives stay apart.

    Ranks are :func:`timeline_ranks` (one per pipeline stage by default). About
    ``max_slices`` bars at most, so the page stays responsive: a fused run of layers is drawn
    as its kernels and collectives on the ranks where those fit (the critical rank first, then
    in stage order), else as one bar; then ranks are
    taken whole, the critical rank first, then in stage order while they fit; if the critical
    rank alone has more tasks, its first ``max_slices`` are drawn. The title says what was
    left out; ``layout.meta["note"]`` explains the lanes (:func:`lane_notes`).
    """
    candidates = timeline_ranks(sim, ranks, max_ranks)
    wanted = set(candidates)
    raw: dict[int, list[Row]] = defaultdict(list)
    for r in sim.rows:
        if r.rank in wanted:
            raw[r.rank].append(r)
    critical = sim.result.breakdown.rank
    preference = sorted(candidates, key=lambda rank: (rank != critical, candidates.index(rank)))
    spare = max_slices - sum(len(raw[rank]) for rank in candidates)  # after one bar per task everywhere
    whole_fused: list[int] = []
    by_rank: dict[int, list[Row]] = {}
    for rank in preference:  # fused runs drawn as their parts where those fit, else whole
        extra = _expanded_count(raw[rank]) - len(raw[rank])
        if extra <= spare:
            spare -= extra
            by_rank[rank] = expand_fused(raw[rank])
        else:
            whole_fused.append(rank)
            by_rank[rank] = raw[rank]
    chosen: list[int] = []
    budget = max_slices
    for rank in preference:
        if not chosen or len(by_rank[rank]) <= budget:
            chosen.append(rank)
            budget -= len(by_rank[rank])
    chosen.sort(key=candidates.index)
    left_out = [rank for rank in candidates if rank not in chosen]
    stage_prefix = sim.facts.pp > 1
    order: list[str] = []
    bars: dict[str, dict[str, list[Any]]] = defaultdict(lambda: {"y": [], "base": [], "x": [], "custom": []})
    shown = total = 0
    streams_shown: set[str] = set()
    for rank in chosen:
        rows = by_rank.get(rank, [])
        total += len(rows)
        streams: dict[str, list[Row]] = defaultdict(list)
        for r in rows:
            streams[r.stream].append(r)
        head = (f"s{sim.facts.stage_of.get(rank, 0)} " if stage_prefix else "") + f"r{rank}"
        for stream in sorted(streams, key=_stream_key):
            items = streams[stream]
            streams_shown.add(stream)
            lanes = assign_lanes([(r.start_s, r.end_s) for r in items])
            labels = [f"{head} {stream}" + ("" if lane == 0 else f" #{lane + 1}") for lane in range(max(lanes) + 1)]
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
    step_ms = sim.result.step_time_s / MILLISECOND
    fig = go.Figure()
    for category in sorted(bars, key=_stream_key):
        bar = bars[category]
        marker: dict[str, Any] = {"color": colour(category), "line": {"width": 0}}
        if category != "compute":
            # outline only bars wider than ~2 px of a full-width plot: on thinner ones it would hide the fill
            widths = [0.8 if ms > step_ms / 600 else 0.0 for ms in bar["x"]]
            marker = {"color": colour(category), "opacity": 0.8, "line": {"width": widths, "color": comm_outline(category)}}
        fig.add_trace(go.Bar(
            y=bar["y"], x=bar["x"], base=bar["base"], orientation="h", name=category, marker=marker,
            customdata=bar["custom"],
            hovertemplate="<b>%{customdata[0]}</b><br>start %{customdata[1]:.3f} ms, "
                          "duration %{customdata[2]:.3f} ms<br>%{customdata[3]}<extra>%{y}</extra>",
        ))
    what = "one rank per pipeline stage" if ranks is None and sim.facts.pp > 1 else "ranks"
    names = [rank_label(sim.facts, r).split(" for ")[0] for r in chosen] if len(chosen) <= 3 else \
        [f"{'ranks' if i == 0 else ''} {r}".strip() for i, r in enumerate(chosen)]
    title = f"Timeline of one iteration ({step_ms:.1f} ms), {what}: " + ", ".join(names)
    whole = [rank for rank in chosen if rank in whole_fused]
    if whole:
        title += f"<br>fused runs of layers drawn whole on rank(s) {', '.join(map(str, whole))} to keep the page " \
                 "light (dtsim run --trace shows their kernels and collectives)"
    if shown < total:
        title += f" (first {shown} of {total} tasks)"
    if left_out:
        title += f"<br>ranks {', '.join(map(str, left_out))} left out to keep the page light"
    fig.add_vline(x=step_ms, line={"dash": "dash", "color": "#555"})
    fig.update_layout(
        template=TEMPLATE, title=title, barmode="overlay", bargap=0.15, height=160 + 26 * len(order),
        xaxis={"title": "time (ms)", "range": [0, step_ms * 1.01]},
        yaxis={"categoryorder": "array", "categoryarray": order[::-1], "title": None},
        legend={"title": "category", "orientation": "h", "y": -0.12 if len(order) > 4 else -0.3},
        margin={"l": 170, "r": 20, "t": 80, "b": 40},
        meta={"note": lane_notes(streams_shown, any("#" in label for label in order))},
    )
    return fig
