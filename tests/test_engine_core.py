"""The engine core on hand-built programs: stream order, dependencies, joins, per-rank speed.

Most tests use a stand-in resolver (``_AxisLinks``) that turns every communication into one
flow of ``nbytes`` bytes over one link per axis at 100 GB/s with no latency, so a 1e9-byte
collective takes exactly 10 ms and its time never depends on the cluster catalog. The last
tests run one point-to-point transfer and one device-to-host copy on a real 1 x p4d.24xlarge.

Times are compared in milliseconds rounded to 1e-9 ms, so that a log is an exact list of
``(name, start_ms, end_ms)`` as in SimPy's own tests.
"""

from types import SimpleNamespace

import numpy as np
import pytest

from simulator.cluster import Router, build_cluster
from simulator.cluster.collectives import CollectivePlanner, nccl_model
from simulator.engine import CommResolver, LinkClasses, PhaseLoad, Resolved, run_program
from simulator.ir import CommOp, ProgramBuilder
from simulator.scenario import ClusterSpec

LINK_BYTES_PER_S = 1e11  # every axis link of the stand-in resolver: 100 GB/s, so 1e9 B = 10 ms
AXES = ("dp", "tp", "pp", "offload")


class _AxisLinks:
    """A resolver with one link per axis: a communication moves ``comm.nbytes`` in one flow
    over its axis's link, no latency. Collectives on different axes never share bandwidth.

    Duck-types the two things the engine asks of a :class:`CommResolver` today
    (``classes.capacity`` for the network, ``resolve(comm)`` per communication task)."""

    classes = SimpleNamespace(capacity=np.full(len(AXES), LINK_BYTES_PER_S))

    def resolve(self, comm: CommOp) -> Resolved:
        phase = PhaseLoad(np.array([AXES.index(comm.axis)]), np.array([1.0]), comm.nbytes, 0.0)
        return Resolved([phase], None, "stub", "stub", comm.nbytes / LINK_BYTES_PER_S)


def _bytes_in(ms: float) -> float:
    """Bytes that a stand-in link moves in ``ms`` milliseconds."""
    return ms * 1e-3 * LINK_BYTES_PER_S


def _op(axis: str, ms: float, group: tuple[int, ...] = (0, 1), op: str = "all_reduce") -> CommOp:
    return CommOp(op, group, _bytes_in(ms), axis)


def _program(pb: ProgramBuilder):
    ranks = tuple(sorted({t.rank for t in pb.tasks}))
    return pb.build(ranks, {r: 1 for r in ranks}, {r: {} for r in ranks})


def _run(pb: ProgramBuilder, resolver=None, slowdown: float = 0.0):
    program = _program(pb)
    run = run_program(program, resolver or _AxisLinks(), overlap_slowdown=slowdown)
    log = [(t.name, round(float(run.start_s[t.id]) * 1e3, 9), round(float(run.end_s[t.id]) * 1e3, 9))
           for t in program.tasks]
    return log, run


# -- streams and dependencies ------------------------------------------------------------------


def test_one_stream_runs_its_tasks_back_to_back_in_issue_order():
    """A stream is in order even without dependencies: a (3 ms), b (2 ms), c (1 ms) on rank 0's
    compute stream run [0, 3], [3, 5], [5, 6]. Makespan 6 ms; 3 task starts = 3 events."""
    pb = ProgramBuilder()
    pb.add(0, "compute", "a", "compute", duration_s=3e-3)
    pb.add(0, "compute", "b", "compute", duration_s=2e-3)
    pb.add(0, "compute", "c", "compute", duration_s=1e-3)
    log, run = _run(pb)
    assert log == [("a", 0.0, 3.0), ("b", 3.0, 5.0), ("c", 5.0, 6.0)]
    assert run.makespan_s == pytest.approx(6e-3, rel=1e-12)
    assert run.events == 3


def test_a_blocked_head_blocks_its_stream_but_not_the_others():
    """x waits for y (5 ms on the tp stream); z (1 ms, no deps) is behind x on the compute
    stream, so it cannot overtake: y [0, 5], x [5, 7], z [7, 8]. w (4 ms) on rank 0's dp stream
    and v (2 ms) on rank 1's compute stream are independent and start at 0."""
    pb = ProgramBuilder()
    y = pb.add(0, "tp", "y", "compute", duration_s=5e-3)
    pb.add(0, "compute", "x", "compute", duration_s=2e-3, deps=[y])
    pb.add(0, "compute", "z", "compute", duration_s=1e-3)
    pb.add(0, "dp", "w", "compute", duration_s=4e-3)
    pb.add(1, "compute", "v", "compute", duration_s=2e-3)
    log, run = _run(pb)
    assert log == [("y", 0.0, 5.0), ("x", 5.0, 7.0), ("z", 7.0, 8.0), ("w", 0.0, 4.0), ("v", 0.0, 2.0)]
    assert run.makespan_s == pytest.approx(8e-3, rel=1e-12)


def test_dependencies_cross_streams_and_ranks():
    """a (4 ms, rank 0 compute) feeds an all-reduce on rank 0's dp stream (3 ms: 3e8 B at
    100 GB/s) and a 1 ms kernel on rank 1: both start at 4 ms, end at 7 and 5 ms. A kernel
    after the all-reduce on rank 1 (dep across ranks and streams) runs [7, 9]."""
    pb = ProgramBuilder()
    a = pb.add(0, "compute", "a", "compute", duration_s=4e-3)
    ar = pb.add(0, "dp", "ar", "dp", comm=_op("dp", 3.0), deps=[a])
    pb.add(1, "compute", "b", "compute", duration_s=1e-3, deps=[a])
    pb.add(1, "compute", "c", "compute", duration_s=2e-3, deps=[ar])
    log, _ = _run(pb)
    assert log == [("a", 0.0, 4.0), ("ar", 4.0, 7.0), ("b", 4.0, 5.0), ("c", 7.0, 9.0)]


def test_a_task_with_several_deps_starts_at_the_latest_end():
    """d depends on a (2 ms), b (7 ms) and c (4 ms) on three streams: starts at max(2, 7, 4) = 7,
    ends at 7 + 1 = 8 ms."""
    pb = ProgramBuilder()
    a = pb.add(0, "tp", "a", "compute", duration_s=2e-3)
    b = pb.add(0, "compute", "b", "compute", duration_s=7e-3)
    c = pb.add(1, "compute", "c", "compute", duration_s=4e-3)
    pb.add(0, "dp", "d", "compute", duration_s=1e-3, deps=[a, b, c])
    log, _ = _run(pb)
    assert log[-1] == ("d", 7.0, 8.0)


def test_zero_duration_tasks_take_no_time():
    """Markers of 0 s pass the cursor on at the same instant: m [0, 0], k (2 ms) [0, 2], n [2, 2]."""
    pb = ProgramBuilder()
    pb.add(0, "compute", "m", "compute")
    pb.add(0, "compute", "k", "compute", duration_s=2e-3)
    pb.add(0, "compute", "n", "compute")
    log, _ = _run(pb)
    assert log == [("m", 0.0, 0.0), ("k", 0.0, 2.0), ("n", 2.0, 2.0)]


# -- joins ------------------------------------------------------------------------------------


def test_joined_tasks_start_together_when_the_last_one_is_ready():
    """An all-reduce on ranks 0, 1, 2 (join "ar") after kernels of 2, 6 and 3 ms: every member
    starts at max(2, 6, 3) = 6 ms and ends at 6 + 3 = 9 ms (3e8 B at 100 GB/s). Events:
    3 kernels + 1 joined start = 4; makespan 9 ms."""
    pb = ProgramBuilder()
    op = _op("dp", 3.0, group=(0, 1, 2))
    for rank, ms in ((0, 2.0), (1, 6.0), (2, 3.0)):
        k = pb.add(rank, "compute", f"k{rank}", "compute", duration_s=ms * 1e-3)
        pb.add(rank, "dp", f"ar{rank}", "dp", comm=op, join="ar", deps=[k])
    log, run = _run(pb)
    assert log == [("k0", 0.0, 2.0), ("ar0", 6.0, 9.0), ("k1", 0.0, 6.0), ("ar1", 6.0, 9.0),
                   ("k2", 0.0, 3.0), ("ar2", 6.0, 9.0)]
    assert run.events == 4
    assert run.makespan_s == pytest.approx(9e-3, rel=1e-12)


def test_a_join_member_waits_for_its_stream_head():
    """Rank 1 issues a 5 ms all-gather (join "ag", own stream tp) before its 2 ms all-reduce
    (join "ar", with rank 0); the all-gather waits for rank 2's 4 ms kernel. Rank 0's member
    is ready at 0 but the pair starts only when rank 1's tp stream reaches it: ag [4, 9] on
    ranks 1 and 2, ar [9, 11] on ranks 0 and 1 (all on one tp link, never at the same time)."""
    pb = ProgramBuilder()
    ag = _op("tp", 5.0, group=(1, 2), op="all_gather")
    ar = _op("tp", 2.0, group=(0, 1))
    pb.add(0, "tp", "ar0", "tp", comm=ar, join="ar")
    pb.add(1, "tp", "ag1", "tp", comm=ag, join="ag")
    pb.add(1, "tp", "ar1", "tp", comm=ar, join="ar")
    k = pb.add(2, "compute", "k2", "compute", duration_s=4e-3)
    pb.add(2, "tp", "ag2", "tp", comm=ag, join="ag", deps=[k])
    log, run = _run(pb)
    assert log == [("ar0", 9.0, 11.0), ("ag1", 4.0, 9.0), ("ar1", 9.0, 11.0), ("k2", 0.0, 4.0),
                   ("ag2", 4.0, 9.0)]
    assert run.events == 3  # k2, the all-gather, the all-reduce


def test_the_builder_numbers_joins_in_order_of_first_use():
    """Tasks with joins "ar", "ag", "ar", none, "ag" get numbers 0, 1, 0, -1, 1; "ar" and "ag"
    have 2 tasks each, and the key-to-size mapping says the same."""
    pb = ProgramBuilder()
    for rank, join in ((0, "ar"), (1, "ag"), (1, "ar"), (2, None), (2, "ag")):
        pb.add(rank, "tp", f"t{rank}", "tp", comm=_op("tp", 1.0), join=join)
    program = _program(pb)
    assert program.join_of == [0, 1, 0, -1, 1]
    assert program.join_sizes == [2, 2]
    assert program.join_size == {"ar": 2, "ag": 2}


def test_a_program_without_join_numbers_runs_the_same():
    """The engine numbers joins itself for a Program made without them: the program of
    test_a_join_member_waits_for_its_stream_head gives the same log (ag [4, 9] on ranks 1 and 2,
    ar [9, 11] on ranks 0 and 1) and the same 3 events."""
    pb = ProgramBuilder()
    ag = _op("tp", 5.0, group=(1, 2), op="all_gather")
    ar = _op("tp", 2.0, group=(0, 1))
    pb.add(0, "tp", "ar0", "tp", comm=ar, join="ar")
    pb.add(1, "tp", "ag1", "tp", comm=ag, join="ag")
    pb.add(1, "tp", "ar1", "tp", comm=ar, join="ar")
    k = pb.add(2, "compute", "k2", "compute", duration_s=4e-3)
    pb.add(2, "tp", "ag2", "tp", comm=ag, join="ag", deps=[k])
    program = _program(pb)
    program.join_of = program.join_sizes = None
    run = run_program(program, _AxisLinks())
    log = [(t.name, round(float(run.start_s[t.id]) * 1e3, 9), round(float(run.end_s[t.id]) * 1e3, 9))
           for t in program.tasks]
    assert log == [("ar0", 9.0, 11.0), ("ag1", 4.0, 9.0), ("ar1", 9.0, 11.0), ("k2", 0.0, 4.0),
                   ("ag2", 4.0, 9.0)]
    assert run.events == 3


def test_crossed_joins_deadlock_and_the_error_names_the_first_stuck_task():
    """Rank 0 issues x then y, rank 1 issues y then x (two NCCL calls in different orders):
    neither join ever completes. The error names the first task that never ran, x0."""
    pb = ProgramBuilder()
    pb.add(0, "dp", "x0", "dp", comm=_op("dp", 1.0), join="x")
    pb.add(0, "dp", "y0", "dp", comm=_op("dp", 1.0), join="y")
    pb.add(1, "dp", "y1", "dp", comm=_op("dp", 1.0), join="y")
    pb.add(1, "dp", "x1", "dp", comm=_op("dp", 1.0), join="x")
    with pytest.raises(RuntimeError, match=r"deadlock: 4 tasks never ran, first 'x0' on rank 0 stream dp"):
        _run(pb)


def test_a_dependency_cycle_is_a_deadlock_too():
    """a waits for b, b waits for a (on another stream): 2 tasks never run, first 'a'."""
    pb = ProgramBuilder()
    pb.add(0, "compute", "a", "compute", duration_s=1e-3, deps=[1])
    pb.add(0, "tp", "b", "compute", duration_s=1e-3, deps=[0])
    with pytest.raises(RuntimeError, match=r"deadlock: 2 tasks never ran, first 'a' on rank 0 stream compute"):
        _run(pb)


# -- per-rank speed: compute slowed while a collective of the same rank is in flight -----------


def _kernel_beside(comms, slowdown=0.25, kernel_ms=10.0, comm_rank=0):
    """A kernel of ``kernel_ms`` on rank 0 and, on ``comm_rank``, collectives (axis, ms,
    start_after_ms): each waits for a kernel of ``start_after_ms`` on a helper rank (9) that
    joins it, so it starts exactly then. Returns the log."""
    pb = ProgramBuilder()
    pb.add(0, "compute", "kernel", "compute", duration_s=kernel_ms * 1e-3)
    for i, (axis, ms, after_ms) in enumerate(comms):
        op = _op(axis, ms, group=(comm_rank, 9))
        pb.add(comm_rank, axis, f"{axis}{i}", axis, comm=op, join=i)
        gate = pb.add(9, f"gate{i}", f"gate{i}", "compute", duration_s=after_ms * 1e-3)
        pb.add(9, axis, f"{axis}{i}.peer", axis, comm=op, join=i, deps=[gate])
    log, _ = _run(pb, slowdown=slowdown)
    return {name: (start, end) for name, start, end in log}


def test_without_slowdown_a_collective_does_not_stretch_compute():
    """overlap_slowdown 0: the 10 ms kernel beside a 4 ms all-reduce ends at 10 ms."""
    log = _kernel_beside([("dp", 4.0, 0.0)], slowdown=0.0)
    assert log["kernel"] == (0.0, 10.0)
    assert log["dp0"] == (0.0, 4.0)


def test_compute_slows_while_a_collective_of_its_rank_is_in_flight():
    """Slowdown 0.25: rate 1/1.25 = 0.8 while the collective runs. A 5 ms all-reduce in
    [2, 7] ms beside a 10 ms kernel: 2 ms of work by t = 2, 5 * 0.8 = 4 ms more by t = 7,
    the remaining 10 - 6 = 4 ms at full speed: the kernel ends at 7 + 4 = 11 ms."""
    log = _kernel_beside([("dp", 5.0, 2.0)])
    assert log["dp0"] == (2.0, 7.0)
    assert log["kernel"] == (0.0, 11.0)


def test_a_kernel_inside_a_longer_collective_takes_1_plus_slowdown_times_longer():
    """A 10 ms kernel entirely inside a 20 ms all-reduce, slowdown 0.25: 10 * 1.25 = 12.5 ms."""
    log = _kernel_beside([("dp", 20.0, 0.0)])
    assert log["kernel"] == (0.0, 12.5)


def test_overlapping_collectives_do_not_compound_the_slowdown():
    """A dp all-reduce [0, 4] and a tp all-reduce [0, 6] on rank 0 (separate links): the rate
    is 0.8 while at least one is in flight, not 0.8**2. Work by t = 6: 6 * 0.8 = 4.8 ms; the
    remaining 5.2 ms at full speed: ends at 11.2 ms."""
    log = _kernel_beside([("dp", 4.0, 0.0), ("tp", 6.0, 0.0)])
    assert log["kernel"] == (0.0, 11.2)


def test_a_collective_of_another_rank_does_not_slow_this_one():
    """The 5 ms all-reduce runs on ranks 1 and 9, not 0: rank 0's kernel ends at 10 ms."""
    log = _kernel_beside([("dp", 5.0, 2.0)], comm_rank=1)
    assert log["kernel"] == (0.0, 10.0)


def test_two_compute_streams_of_one_rank_run_side_by_side_with_slowdown_on():
    """With slowdown 0.25 but no collective, a 10 ms kernel on the compute stream and a 4 ms
    compute task on another stream of rank 0 run at full speed, as with slowdown 0: [0, 10]
    and [0, 4]. (Today's workload puts compute only on the compute stream, so this is latent.)"""
    pb = ProgramBuilder()
    pb.add(0, "compute", "k1", "compute", duration_s=10e-3)
    pb.add(0, "tp", "k2", "compute", duration_s=4e-3)
    log, _ = _run(pb, slowdown=0.25)
    assert log == [("k1", 0.0, 10.0), ("k2", 0.0, 4.0)]


@pytest.mark.parametrize("op", ["d2h", "h2d"])
def test_host_copies_do_not_slow_compute(op):
    """d2h and h2d run on copy engines, not SMs: a 10 ms kernel beside a 4 ms copy of rank 0
    (4e8 B at 100 GB/s) with slowdown 0.25 still ends at 10 ms."""
    pb = ProgramBuilder()
    pb.add(0, "compute", "kernel", "compute", duration_s=10e-3)
    pb.add(0, "offload", op, "offload", comm=CommOp(op, (0,), _bytes_in(4.0), "offload"))
    log, _ = _run(pb, slowdown=0.25)
    assert log == [("kernel", 0.0, 10.0), (op, 0.0, 4.0)]


# -- a real cluster: 1 x p4d.24xlarge --------------------------------------------------------


@pytest.fixture(scope="module")
def p4d():
    """The resolver of one p4d.24xlarge (8 A100 on NVSwitch), built as ``simulate`` builds it."""
    graph = build_cluster(ClusterSpec.model_validate({"node": "p4d.24xlarge", "nodes": 1}))
    return CommResolver(graph, CollectivePlanner(graph, Router(graph)), LinkClasses(graph, None), nccl_model(),
                        block_ranks=None)


def test_p2p_on_p4d_joins_sender_and_receiver_and_slows_the_senders_compute(p4d):
    """Rank 0 sends 2.325e9 B to rank 1 (join "act") after its 1 ms kernel; rank 1 receives
    after its 3 ms kernel, so the transfer starts at 3 ms on both. NVLink on p4d: 300 GB/s x
    0.775 efficiency = 232.5 GB/s, so 10 ms of bytes, plus NCCL Simple latency base 8.4 us +
    one NVLink hop 3.4 us = 11.8 us (topologies/nccl.yaml): ends at 13.0118 ms.
    Rank 0's 10 ms kernel k (after its 1 ms kernel) runs at full speed in [1, 3] (2 ms of
    work), then at 0.8 (slowdown 0.25): the other 8 ms take 10 ms and end at 13.0 ms, just
    before the transfer does. A d2h copy of 2.3625e8 B from rank 0 meanwhile (PCIe 31.5 GB/s
    x 0.75 = 23.625 GB/s, 10 ms, + 5.7 us PCIe hop latency) neither slows k nor is slowed."""
    pb = ProgramBuilder()
    a = pb.add(0, "compute", "fwd0", "compute", duration_s=1e-3)
    b = pb.add(1, "compute", "fwd1", "compute", duration_s=3e-3)
    op = CommOp("p2p", (0, 1), 2.325e9, "pp")
    pb.add(0, "pp", "send", "pp", comm=op, join="act", deps=[a])
    pb.add(1, "pp", "recv", "pp", comm=op, join="act", deps=[b])
    pb.add(0, "compute", "k", "compute", duration_s=10e-3)
    pb.add(0, "offload", "d2h", "offload", comm=CommOp("d2h", (0,), 2.3625e8, "offload"))
    log, run = _run(pb, resolver=p4d, slowdown=0.25)
    assert log == [("fwd0", 0.0, 1.0), ("fwd1", 0.0, 3.0), ("send", 3.0, 13.0118), ("recv", 3.0, 13.0118),
                   ("k", 1.0, 13.0), ("d2h", 0.0, 10.0057)]
    assert run.makespan_s == pytest.approx(13.0118e-3, rel=1e-12)
    assert run.events == 5  # fwd0, fwd1, the joined transfer, k, d2h
    assert run.resolved[2].alone_s == pytest.approx(10.0118e-3, rel=1e-12)  # task id 2: send


def test_an_empty_program_has_no_makespan(p4d):
    run = run_program(ProgramBuilder().build((), {}, {}), p4d)
    assert (run.makespan_s, run.events) == (0.0, 0)
