"""Network models behind one protocol: registry, hand-derived times, lowering, link classes."""

from __future__ import annotations

import textwrap
import typing
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import simpy

from simulator.cluster import Router, build_cluster
from simulator.cluster.collectives import CollectivePlanner, nccl_model
from simulator.engine import CommResolver, LinkClasses, Resolved, run_program
from simulator.engine.network import NETWORK_MODELS, PhaseLoad, at_end_of_instant, register_network_model
from simulator.ir import CommOp, ProgramBuilder
from simulator.scenario import ClusterSpec
from simulator.scenario.spec import SimSpec

GiB = 2**30


def _resolver(nodes: int = 1, *, block_ranks: int | None = None,
              slow: Callable[[int], bool] = lambda node: False) -> CommResolver:
    """A resolver on ``nodes`` x dgx-a100; ``slow(n)``: halve node n's gpu3 -> NVSwitch link."""
    cluster = build_cluster(ClusterSpec.model_validate({"node": "dgx-a100", "nodes": nodes}))
    for node in range(nodes):
        if slow(node):
            link = cluster.link_between(f"n{node}.gpu3", f"n{node}.nvsw")
            assert link is not None
            cluster.links[link.id] = link._replace(bandwidth_bytes_per_s=link.bandwidth_bytes_per_s / 2)
    block_nodes = None if block_ranks is None else block_ranks // cluster.gpus_per_node
    classes = LinkClasses(cluster, block_nodes)
    return CommResolver(cluster, CollectivePlanner(cluster, Router(cluster)), classes, nccl_model(),
                        block_ranks=block_ranks)


def _makespan_s(resolver: CommResolver, comm: CommOp, mode: str) -> float:
    """One communication task issued by ``comm.group[0]``, run on network model ``mode``."""
    pb = ProgramBuilder()
    pb.add(comm.group[0], "comm", comm.op, "dp", comm=comm)
    program = pb.build((comm.group[0],), {comm.group[0]: 1}, {comm.group[0]: {}})
    return run_program(program, resolver, mode=mode).makespan_s


def _run_loads(mode: str, capacities_bytes_per_s: list[float], loads: list[PhaseLoad]) -> list[float]:
    """Start every load at t = 0 on a fresh model ``mode``; their end times in seconds."""
    env = simpy.Environment()
    net = NETWORK_MODELS[mode](env, np.array(capacities_bytes_per_s))
    ends = [float("nan")] * len(loads)

    def done(i: int) -> Callable[[], None]:
        return lambda: ends.__setitem__(i, env.now)

    for i, load in enumerate(loads):
        net.transfer(Resolved([load], None, "test", "test", 0.0), done(i))
    env.run()
    return ends


# -- registry ------------------------------------------------------------------------------


def test_registry_keys_are_the_values_of_sim_network() -> None:
    assert set(NETWORK_MODELS) == set(typing.get_args(SimSpec.model_fields["network"].annotation))


class FixedRateSteps:
    """A toy chunked model, written outside the package against the protocol alone: each
    phase runs its steps one after another, every step moving the heaviest flow's step bytes
    at ``RATE_BYTES_PER_S`` (links ignored); the operation's latency comes at the end."""

    RATE_BYTES_PER_S = 1e9

    def __init__(self, env: simpy.Environment, capacity_bytes_per_s: np.ndarray, *,
                 record_series: bool = False) -> None:
        self.env = env
        self.bytes_carried = np.zeros(len(capacity_bytes_per_s))
        self.series: list[tuple[float, np.ndarray, np.ndarray]] = []
        self.entities_started = 0
        self.recomputations = 0

    def transfer(self, comm: Resolved, on_done: Callable[[], None]) -> None:
        seconds = 0.0
        if comm.lowering is not None:
            low = comm.lowering
            for phase in low.phases:
                group = phase.groups[0]
                step_bytes = max(low.wire_bytes(group.step_bytes_per_byte(f)) for f in group.flows)
                seconds += phase.steps * step_bytes / self.RATE_BYTES_PER_S
            seconds += low.latency_s
        self.entities_started += 1
        self.env.timeout(seconds).callbacks.append(lambda _e: on_done())


@pytest.fixture
def toy_model() -> Iterator[str]:
    register_network_model("toy-steps", FixedRateSteps)
    yield "toy-steps"
    del NETWORK_MODELS["toy-steps"]


def test_a_model_registered_from_outside_runs_a_program(toy_model: str) -> None:
    """Ring all-reduce of D = 8 MiB over the 8 GPUs of one dgx-a100 (one ring, n = 8):
    2(n-1) = 14 steps of D/n = 1 MiB per flow, each at 1 GB/s: 14 * 2**20 / e / 1e9 s
    (e: the protocol's efficiency), plus the tuner's latency."""
    resolver = _resolver()
    comm = CommOp("all_reduce", tuple(range(8)), 8 * 2**20, "dp", algorithm="ring")
    low = resolver.resolve(comm).lowering
    assert low is not None
    expected = 14 * 2**20 / low.protocol_efficiency / 1e9 + low.latency_s
    assert _makespan_s(resolver, comm, toy_model) == pytest.approx(expected, rel=1e-12)
    assert toy_model not in typing.get_args(SimSpec.model_fields["network"].annotation)


def test_registering_a_taken_name_needs_replace() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_network_model("flow", FixedRateSteps)


def test_run_program_names_an_unknown_model() -> None:
    with pytest.raises(ValueError, match="unknown network model 'nope'"):
        _makespan_s(_resolver(), CommOp("all_reduce", tuple(range(8)), 1e6, "dp"), "nope")


# -- hand-derived numbers --------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["flow", "analytical"])
def test_one_transfer_alone_is_latency_plus_bytes_over_bandwidth(mode: str) -> None:
    """1 GiB over one 25 GB/s link, 5 us latency: 5e-6 + 2**30 / 25e9 = 0.042954673 s."""
    load = PhaseLoad(np.array([0]), np.array([1.0]), GiB, 5e-6)
    assert _run_loads(mode, [25e9], [load]) == [pytest.approx(5e-6 + GiB / 25e9, rel=1e-12)]
    assert 5e-6 + GiB / 25e9 == pytest.approx(0.042954673, rel=1e-8)


def test_two_flows_sharing_one_link_get_half_each_under_flow() -> None:
    """Two 1 GB flows on one 10 GB/s link: 5 GB/s each, both end at 1e9 / 5e9 = 0.2 s.
    ``analytical`` ignores contention: each alone at 10 GB/s, 1e9 / 10e9 = 0.1 s."""
    loads = [PhaseLoad(np.array([0]), np.array([1.0]), 1e9, 0.0) for _ in range(2)]
    assert _run_loads("flow", [10e9], loads) == [pytest.approx(0.2, rel=1e-12)] * 2
    assert _run_loads("analytical", [10e9], loads) == [pytest.approx(0.1, rel=1e-12)] * 2


def test_end_of_instant_work_runs_after_every_event_of_the_instant() -> None:
    """Events at t = 0 that schedule more zero-delay events still run before the end-of-instant
    callback; an event at t = 1 runs after it."""
    env = simpy.Environment()
    log: list[tuple[str, float]] = []

    def note(name: str) -> Callable[[simpy.Event], None]:
        return lambda _e: log.append((name, env.now))

    env.timeout(1).callbacks.append(note("later"))
    at_end_of_instant(env, lambda: log.append(("end of instant", env.now)))
    first = env.timeout(0)
    first.callbacks.append(note("a"))
    first.callbacks.append(lambda _e: env.timeout(0).callbacks.append(note("b, scheduled by a")))
    env.run()
    assert log == [("a", 0), ("b, scheduled by a", 0), ("end of instant", 0), ("later", 1)]


# -- lowering keeps the step structure ------------------------------------------------------


def test_ring_all_reduce_lowering_shows_its_2n_minus_2_steps() -> None:
    """One dgx-a100 (n = 8, NVSwitch: one ring): one phase of 2(n-1) = 14 steps; 8 flows
    i -> i+1 (mod 8), each moving 2(n-1)/n = 1.75 D over the phase, so D/n = D/8 per step."""
    resolver = _resolver()
    group = tuple(range(8))
    resolved = resolver.resolve(CommOp("all_reduce", group, 2**20, "dp", algorithm="ring"))
    low = resolved.lowering
    assert low is not None and (low.op, low.algorithm, low.nbytes, low.count) == ("all_reduce", "ring", 2**20, 1)
    (phase,) = low.phases
    (only,) = phase.groups
    assert phase.steps == 14 and only.gpus == group and only.multiplicity == 1
    assert sorted((f.src, f.dst) for f in only.flows) == [(i, (i + 1) % 8) for i in range(8)]
    assert all(f.weight == pytest.approx(1.75, rel=1e-12) for f in only.flows)
    assert all(only.step_bytes_per_byte(f) == pytest.approx(1 / 8, rel=1e-12) for f in only.flows)
    # wire bytes per step: D/8 / protocol efficiency
    assert low.step_wire_bytes(0, only.flows[0]) == pytest.approx(2**20 / 8 / low.protocol_efficiency, rel=1e-12)
    # the folded load for the flow model: 1.75 D per flow on each GPU's NVSwitch up- and downlink
    assert resolved.phases[0].bytes_per_flow == pytest.approx(1.75 * 2**20 / low.protocol_efficiency, rel=1e-12)


def test_two_node_ring_has_one_channel_per_gpu_and_d_over_nc_per_step() -> None:
    """2 x dgx-a100 (n = 16 GPUs, C = 8 rings, one per GPU of a node): 2(n-1) = 30 steps;
    16 edges per ring, 128 flows, each moving 2(n-1)/n / C = 30/128 D, so D/(n C) = D/128
    per step."""
    resolver = _resolver(2)
    low = resolver.resolve(CommOp("all_reduce", tuple(range(16)), 2**30, "dp", algorithm="ring")).lowering
    assert low is not None
    (phase,) = low.phases
    flows = phase.groups[0].flows
    assert phase.steps == 30 and len(flows) == 128
    assert all(phase.groups[0].step_bytes_per_byte(f) == pytest.approx(1 / 128, rel=1e-12) for f in flows)


def test_symmetric_lowering_lists_every_group_it_stands_for() -> None:
    """Under symmetry a TP group on node 0 of 4 stands for its 4 translates (multiplicity 4)."""
    resolver = _resolver(4, block_ranks=8)
    (phase,) = resolver.lower("all_reduce", "ring", (tuple(range(8)),))
    assert [g.multiplicity for g in phase.groups] == [4]


# -- link classes stay uniform ----------------------------------------------------------------


def _uniform(classes: LinkClasses) -> bool:
    links = classes.cluster.links
    return all(len({(links[i].kind, links[i].capacity_bytes_per_s, links[i].latency_s, links[i].efficiency)
                    for i in members}) == 1 for members in classes.members)


def test_a_slower_member_splits_its_class() -> None:
    """4 x dgx-a100 simulated as one block of 1 node: the gpu3 -> NVSwitch link of every node
    is one class, until node 2's is halved: then it is a class of its own at half capacity."""
    alike = _resolver(4, block_ranks=8).classes
    odd = _resolver(4, block_ranks=8, slow=lambda n: n == 2).classes
    assert alike.uniform and not odd.uniform and _uniform(alike) and _uniform(odd)
    assert len(odd) == len(alike) + 1
    slow = odd.cluster.link_between("n2.gpu3", "n2.nvsw")
    assert slow is not None
    cls = int(odd.class_of[slow.id])
    assert odd.members[cls] == [slow.id]
    assert odd.capacity[cls] == pytest.approx(300e9 * 0.775 / 2, rel=1e-12)


@pytest.mark.parametrize("mode", ["flow", "analytical"])
def test_one_slow_translate_bounds_the_collective_like_all_slow(mode: str) -> None:
    """Ring all-reduce of the TP group on node 0, standing for all 4 nodes' groups (symmetry).
    The ring runs at its slowest member's pace, so halving gpu3 -> NVSwitch on node 2 only
    makes it exactly as slow as halving it on every node, and slower than no slow link (before
    the split, node 2's link was represented by node 0's capacity and ignored)."""
    comm = CommOp("all_reduce", tuple(range(8)), GiB, "tp", instances=(tuple(range(8)),), algorithm="ring")
    alike = _makespan_s(_resolver(4, block_ranks=8), comm, mode)
    one = _makespan_s(_resolver(4, block_ranks=8, slow=lambda n: n == 2), comm, mode)
    every = _makespan_s(_resolver(4, block_ranks=8, slow=lambda n: True), comm, mode)
    assert one == pytest.approx(every, rel=1e-12)
    assert one > 1.5 * alike


def test_a_slower_switch_link_splits_its_tier_and_shares_its_mean_load() -> None:
    """8 x dgx-a100 (leaf/spine), one node per block: the leaf -> spine links are one tier
    class sharing the load of all blocks evenly. At lower efficiency, leaf0 -> spine0 becomes
    a class of its own that carries the same mean per-link load as the rest of its tier."""
    cluster = build_cluster(ClusterSpec.model_validate({"node": "dgx-a100", "nodes": 8}))
    link = cluster.link_between("leaf0", "spine0")
    assert link is not None and link.node is None
    cluster.links[link.id] = link._replace(efficiency=link.efficiency / 2)
    classes = LinkClasses(cluster, block_nodes=1)
    resolver = CommResolver(cluster, CollectivePlanner(cluster, Router(cluster)), classes, nccl_model(),
                            block_ranks=8)
    assert not classes.uniform and _uniform(classes)
    slow = int(classes.class_of[link.id])
    rest = int(classes.class_of[cluster.link_between("leaf0", "spine1").id])  # type: ignore[union-attr]
    assert slow != rest and classes.size[slow] == 1 and classes.capacity[slow] == classes.capacity[rest] / 2
    group = tuple(range(0, 64, 8))  # GPU 0 of every node: crosses the spines
    load = resolver.resolve(CommOp("all_reduce", group, GiB, "dp", algorithm="ring")).phases[0]
    flows = dict(zip(load.classes.tolist(), load.flows.tolist(), strict=True))
    assert flows[slow] == pytest.approx(flows[rest], rel=1e-12) and flows[slow] > 0


def test_the_registry_docstring_example_runs() -> None:
    """The example in engine/network/registry.py: an ``Instant`` model (bytes move at once)
    registered from outside; a transfer then takes only its latency, 5 us here."""
    from simulator.engine.network import registry

    source = registry.__doc__.split("::", 1)[1].split("after which", 1)[0]  # type: ignore[union-attr]
    scope: dict[str, object] = {}
    exec(textwrap.dedent(source), scope)
    try:
        load = PhaseLoad(np.array([0]), np.array([1.0]), GiB, 5e-6)
        assert _run_loads("instant", [25e9], [load]) == [pytest.approx(5e-6, rel=1e-12)]
    finally:
        del NETWORK_MODELS["instant"]
