"""Property tests (hypothesis): monotonicity, lower bounds, conservation."""

import numpy as np
import pytest
import simpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import simulator
from simulator.cluster import build_cluster
from simulator.engine.network import FlowNetwork, PhaseLoad
from simulator.scenario import ClusterSpec

NODES = ["dgx-a100", "p4d.24xlarge", "p3dn.24xlarge", "g5.48xlarge", "dgx-h100"]
OPS = ["all_reduce", "all_gather", "reduce_scatter"]
FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(node=st.sampled_from(NODES), nodes=st.integers(1, 4), op=st.sampled_from(OPS),
       log_size=st.integers(10, 32), factor=st.sampled_from([1.5, 2.0, 4.0]))
def test_more_bandwidth_is_never_slower(node, nodes, op, log_size, factor):
    base = ClusterSpec.model_validate({"node": node, "nodes": nodes})
    nic = base.node_type.nics.bandwidth_bytes_per_s
    faster = ClusterSpec.model_validate({"node": node, "nodes": nodes, "fabric": {"nic_bandwidth": nic * factor}})
    size = float(2**log_size)
    assert simulator.simulate_collective(faster, op, size) <= simulator.simulate_collective(base, op, size) * (1 + 1e-12)


def _injection_capacity(spec: ClusterSpec) -> float:
    cluster = build_cluster(spec)
    return max(sum(link.capacity_bytes_per_s for link in cluster.out_links(cluster.gpu_vertex(i)))
               for i in range(cluster.gpus_per_node))


@FAST
@given(node=st.sampled_from(NODES), nodes=st.integers(1, 4), op=st.sampled_from(OPS),
       algorithm=st.sampled_from(["ring", "tree", "hierarchical"]), log_size=st.integers(8, 32))
def test_a_collective_never_beats_its_bandwidth_lower_bound(node, nodes, op, algorithm, log_size):
    """Without in-network reduction every rank sends at least 2(N-1)/N * D (all-reduce) or
    (N-1)/N * D (all-gather, reduce-scatter) bytes through its own links (Patarasuk & Yuan)."""
    if algorithm == "tree" and (op != "all_reduce" or nodes == 1):
        return
    spec = ClusterSpec.model_validate({"node": node, "nodes": nodes})
    n = spec.world_size
    size = float(2**log_size)
    factor = 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n
    bound = factor * size / _injection_capacity(spec)
    assert simulator.simulate_collective(spec, op, size, algorithm) >= bound


transfer = st.tuples(
    st.floats(0.0, 0.05),  # start
    st.lists(st.integers(0, 3), min_size=1, max_size=3, unique=True),  # link classes
    st.floats(1e6, 1e9),  # bytes per flow
    st.floats(0.0, 1e-4),  # latency
)


@settings(max_examples=60, deadline=None)
@given(transfers=st.lists(transfer, min_size=1, max_size=8), caps=st.lists(st.floats(1e9, 5e10), min_size=4, max_size=4))
def test_bytes_are_conserved_and_every_transfer_ends(transfers, caps):
    env = simpy.Environment()
    net = FlowNetwork(env, np.array(caps))
    done: dict[int, float] = {}
    expected = np.zeros(4)
    for i, (t0, classes, nbytes, latency) in enumerate(transfers):
        flows = np.arange(1, len(classes) + 1, dtype=float)
        expected[classes] += flows * nbytes
        load = PhaseLoad(np.array(classes), flows, nbytes, latency)
        ev = env.timeout(t0)
        ev.callbacks.append(lambda _e, i=i, load=load: net.transfer_phases([load], lambda: done.__setitem__(i, env.now)))
    env.run()
    assert len(done) == len(transfers)
    assert net.bytes_carried == pytest.approx(expected, rel=1e-7)
    for i, (t0, classes, nbytes, latency) in enumerate(transfers):
        flows = np.arange(1, len(classes) + 1, dtype=float)
        alone = nbytes / min(caps[c] / f for c, f in zip(classes, flows, strict=True)) + latency
        assert done[i] >= t0 + alone * (1 - 1e-9)  # sharing never beats having the links alone
