"""NCCL's LL ceiling inside one node (llMaxBws, NVIDIA/nccl v2.23.4-1 src/graph/tuning.cc:86-90,
151-152, 187): hand-derived values, the arithmetic in the docstrings."""

import pytest

from simulator.cluster.collective_plan import nccl_model
from simulator.costs.collectives import (
    CollectiveShape,
    PhaseShape,
    collective_time_s,
    ll_bound_s,
    ll_ceiling_bytes_per_s,
    protocols_for,
)
from simulator.run import collective_choice, simulate_collective

KiB, MiB = 2**10, 2**20
MODEL = nccl_model()
# a ring over 8 GPUs of one node: each edge carries 2 x 7/8 = 1.75 bytes per byte of D at 370 GB/s
RING_SPB = 1.75 / 370e9


def _ring(nodes: int = 1, architecture: str = "hopper") -> CollectiveShape:
    phase = PhaseShape(seconds_per_byte=RING_SPB, steps=14, inter_steps=0 if nodes == 1 else 2,
                       intra_class="nvlink", net_latency_s=0.0, ppn=8 // nodes, nodes=nodes)
    return CollectiveShape("all_reduce", "ring", 8, (phase,), gpu_architecture=architecture)


def test_ceiling_by_gpu_generation_inside_one_node_only():
    """llMaxBws[compCapIndex][0]: Volta 39.0, Ampere 87.7, Hopper 141.0 GB/s on one node; across
    nodes (NCCL keys it by CPU vendor there) and for a generation NCCL has no row for, none."""
    assert ll_ceiling_bytes_per_s(MODEL, _ring(architecture="volta")) == pytest.approx(39.0e9)
    assert ll_ceiling_bytes_per_s(MODEL, _ring(architecture="ampere")) == pytest.approx(87.7e9)
    assert ll_ceiling_bytes_per_s(MODEL, _ring()) == pytest.approx(141.0e9)
    assert ll_ceiling_bytes_per_s(MODEL, _ring(nodes=2)) == 0.0
    assert ll_ceiling_bytes_per_s(MODEL, _ring(architecture="neuroncore-v2")) == 0.0


def test_ring_ll_runs_at_the_ceiling():
    """8 x H100, 512 KiB, ring LL: latency 6.6 + 14 x 0.6 = 15.0 us; the links alone would take
    1.75 x 524288 / 370e9 / 0.5 = 4.95948 us, the ceiling 1.75 x 524288 / 141e9 = 6.50712 us,
    so the bound adds 1.54764 us and the collective takes 15.0 + 6.50712 = 21.50712 us."""
    shape, nbytes = _ring(), 512 * KiB
    assert ll_bound_s(MODEL, shape, "LL", nbytes) == pytest.approx(6.50712e-6 - 4.95948e-6, rel=1e-5)
    assert collective_time_s(MODEL, shape, "LL", nbytes) == pytest.approx(21.50712e-6, rel=1e-6)
    assert ll_bound_s(MODEL, shape, "Simple", nbytes) == 0.0
    assert ll_bound_s(MODEL, _ring(nodes=2), "LL", nbytes) == 0.0


def test_ll_offered_at_any_size_only_where_its_ceiling_is_modelled():
    """1 MiB is above ll_max_bytes (64 KiB): one H100 node still offers LL (ceiling modelled),
    two nodes and an unknown generation do not."""
    assert "LL" in protocols_for(MODEL, _ring(), 1 * MiB)
    assert "LL" not in protocols_for(MODEL, _ring(nodes=2), 1 * MiB)
    assert "LL" not in protocols_for(MODEL, _ring(architecture="neuroncore-v2"), 1 * MiB)
    assert "LL" in protocols_for(MODEL, _ring(nodes=2), 64 * KiB)


@pytest.mark.parametrize("node", ["p5.48xlarge", "dgx-h100"])
def test_one_h100_node_takes_ring_ll_up_to_1_mib_then_nvls(node):
    """One node of 8 H100, all-reduce of 1 MiB: ring LL takes 15.0 us + 1.75 x 1048576 / 141e9 =
    15.0 + 13.01424 = 28.01424 us, NVLS 25 us + 1048576 / (450e9 x 0.61 = 274.5e9) = 28.81995 us,
    so ring LL. 2 MiB: ring LL 15.0 + 26.02849 = 41.02849 us against NVLS 25 + 7.63990 = 32.63990 us."""
    cluster = {"node": node, "nodes": 1}
    assert collective_choice(cluster, "all_reduce", 1 * MiB) == "ring/LL"
    assert simulate_collective(cluster, "all_reduce", 1 * MiB) == pytest.approx(28.01424e-6, rel=1e-6)
    assert collective_choice(cluster, "all_reduce", 2 * MiB) == "nvls/Simple"
    assert simulate_collective(cluster, "all_reduce", 2 * MiB) == pytest.approx(32.63990e-6, rel=1e-6)
