"""Chrome Trace Event export: open a simulated iteration in Perfetto or chrome://tracing.

The layout follows what users know from the PyTorch profiler:

* one process per simulated rank (``pid`` = global rank), named with its node and GPU and
  the ranks it stands for under symmetry, sorted by rank;
* one thread per stream (``compute``, ``tp``, ``dp``, ``pp.send.act`` ...), plus an
  ``iteration`` thread carrying the ``ProfilerStep#N`` slice over the whole step. Rows
  that would overlap on one thread without nesting (concurrent operations on one stream)
  go to extra threads ``dp #2``, ``dp #3`` ..., so every thread's slices nest properly;
* one complete event (``"ph": "X"``) per row (a fused run of layers: one per kernel step and
  collective inside it, each with its own layer), with args (:func:`row_args`): phase,
  micro-batch, layer; FLOPs, bytes, achieved TFLOP/s and the kernels (name, FLOPs, bytes,
  shape, modelled time) for compute; op, bytes, group size and members, algorithm,
  protocol, algorithm bandwidth and the slowdown against running alone for communication;
* flow arrows (``"s"`` → ``"f"``) from each p2p send to its receive (rows of one transfer
  share ``Row.join``; the sender is the first member of the op's group);
* counter tracks: per-rank memory by category (GiB) and in total (with an ``OOM`` instant
  where a rank first exceeds its device memory), and, when the run
  recorded link loads, the utilisation (%) of the busiest link classes in a ``network``
  process;
* fault markers (:mod:`simulator.results.export.faults`): an instant ``straggler: compute xF``
  on each slowed rank (whose process label says so) and one per degraded or failed link;
* ``otherData``: simulator version, scenario name and hash, calibration, layout, step time,
  and ``faults`` (``Result.faults``: the ranks simulated individually, the samples).

Timestamps are microseconds with nanosecond resolution (``round(t_s * 1e6, 3)``). Process
metadata uses ``tid`` 0 as Kineto does; every other event sits on a thread ``tid >= 1``
(Perfetto treats thread 0 as the kernel's idle thread), counters on the ``iteration``
thread of their process. The one-file-per-rank layout of Holistic Trace Analysis is
:mod:`simulator.results.export.hta`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from simulator.results.export.args import row_args
from simulator.results.export.faults import fault_events, straggler_label
from simulator.results.export.files import dump_json
from simulator.results.export.threads import ITERATION_TID, span_us, stream_threads, to_us
from simulator.results.link_load import LinkLoad
from simulator.results.metrics import MEMORY_CATEGORIES, memory_timeline
from simulator.results.ranks import format_rank_ranges, rank_label, represented_ranks, select_ranks
from simulator.results.rows import Row, RunFacts, expand_fused
from simulator.results.simulation import Simulation
from simulator.units import MICROSECOND, GiB

__all__ = ["trace_document", "write_trace", "DEFAULT_MAX_LINKS", "MEMORY_COUNTER", "MEMORY_TOTAL_COUNTER",
           "LINK_COUNTER_ARG"]

MEMORY_COUNTER = "memory [GiB]"
MEMORY_TOTAL_COUNTER = "memory total [GiB]"
LINK_COUNTER_ARG = "utilisation [%]"
DEFAULT_MAX_LINKS = 24


def trace_document(
    sim: Simulation,
    *,
    ranks: Iterable[int] | None = None,
    max_links: int = DEFAULT_MAX_LINKS,
    step: int = 0,
) -> dict[str, Any]:
    """The Chrome Trace Event document of ``result`` (a :class:`~simulator.results.Result`).

    ``ranks``: global ranks to include (None: every simulated rank); a rank that was not
    simulated is shown through the simulated rank standing for it (:func:`select_ranks`).
    ``max_links``: how many of the busiest link classes get a utilisation counter (only if
    ``sim`` was simulated with ``record_series=True``). ``step``: the N of
    ``ProfilerStep#N``. Event layout: see the module docstring.
    """
    facts: RunFacts = sim.facts
    rows: list[Row] = sim.rows
    chosen = select_ranks(facts, ranks)
    by_rank: dict[int, list[Row]] = defaultdict(list)
    for r in rows:
        by_rank[r.rank].append(r)
    for rank in chosen:  # fused runs of layers become their kernels and collectives
        by_rank[rank] = expand_fused(by_rank[rank])
    step_us = to_us(sim.result.step_time_s)
    events: list[dict[str, Any]] = []
    tid_of: dict[tuple[int, int], int] = {}  # (rank, row index in by_rank) -> tid
    for rank in chosen:
        events += _rank_events(sim, facts, rank, by_rank[rank], step_us, step, tid_of)
    events += _flow_events(by_rank, chosen, tid_of)
    link_load = LinkLoad.from_series(sim.series, sim.result.step_time_s)
    events += _link_events(link_load, facts, max_links)
    events += fault_events(sim.result.faults, chosen, facts.world_size, ITERATION_TID)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": _metadata(sim, facts, chosen, ranks, link_load, max_links),
    }


def _rank_events(sim: Simulation, facts: RunFacts, rank: int, rows: list[Row], step_us: float, step: int,
                 tid_of: dict[tuple[int, int], int]) -> list[dict[str, Any]]:
    _, names, row_tid = stream_threads(rows)
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": rank_label(facts, rank)}},
        {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}},
        {"ph": "M", "name": "process_labels", "pid": rank, "tid": 0,
         "args": {"labels": f"stage {facts.stage_of.get(rank, 0)}, {facts.gpu}"
                           f"{straggler_label(sim.result.faults, rank)}"}},
        {"ph": "M", "name": "thread_name", "pid": rank, "tid": ITERATION_TID, "args": {"name": "iteration"}},
        {"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": ITERATION_TID,
         "args": {"sort_index": ITERATION_TID}},
    ]
    for tid, name in names:
        events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid, "args": {"name": name}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": tid, "args": {"sort_index": tid}})
    events.append({"ph": "X", "name": f"ProfilerStep#{step}", "cat": "user_annotation", "pid": rank,
                   "tid": ITERATION_TID, "ts": 0.0, "dur": step_us,
                   "args": {"step_time_s": sim.result.step_time_s}})
    for i, row in enumerate(rows):
        ts, dur = span_us(row)
        tid_of[(rank, i)] = row_tid[i]
        events.append({"ph": "X", "name": row.name, "cat": row.category, "pid": rank, "tid": row_tid[i],
                       "ts": ts, "dur": dur, "args": row_args(row)})
    events += _memory_events(sim, facts, rank, rows)
    return events


def _memory_events(sim: Simulation, facts: RunFacts, rank: int, rows: list[Row]) -> list[dict[str, Any]]:
    """Counter samples of the rank's memory: one per instant its allocations change (last state wins)."""
    states: dict[float, dict[str, float]] = {}
    for t_s, cats in memory_timeline(facts.initial_memory.get(rank, {}), rows):
        states[to_us(t_s)] = cats
    events: list[dict[str, Any]] = []
    for ts, cats in sorted(states.items()):
        by_cat = {c: round(cats.get(c, 0.0) / GiB, 6) for c in MEMORY_CATEGORIES}  # unclamped: < 0 is a bug
        total = round(sum(cats.values()) / GiB, 6)
        events.append({"ph": "C", "name": MEMORY_COUNTER, "pid": rank, "tid": ITERATION_TID, "ts": ts, "args": by_cat})
        events.append({"ph": "C", "name": MEMORY_TOTAL_COUNTER, "pid": rank, "tid": ITERATION_TID, "ts": ts,
                       "args": {"total": total}})
    for m in sim.result.memory:
        if m.rank == rank and m.peak_bytes > m.capacity_bytes:
            first_over = min(ts for ts, cats in states.items() if sum(cats.values()) > m.capacity_bytes)
            events.append({"ph": "i", "s": "p", "name": "OOM", "cat": "memory", "pid": rank, "tid": ITERATION_TID,
                           "ts": first_over,
                           "args": {"first_exceeds_capacity_us": first_over, "peak_us": to_us(m.peak_time_s),
                                    "peak_GiB": round(m.peak_bytes / GiB, 3),
                                    "capacity_GiB": round(m.capacity_bytes / GiB, 3)}})
    return events


def _flow_events(by_rank: dict[int, list[Row]], chosen: list[int],
                 tid_of: dict[tuple[int, int], int]) -> list[dict[str, Any]]:
    """Arrows from each p2p send slice to its receive slice, for transfers with both ends traced."""
    ends: dict[str, dict[str, list[tuple[int, int, Row]]]] = defaultdict(lambda: {"send": [], "recv": []})
    for rank in chosen:
        for i, row in enumerate(by_rank[rank]):
            role = row.info.role if row.info is not None else None
            if row.join is None or role is None:  # only pipeline transfers have a send and a receive side
                continue
            ends[row.join][role].append((rank, i, row))
    events: list[dict[str, Any]] = []
    flow_id = 0
    for join in sorted(ends):
        for s_rank, s_i, send in ends[join]["send"]:
            for r_rank, r_i, recv in ends[join]["recv"]:
                flow_id += 1
                s_ts, s_dur = span_us(send)
                r_ts, r_dur = span_us(recv)
                common = {"name": send.name, "cat": "p2p", "id": flow_id}
                events.append({**common, "ph": "s", "pid": s_rank, "tid": tid_of[(s_rank, s_i)],
                               "ts": round(s_ts + s_dur / 2, 3)})
                events.append({**common, "ph": "f", "bp": "e", "pid": r_rank, "tid": tid_of[(r_rank, r_i)],
                               "ts": round(r_ts + r_dur / 2, 3)})
    return events


def _link_events(link_load: LinkLoad | None, facts: RunFacts, max_links: int) -> list[dict[str, Any]]:
    """Utilisation counters (%) of the busiest link classes, one sample per change."""
    if link_load is None or max_links <= 0:
        return []
    chosen = link_load.busiest(max_links)
    if not chosen:
        return []
    pid = facts.world_size  # not a rank id
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
         "args": {"name": f"network: {len(chosen)} busiest link classes (utilisation of one link)"}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}},
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": ITERATION_TID, "args": {"name": "link utilisation"}},
    ]
    util = np.round(100.0 * link_load.dense_utilisation(chosen), 4)
    times_us = np.round(link_load.times_s / MICROSECOND, 3)
    last_of_instant = np.append(times_us[1:] != times_us[:-1], True)  # later snapshots at one instant win
    times_us, util = times_us[last_of_instant], util[last_of_instant]
    end_us = to_us(link_load.end_s)
    for j, c in enumerate(chosen):
        name = f"{link_load.labels[c]} ({link_load.kinds[c]})"
        column = util[:, j]
        changed = np.append(True, column[1:] != column[:-1])
        for ts, value in zip(times_us[changed].tolist(), column[changed].tolist(), strict=True):
            events.append({"ph": "C", "name": name, "pid": pid, "tid": ITERATION_TID, "ts": ts, "args": {LINK_COUNTER_ARG: value}})
        if column[-1] != 0.0 and end_us > times_us[-1]:
            events.append({"ph": "C", "name": name, "pid": pid, "tid": ITERATION_TID, "ts": end_us,
                           "args": {LINK_COUNTER_ARG: 0.0}})
    return events


def _metadata(sim: Simulation, facts: RunFacts, chosen: list[int], requested: Iterable[int] | None,
              link_load: LinkLoad | None, max_links: int) -> dict[str, Any]:
    stands_for = {}
    for r in chosen:
        group = represented_ranks(facts, r)
        stands_for[str(r)] = format_rank_ranges(group) if group else f"{facts.represents[r]} ranks"
    return {
        "simulator": "dtsim",
        "simulator_version": facts.simulator_version,
        "scenario": facts.scenario_name,
        "scenario_hash": facts.scenario_hash,
        "calibration": facts.calibration,
        "flops_convention": facts.flops_convention,
        "gpu": facts.gpu,
        "world_size": facts.world_size,
        "layout": f"tp {facts.tp} x cp {facts.cp} x pp {facts.pp} x dp {facts.dp}, sharding {facts.sharding}, "
                  f"schedule {facts.schedule}",
        "micro_batches": facts.micro_batches,
        "step_time_s": sim.result.step_time_s,
        "network": facts.network_mode,
        "symmetry": facts.symmetry,
        "ranks_requested": None if requested is None else format_rank_ranges(list(requested), limit=32),
        "ranks_traced": ",".join(str(r) for r in chosen),
        "simulated_rank_stands_for": stands_for,
        "link_counters": ("not recorded (simulate with record_series=True)" if link_load is None
                          else f"busiest {max_links} link classes"),
        "time_unit": "microseconds since the start of the iteration",
        "faults": None if sim.result.faults is None else sim.result.faults.model_dump(mode="json"),
    }



def write_trace(sim: Simulation, path: str | Path, *, ranks: Iterable[int] | None = None,
                max_links: int = DEFAULT_MAX_LINKS, step: int = 0) -> Path:
    """Write :func:`trace_document` to ``path`` (gzip-compressed when it ends in ``.gz``)."""
    out = Path(path)
    dump_json(trace_document(sim, ranks=ranks, max_links=max_links, step=step), out)
    return out
