"""The flow solver (incremental components, one filling row per kind of entity) against the
solver it replaced (tests/reference_flow.py), on random sets of phases: every transfer ends at
the same time, every link class carries the same bytes, the same number of recomputations."""

import numpy as np
import pytest
import simpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference_flow import ReferenceFlowNetwork

from simulator.engine.network import FlowNetwork, PhaseLoad
from simulator.engine.network.components import Components

N_CLASSES = 6

phase = st.tuples(
    st.lists(st.integers(0, N_CLASSES - 1), min_size=1, max_size=4, unique=True),  # link classes
    st.sampled_from([1.0, 2.0, 0.5, 0.75]),  # flows per class (fractional: spraying, averaging)
    st.sampled_from([1e6, 3e6, 2.5e7]),  # bytes per flow
    st.sampled_from([0.0, 1e-5]),  # latency
    st.sampled_from([float("inf"), float("inf"), 4e9]),  # rate cap
)
# a start time, a phase, and how many identical copies start together (ring steps of replicas)
transfer = st.tuples(st.sampled_from([0.0, 0.0, 1e-4, 7e-4, 2e-3]), st.lists(phase, min_size=1, max_size=3),
                     st.integers(1, 3))


def _run(factory, transfers, caps):
    env = simpy.Environment()
    net = factory(env, np.array(caps), record_series=True)
    done: dict[tuple[int, int], float] = {}
    for i, (t0, phases, copies) in enumerate(transfers):
        loads = [PhaseLoad(np.array(c), np.full(len(c), f), b, lat, cap) for c, f, b, lat, cap in phases]
        for k in range(copies):
            ev = env.timeout(t0)
            ev.callbacks.append(lambda _e, key=(i, k), loads=loads: net.transfer_phases(
                loads, lambda: done.__setitem__(key, env.now)))
    env.run()
    return done, net


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(transfers=st.lists(transfer, min_size=1, max_size=10),
       caps=st.lists(st.sampled_from([1e9, 2.5e9, 1e10, 4.8e10]), min_size=N_CLASSES, max_size=N_CLASSES))
def test_same_end_times_bytes_and_recomputations_as_the_reference_solver(transfers, caps):
    want, ref = _run(ReferenceFlowNetwork, transfers, caps)
    got, new = _run(FlowNetwork, transfers, caps)
    assert set(got) == set(want)
    for key, t in want.items():
        assert got[key] == pytest.approx(t, rel=1e-9, abs=1e-15), key
    assert new.bytes_carried == pytest.approx(ref.bytes_carried, rel=1e-9)
    assert new.recomputations == ref.recomputations
    assert new.entities_started == ref.entities_started
    assert [t for t, _, _ in new.series] == pytest.approx([t for t, _, _ in ref.series], rel=1e-9, abs=1e-15)


def test_identical_phases_share_the_links_equally():
    """Three copies of one phase on one 3 GB/s class: 1 GB/s each, 1 MB in 1 ms; a fourth
    phase on another class alone: 1 MB at 2 GB/s, 0.5 ms."""
    env = simpy.Environment()
    net = FlowNetwork(env, np.array([3e9, 2e9]))
    done = []
    same = PhaseLoad(np.array([0]), np.array([1.0]), 1e6, 0.0)
    for _ in range(3):
        net.transfer_phases([same], lambda: done.append(env.now))
    net.transfer_phases([PhaseLoad(np.array([1]), np.array([1.0]), 1e6, 0.0)], lambda: done.append(env.now))
    env.run()
    assert done == pytest.approx([0.5e-3, 1e-3, 1e-3, 1e-3], rel=1e-12)


def test_components_merge_on_a_shared_class_and_split_when_the_bridge_ends():
    """Entities 0 on classes {0, 1}, 1 on {1, 2}, 2 on {3}: 0 and 1 share class 1 (one
    component), 2 is apart; 3 on {0, 3} bridges them into one; when 3 ends, {0, 1} and {2}
    split again, and when 2 ends class 3 is free (occupancy [1, 2, 1, 0], owner -1)."""
    comps = Components(4)
    comps.add(0, np.array([0, 1]))
    comps.add(1, np.array([1, 2]))
    comps.add(2, np.array([3]))
    assert comps.of(0) == comps.of(1) != comps.of(2)
    comps.add(3, np.array([0, 3]))
    assert comps.of(0) == comps.of(1) == comps.of(2) == comps.of(3)
    left, shared = comps.remove(3)
    assert shared and left == comps.of(0)
    pieces = comps.settle(left)
    assert len(pieces) == 2
    assert sorted(sorted(comps.members[p]) for p in pieces) == [[0, 1], [2]]
    assert comps.of(2) != comps.of(0) == comps.of(1)
    assert comps.remove(2) == (None, False)
    assert comps.occupancy.tolist() == [1, 2, 1, 0]
    assert comps.owner[3] == -1


def test_a_mix_of_kinds_met_again_gets_the_same_rates():
    """Two transfers of two 1 MB phases each on one 3 GB/s class run side by side: each phase
    gets 1.5 GB/s, so the first phases end at 2/3 ms and the second ones (the same mix of kinds
    again, its rates reused) at 4/3 ms. A third 1 MB transfer started at 2 ms is alone: 1/3 ms,
    ending at 7/3 ms. The class carries 5 MB in all."""
    env = simpy.Environment()
    net = FlowNetwork(env, np.array([3e9]))
    done = []
    step = PhaseLoad(np.array([0]), np.array([1.0]), 1e6, 0.0)
    for _ in range(2):
        net.transfer_phases([step, step], lambda: done.append(env.now))
    env.timeout(2e-3).callbacks.append(lambda _e: net.transfer_phases([step], lambda: done.append(env.now)))
    env.run()
    assert done == pytest.approx([4e-3 / 3, 4e-3 / 3, 7e-3 / 3], rel=1e-12)
    assert net.bytes_carried.tolist() == pytest.approx([5e6], rel=1e-12)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(transfers=st.lists(transfer, min_size=1, max_size=10),
       caps=st.lists(st.sampled_from([1e9, 2.5e9, 1e10, 4.8e10]), min_size=N_CLASSES, max_size=N_CLASSES))
def test_array_paths_for_many_classes_give_the_same_doubles(transfers, caps):
    """Loads over ``FEW_CLASSES`` classes are accounted and tracked by array operations, the
    others by plain loops: with every load on the array paths (threshold 0) every end time,
    byte count and recomputation is exactly the same."""
    from simulator.engine.network import base, flow

    want, loops = _run(FlowNetwork, transfers, caps)
    saved = base.FEW_CLASSES
    base.FEW_CLASSES = flow.FEW_CLASSES = 0
    try:
        got, arrays = _run(FlowNetwork, transfers, caps)
    finally:
        base.FEW_CLASSES = flow.FEW_CLASSES = saved
    assert got == want
    assert arrays.bytes_carried.tolist() == loops.bytes_carried.tolist()
    assert arrays.recomputations == loops.recomputations
    assert [t for t, _, _ in arrays.series] == [t for t, _, _ in loops.series]
