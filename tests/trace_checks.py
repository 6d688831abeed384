"""Independent checks of Chrome Trace Event documents (used by the trace tests).

Written from the format's definition, not from the exporter: complete events have a
non-negative duration; slices on one thread nest (a slice starting inside another ends
inside it); every flow end has a flow start with the same id and category, not later;
counters are non-negative numbers; metadata names the processes and threads used.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

EPS_US = 1e-6


def trace_problems(doc: dict[str, Any]) -> list[str]:
    """Everything wrong with ``doc``; an empty list for a valid trace."""
    problems: list[str] = []
    events = doc.get("traceEvents")
    if not isinstance(events, list):
        return ["no traceEvents list"]
    slices: dict[tuple[int, int], list[tuple[float, float, str]]] = defaultdict(list)
    starts: dict[tuple[str, int], float] = {}
    ends: list[dict[str, Any]] = []
    named_pids, named_threads = set(), set()
    for e in events:
        ph = e.get("ph")
        if ph == "M":
            if e["name"] == "process_name":
                named_pids.add(e["pid"])
            elif e["name"] == "thread_name":
                named_threads.add((e["pid"], e["tid"]))
            continue
        if not isinstance(e.get("ts"), (int, float)) or not math.isfinite(e["ts"]):
            problems.append(f"event without a finite ts: {e}")
            continue
        if ph == "X":
            dur = e.get("dur")
            if not isinstance(dur, (int, float)) or not math.isfinite(dur) or dur < 0:
                problems.append(f"complete event with bad dur: {e['name']} dur={dur}")
                continue
            slices[(e["pid"], e["tid"])].append((float(e["ts"]), float(e["ts"]) + float(dur), e["name"]))
        elif ph == "s":
            starts[(e["cat"], e["id"])] = float(e["ts"])
        elif ph == "f":
            ends.append(e)
        elif ph == "C":
            for key, value in e.get("args", {}).items():
                if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                    problems.append(f"counter {e['name']} {key} = {value} at {e['ts']}")
    for (pid, tid), items in slices.items():
        if pid not in named_pids:
            problems.append(f"slices on unnamed process {pid}")
        if (pid, tid) not in named_threads:
            problems.append(f"slices on unnamed thread {pid}/{tid}")
        stack: list[tuple[float, float, str]] = []
        for start, end, name in sorted(items, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1][1] <= start + EPS_US:
                stack.pop()
            if stack and end > stack[-1][1] + EPS_US:
                problems.append(f"improper overlap on {pid}/{tid}: {stack[-1][2]} [{stack[-1][0]}, {stack[-1][1]}] "
                                f"and {name} [{start}, {end}]")
            stack.append((start, end, name))
    for e in ends:
        key = (e["cat"], e["id"])
        if key not in starts:
            problems.append(f"flow end without start: {key}")
        elif starts[key] > float(e["ts"]) + EPS_US:
            problems.append(f"flow {key} ends before it starts")
    return problems


def slices_of(doc: dict[str, Any], pid: int, cat: str | None = None) -> list[dict[str, Any]]:
    """Complete events of process ``pid`` (optionally of one category)."""
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and e["pid"] == pid and (cat is None or e["cat"] == cat)]


def union_us(spans: list[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` spans."""
    total, current_start, current_end = 0.0, None, None
    for s, e in sorted(spans):
        if current_end is None or s > current_end:
            if current_end is not None and current_start is not None:
                total += current_end - current_start
            current_start, current_end = s, e
        else:
            current_end = max(current_end, e)
    if current_end is not None and current_start is not None:
        total += current_end - current_start
    return total


# -- a hand-made result ------------------------------------------------------------------

MS = 1e-3


def synthetic_result() -> Any:
    """A 4-GPU run (2 nodes x 2 GPUs, pp 2 x dp 2, symmetry: ranks 0 and 1 simulated) with
    hand-chosen rows, built through the real ``compute_result``:

    rank 0: f0 compute [0, 1] ms (2e11 FLOPs, +0.5 GiB activations at its end); send.act
    [1, 1.5] ms to rank 1; b0 compute [1.5, 3] ms (4.5e11 FLOPs, frees the 0.5 GiB);
    two all-reduces on the dp stream overlapping in [3, 4] ms: [2, 4] (ring/LL) and
    [3, 5] ms (ring/LL128).
    rank 1: recv.act [1, 1.5] ms; f1 compute [1.5, 2.5] ms (+1.5 GiB at 2 ms: 2.5 GiB of
    2 GiB, OOM).
    One link class ``a->b`` (100 GB/s) loaded at 2 GB/s during the send.
    """
    import numpy as np

    from simulator.ir import TaskInfo
    from simulator.results import LinkStat, Row, RunFacts, compute_result
    from simulator.results.rows import CommRecord
    from simulator.results.simulation import Simulation
    from simulator.units import GiB

    p2p = CommRecord("p2p", 1e6, 1, 2, (0, 1), "direct", "Simple", 0.25 * MS)

    def allreduce(protocol: str) -> CommRecord:
        return CommRecord("all_reduce", 4e6, 1, 2, (0, 2), "ring", protocol, 1 * MS)

    rows = [
        Row(0, "compute", "f0", "compute", 0.0, 1 * MS, TaskInfo(mb=0, layer=0, phase="fwd", flops=2e11),
            ((1 * MS, 0.5 * GiB, "activations"),)),
        Row(0, "pp.send.act", "send.act", "pp", 1 * MS, 1.5 * MS, TaskInfo(mb=0, role="send"), (), p2p, "J1"),
        Row(0, "compute", "b0", "compute", 1.5 * MS, 3 * MS, TaskInfo(mb=0, layer=0, phase="bwd", flops=4.5e11),
            ((3 * MS, -0.5 * GiB, "activations"),)),
        Row(0, "dp", "ar1", "dp", 2 * MS, 4 * MS, TaskInfo(group="dp"), (), allreduce("LL"), "D1"),
        Row(0, "dp", "ar2", "dp", 3 * MS, 5 * MS, TaskInfo(group="dp"), (), allreduce("LL128"), "D2"),
        Row(1, "pp.recv.act", "recv.act", "pp", 1 * MS, 1.5 * MS, TaskInfo(mb=0, role="recv"), (), p2p, "J1"),
        Row(1, "compute", "f1", "compute", 1.5 * MS, 2.5 * MS, TaskInfo(mb=0, layer=1, phase="fwd", flops=1e11),
            ((2 * MS, 1.5 * GiB, "activations"),)),
    ]
    facts = RunFacts(
        scenario_name="synthetic", scenario_hash="0" * 64, simulator_version="test", calibration="none",
        world_size=4, tp=1, pp=2, cp=1, dp=2, virtual_stages=1, micro_batches=1, global_batch=2, seq_len=8,
        params=10, model_flops_per_step=1e12, hardware_flops_per_step=1e12, peak_flops_per_s=312e12,
        precision="bf16", gpu="test-gpu", gpu_memory_bytes=2 * GiB, represents={0: 2, 1: 2}, stage_of={0: 0, 1: 1},
        initial_memory={0: {"params": 1.0 * GiB}, 1: {"params": 1.0 * GiB}}, flops_convention="test",
        sharding="none", schedule="1f1b", gpus_per_node=2,
    )
    links = [LinkStat("a->b", "nvlink", "node", 100e9, 1e6, 1)]
    series = {
        "samples": [(1 * MS, np.array([0]), np.array([2e9])), (1.5 * MS, np.array([], dtype=int), np.array([]))],
        "labels": ["a->b"], "kinds": ["nvlink"], "tiers": ["node"], "capacity": [100e9],
    }
    return Simulation(compute_result(rows, facts, links), rows, facts, series)
