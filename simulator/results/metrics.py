"""From trace rows to a :class:`Result`: step time, throughput, MFU, breakdown, memory.

Definitions (shared/ARCHITECTURE.md, conventions for results):

* step time: the end of the last task of any rank (one iteration, slowest rank);
* tokens/s = global batch * seq / step time; TFLOP/s per GPU = model FLOPs per step /
  (step time * world); MFU = that / dense peak of the precision; HFU uses hardware FLOPs;
* breakdown of a rank's step: compute (union of its compute tasks), exposed communication
  by kind (in flight while no compute runs, attributed in the order tp, cp, shard, dp, pp,
  offload), bubble (waiting with nothing in flight between its first and last task, with
  pipeline parallelism) and idle (waiting for the slowest rank at the end, and gaps without
  a pipeline); the four add up to the step time;
* memory: each rank starts with its model states and runtime reserve and applies the
  allocations and frees of its tasks in time order; the peak is reported with the bytes of
  every category at that moment; OOM when a peak exceeds the GPU's memory. The same
  sequence replayed through the caching allocator (``results/reserved.py``) gives the
  reserved peak (segments, per-stream caches), reported beside it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from simulator.costs.collectives import wire_factor
from simulator.results.reserved import allocation_stream, reserved_peak
from simulator.results.result import Breakdown, CommSummary, LinkUsage, OomDetail, RankMemory, Result
from simulator.results.rows import LinkStat, Row, RunFacts, memory_key, stretch
from simulator.units import format_bytes

__all__ = ["compute_result", "merge_intervals", "subtract_intervals", "memory_timeline", "rank_breakdown",
           "wire_bytes_per_rank", "sent_bytes"]

COMM_PRIORITY = ("tp", "cp", "ep", "shard", "dp", "pp", "offload")
MEMORY_CATEGORIES = ("params", "grads", "optimizer", "activations", "buffers", "other")

Interval = tuple[float, float]


def merge_intervals(intervals: Iterable[Interval]) -> list[Interval]:
    out: list[Interval] = []
    for s, e in sorted(i for i in intervals if i[1] > i[0]):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def subtract_intervals(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """Parts of merged ``a`` not covered by merged ``b``."""
    out: list[Interval] = []
    j = 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


def _length(intervals: list[Interval]) -> float:
    return sum(e - s for s, e in intervals)


def rank_breakdown(rows: list[Row], rank: int, stage: int, step_s: float, pipeline: bool) -> Breakdown:
    """Split one rank's step into compute, exposed communication by kind, bubble and idle.

    A fused compute task (a run of layers with their private TP/CP collectives) carries its
    inner split in ``info.fused``: ``exposed_s`` (by kind) of collectives on its critical path and
    ``comm_s`` (by kind) of collectives in flight; the rest of its duration is compute
    (including any slowdown from collectives running beside it).
    """
    rows = [r for r in rows if r.category != "marker"]
    busy = merge_intervals((r.start_s, r.end_s) for r in rows if r.category == "compute")
    compute_s = 0.0
    inner_exposed: dict[str, float] = defaultdict(float)
    inner_total: dict[str, float] = defaultdict(float)
    for r in rows:
        if r.category == "compute":
            fused = r.info.fused if r.info is not None else None
            scale = stretch(r)
            inner = {k: v * scale for k, v in (fused.exposed_s if fused else {}).items()}
            # the stream is busy for the task's duration (stretched while collectives run beside
            # it); what is not its own collectives on the critical path is compute
            compute_s += r.duration_s - sum(inner.values())
            for kind, value in inner.items():
                inner_exposed[kind] += value
            for kind, value in (fused.comm_s if fused else {}).items():
                inner_total[kind] += value * scale
    by_kind: dict[str, list[Interval]] = defaultdict(list)
    for r in rows:
        if r.category != "compute":
            by_kind[r.category].append((r.start_s, r.end_s))
    comm_total = {k: _length(merge_intervals(v)) for k, v in sorted(by_kind.items())}
    for kind, value in inner_total.items():
        comm_total[kind] = comm_total.get(kind, 0.0) + value
    covered = busy
    exposed: dict[str, float] = dict(inner_exposed)
    kinds = [k for k in COMM_PRIORITY if k in by_kind] + sorted(k for k in by_kind if k not in COMM_PRIORITY)
    for kind in kinds:
        extra = subtract_intervals(merge_intervals(by_kind[kind]), covered)
        exposed[kind] = exposed.get(kind, 0.0) + _length(extra)
        covered = merge_intervals(covered + extra)
    last_end = max((r.end_s for r in rows), default=0.0)
    first_start = min((r.start_s for r in rows), default=0.0)
    gaps = max(0.0, (last_end - first_start) - _length(covered))
    lead = first_start
    tail = max(0.0, step_s - last_end)
    bubble = gaps + lead if pipeline else 0.0
    idle = tail + (0.0 if pipeline else gaps + lead)
    return Breakdown(rank=rank, stage=stage, compute_s=compute_s, exposed_comm_s=exposed, bubble_s=bubble,
                     idle_s=idle, comm_s=comm_total)


def sent_bytes(op: str, nbytes: float, ranks: int) -> float:
    """Bytes one rank sends for a collective of size D over N ranks, bandwidth-optimally
    (shared/REFERENCE.md §1.7): all-reduce 2(N-1)/N * D, all-gather and reduce-scatter
    (N-1)/N * D, all-to-all (N-1)/N * D, point-to-point and host copies D."""
    return wire_factor(op, ranks) * nbytes


def wire_bytes_per_rank(rows: list[Row]) -> dict[str, float]:
    """Bytes one rank puts on the wire per step, by kind of communication (its sends; for a
    point-to-point transfer only the sending side counts)."""
    out: dict[str, float] = defaultdict(float)
    for r in rows:
        if r.comm is not None:
            if r.comm.op == "p2p" and r.info is not None and r.info.role == "recv":
                continue
            out[r.category] += sent_bytes(r.comm.op, r.comm.nbytes, r.comm.ranks) * r.comm.count
        elif r.category == "compute" and r.info is not None and r.info.fused is not None:
            for part in r.info.fused.parts:
                if part.op:
                    out[part.category] += sent_bytes(part.op, part.nbytes, part.ranks)
    return dict(sorted(out.items()))


def memory_timeline(initial: dict[str, float], rows: list[Row]) -> list[tuple[float, dict[str, float]]]:
    """Per-category bytes after every change, starting at t = 0 with ``initial``."""
    events = sorted((t, d, c) for r in rows for (t, d, c) in r.mem)
    current = {c: float(initial.get(c, 0.0)) for c in MEMORY_CATEGORIES}
    out = [(0.0, dict(current))]
    for t, delta, cat in events:
        current[cat] = current.get(cat, 0.0) + delta
        out.append((t, dict(current)))
    return out


def _memory_signature(initial: dict[str, float], rows: list[Row]) -> tuple[Any, ...]:
    """What a rank's memory results depend on: its initial bytes, and its rows' changes in row
    order with the stream each row's allocations land in (both replays sort the changes by
    time, bytes, category and row order). Ranks with equal signatures have equal memory results."""
    keys = [(memory_key(r), r) for r in rows]
    changing = [(key, r) for key, r in keys if key is not None]
    return (tuple(sorted(initial.items())), tuple(key for key, _ in changing),
            tuple(allocation_stream(r) for _, r in changing))


def _rank_memory(rank: int, facts: RunFacts, rows: list[Row],
                 cache: dict[tuple[Any, ...], RankMemory] | None = None) -> RankMemory:
    """One rank's memory at its peak; ``cache`` shares the replays between ranks whose memory
    changes are the same (every replica of a rank without symmetry reduction)."""
    key = _memory_signature(facts.initial_memory[rank], rows) if cache is not None else None
    found = cache.get(key) if cache is not None and key is not None else None  # one hash of the (long) key
    if found is not None:
        return found.model_copy(update={"rank": rank, "stage": facts.stage_of[rank],
                                             "represents": facts.represents[rank]})
    peak_total, peak_time, at_peak = -1.0, 0.0, {}
    for t, cats in memory_timeline(facts.initial_memory[rank], rows):
        total = sum(cats.values())
        if total > peak_total + 1e-6:
            peak_total, peak_time, at_peak = total, t, cats
    memory = RankMemory(
        rank=rank,
        stage=facts.stage_of[rank],
        represents=facts.represents[rank],
        params_bytes=at_peak.get("params", 0.0),
        grads_bytes=at_peak.get("grads", 0.0),
        optimizer_bytes=at_peak.get("optimizer", 0.0),
        activations_bytes=at_peak.get("activations", 0.0),
        buffers_bytes=at_peak.get("buffers", 0.0),
        other_bytes=at_peak.get("other", 0.0),
        peak_bytes=peak_total,
        capacity_bytes=facts.gpu_memory_bytes,
        peak_time_s=peak_time,
        peak_reserved_bytes=reserved_peak(facts.initial_memory[rank], rows, facts.gpu_memory_bytes),
    )
    if cache is not None and key is not None:
        cache[key] = memory
    return memory


def _oom(memory: list[RankMemory]) -> OomDetail | None:
    over = [m for m in memory if m.peak_bytes > m.capacity_bytes]
    if not over:
        return None
    worst = max(over, key=lambda m: m.peak_bytes - m.capacity_bytes)
    cats = {
        "params": worst.params_bytes, "grads": worst.grads_bytes, "optimizer": worst.optimizer_bytes,
        "activations": worst.activations_bytes, "buffers": worst.buffers_bytes, "other": worst.other_bytes,
    }
    largest = max(cats, key=lambda k: cats[k])
    parts = ", ".join(f"{k} {format_bytes(v)}" for k, v in sorted(cats.items(), key=lambda kv: -kv[1]) if v > 0)
    message = (
        f"rank {worst.rank} (stage {worst.stage}) needs {format_bytes(worst.peak_bytes)} at t = "
        f"{worst.peak_time_s * 1e3:.1f} ms but the GPU has {format_bytes(worst.capacity_bytes)}: {parts}"
    )
    return OomDetail(rank=worst.rank, time_s=worst.peak_time_s, peak_bytes=worst.peak_bytes,
                     capacity_bytes=worst.capacity_bytes, by_category=cats, largest=largest, message=message)


def _comm_summary(rows: list[Row]) -> list[CommSummary]:
    groups: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        if r.category != "compute" and r.comm is not None:
            groups[r.category].append(r)
    out = []
    for kind in sorted(groups):
        items = groups[kind]
        algorithms: dict[str, int] = defaultdict(int)
        for r in items:
            assert r.comm is not None
            algorithms[f"{r.comm.algorithm}/{r.comm.protocol}"] += 1
        out.append(CommSummary(
            kind=kind,
            count=sum(r.comm.count for r in items if r.comm),
            bytes=sum(float(r.comm.nbytes) * r.comm.count for r in items if r.comm),
            time_s=sum(r.duration_s for r in items),
            algorithms=dict(sorted(algorithms.items())),
        ))
    return out


def _bytes_by_kind(stats: list[LinkStat]) -> dict[str, float]:
    """Bytes carried per step by all links of each kind (nvlink, pcie, infiniband, efa, ...)."""
    out: dict[str, float] = defaultdict(float)
    for s in stats:
        out[s.kind] += s.bytes * s.members
    return dict(sorted(out.items()))


def _links(stats: list[LinkStat], step_s: float, top: int = 12) -> list[LinkUsage]:
    used = [s for s in stats if s.bytes > 0]
    used.sort(key=lambda s: (-s.bytes / s.capacity_bytes_per_s, s.label))
    return [
        LinkUsage(label=s.label, kind=s.kind, tier=s.tier,
                  utilisation=s.bytes / (s.capacity_bytes_per_s * step_s) if step_s > 0 else 0.0,
                  bytes=s.bytes, links=s.members)
        for s in used[:top]
    ]


def compute_result(rows: list[Row], facts: RunFacts, links: list[LinkStat]) -> Result:
    step = max((r.end_s for r in rows), default=0.0)
    by_rank: dict[int, list[Row]] = defaultdict(list)
    for r in rows:
        by_rank[r.rank].append(r)
    ranks = sorted(facts.initial_memory)
    pipeline = facts.pp > 1
    breakdowns = [rank_breakdown(by_rank[r], r, facts.stage_of[r], step, pipeline) for r in ranks]
    last_end = {r: max((x.end_s for x in by_rank[r]), default=0.0) for r in ranks}
    critical = max(ranks, key=lambda r: (last_end[r], -r))
    shared: dict[tuple[Any, ...], RankMemory] = {}
    memory = [_rank_memory(r, facts, by_rank[r], shared) for r in ranks]
    oom = _oom(memory)
    tokens = facts.global_batch * facts.seq_len
    per_gpu = facts.model_flops_per_step / (step * facts.world_size) if step > 0 else 0.0
    hw_per_gpu = facts.hardware_flops_per_step / (step * facts.world_size) if step > 0 else 0.0
    result = Result(
        name=facts.scenario_name,
        scenario_hash=facts.scenario_hash,
        simulator_version=facts.simulator_version,
        calibration=facts.calibration,
        flops_convention=facts.flops_convention,
        world_size=facts.world_size,
        tp=facts.tp,
        pp=facts.pp,
        cp=facts.cp,
        dp=facts.dp,
        micro_batches=facts.micro_batches,
        global_batch=facts.global_batch,
        params=facts.params,
        step_time_s=step,
        tokens_per_s=tokens / step if step > 0 else 0.0,
        samples_per_s=facts.global_batch / step if step > 0 else 0.0,
        tflops_per_gpu=per_gpu / 1e12,
        hardware_tflops_per_gpu=hw_per_gpu / 1e12,
        mfu=per_gpu / facts.peak_flops_per_s,
        hfu=hw_per_gpu / facts.peak_flops_per_s,
        model_flops_per_step=facts.model_flops_per_step,
        peak_memory_bytes=max(m.peak_bytes for m in memory),
        peak_allocated_bytes=max(m.peak_bytes - m.other_bytes for m in memory),
        peak_reserved_bytes=max(m.peak_reserved_bytes for m in memory),
        gpu_memory_bytes=facts.gpu_memory_bytes,
        oom=oom is not None,
        oom_detail=oom,
        memory=memory,
        breakdown=breakdowns[ranks.index(critical)],
        stage_breakdown=breakdowns,
        links=_links(links, step),
        link_bytes=_bytes_by_kind(links),
        wire_bytes_per_rank=wire_bytes_per_rank(by_rank[critical]),
        communication=_comm_summary(by_rank[critical]),
        engine={
            "events": facts.engine_events,
            "network_entities": facts.network_entities,
            "rate_recomputations": facts.network_recomputations,
            "simulated_ranks": len(ranks),
            "symmetry": facts.symmetry,
            "network": facts.network_mode,
            "tasks": len(rows),
            **facts.extra,
        },
    )
    return result
