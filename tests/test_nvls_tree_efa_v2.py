"""NCCL's NVLSTree across NVSwitch nodes and p5's EFAv2 (transport variant efa-v2): hand-derived
values (arithmetic in the docstrings)."""

import pytest

import simulator
from simulator.catalog import default_catalog
from simulator.cluster.cache import cluster_setup
from simulator.cluster.collective_plan import nccl_model
from simulator.costs.collectives import (
    CollectiveShape,
    PhaseShape,
    message_bound_s,
    nvls_tree_chunk_bytes,
    protocols_for,
)
from simulator.costs.nccl_env import NcclTuning
from simulator.run import collective_choice
from simulator.scenario import ClusterSpec

KiB, MiB, GiB = 2**10, 2**20, 2**30
P5 = {"node": "p5.48xlarge", "nodes": 2}


@pytest.mark.parametrize(("nbytes", "chunk"), [
    (2 * GiB, 512 * KiB), (1 * GiB, 256 * KiB), (64 * MiB, 128 * KiB), (32 * MiB, 64 * KiB),
    (8 * MiB, 64 * KiB), (4 * MiB, 32 * KiB)])
def test_nvls_tree_chunk_halves_as_nccl_2_20_does(nbytes, chunk):
    """16 channels x 8 heads = 128 concurrent chunks. 512 KiB unless D < 32 x 128 x 512 KiB
    = 2 GiB (2 GiB is not below: 512 KiB); then 256 KiB unless D < 16 x 128 x 256 KiB = 512 MiB
    (1 GiB: 256 KiB); then 128 KiB unless D < 4 x 128 x 128 KiB = 64 MiB (64 MiB: 128 KiB);
    then 64 KiB unless D < 128 x 64 KiB = 8 MiB (32 and 8 MiB: 64 KiB; 4 MiB: 32 KiB)."""
    assert nvls_tree_chunk_bytes(nccl_model(), nbytes, 8) == chunk


def _nvls_tree_shape(message_s: float) -> CollectiveShape:
    phase = PhaseShape(seconds_per_byte=1 / 275e9, steps=2, inter_steps=2, intra_class="nvlink",
                       net_latency_s=20e-6, ppn=8, nodes=2, channels=8, net_message_s=message_s)
    return CollectiveShape("all_reduce", "nvls_tree", 16, (phase,), protocols=("LL", "LL128", "Simple"))


def test_message_bound_is_what_the_proxy_adds_over_the_transfer():
    """64 MiB on 2 nodes x 8: each GPU sends its 8 MiB slice once (one tree level) in 128 KiB
    chunks, 64 messages x 7.4 us = 473.6 us, against the transfer alone 67,108,864 / 275e9 =
    244.032 us: 229.568 us more. At 16 GiB: 2 GiB / 512 KiB = 4,096 x 7.4 us = 30.3 ms, below
    the 62.5 ms transfer: nothing. Without a message cost: nothing."""
    model = nccl_model()
    assert message_bound_s(model, _nvls_tree_shape(7.4e-6), "Simple", 64 * MiB) == pytest.approx(
        64 * 7.4e-6 - 64 * MiB / 275e9, rel=1e-12)
    assert message_bound_s(model, _nvls_tree_shape(7.4e-6), "Simple", 16 * GiB) == 0.0
    assert message_bound_s(model, _nvls_tree_shape(0.0), "Simple", 64 * MiB) == 0.0


def test_nvls_tree_runs_simple_only():
    assert protocols_for(nccl_model(), _nvls_tree_shape(0.0), 1024) == ("Simple",)


def test_nvls_tree_large_message_rate_is_nvlink_sharp_inside_the_node():
    """2 x p5, NVLSTree: NVLS moves D per GPU at 450 GB/s x nvls_efficiency 0.61 = 274.5 GB/s
    (the NVLink flows weigh 0.822 / 0.61 on links of 450 x 0.822), while each GPU's slice D/8
    crosses its 4 x 100 Gb/s EFA at 0.91: 8 x 45.5 = 364 GB/s of D, not the bottleneck.
    Latency, pipeline fill (512 KiB chunks either way) and message bound (0) are the same at 8
    and 16 GiB, so the difference is 8 GiB / 274.5 GB/s = 31.2930 ms."""
    t8 = simulator.simulate_collective(P5, "all_reduce", 8 * GiB, "nvls_tree")
    t16 = simulator.simulate_collective(P5, "all_reduce", 16 * GiB, "nvls_tree")
    assert t16 - t8 == pytest.approx(8 * GiB / (450e9 * 0.61), rel=1e-6)
    assert collective_choice(P5, "all_reduce", 16 * GiB) == "nvls_tree/Simple"


def test_nvls_tree_needs_nvlink_sharp_several_nodes_and_all_reduce():
    setup = cluster_setup(ClusterSpec.model_validate({"node": "p4de.24xlarge", "nodes": 2}), default_catalog())
    planner = setup.planner
    group = tuple(range(16))
    assert "NVLink SHARP" in (planner.unrunnable("all_reduce", "nvls_tree", group) or "")
    assert "nvls_tree" not in planner.candidates("all_reduce", group)
    h100 = cluster_setup(ClusterSpec.model_validate({"node": "dgx-h100", "nodes": 2}), default_catalog()).planner
    assert "nvls_tree" in h100.candidates("all_reduce", group)
    assert "all_reduce only" in (h100.unrunnable("all_gather", "nvls_tree", group) or "")
    assert "several nodes" in (h100.unrunnable("all_reduce", "nvls_tree", tuple(range(8))) or "")


def test_nvls_enable_zero_takes_nvls_tree_out_too():
    """NCCL_NVLS_ENABLE=0 disables NVLS and NVLSTree alike: 16 GiB on 2 x p5 then runs by tree or ring."""
    choice = collective_choice(P5, "all_reduce", 16 * GiB, tuning=NcclTuning(nvls_enable=False))
    assert not choice.startswith("nvls")


def test_p5_takes_the_efa_v2_variant_and_its_ll128():
    """p5.48xlarge names nics.transport_variant efa-v2: its links stay of kind efa, with
    efa-v2's 17 us latency and 7.4 us message cost; a scenario that swaps the transport gets that
    transport's own entry. EFAv2 (RDMA writes) lets NCCL run LL128 across nodes; p4de's EFA
    (aws-ofi-nccl forces Simple there) does not."""
    catalog = default_catalog()
    assert catalog.transport("efa-v2").ll128 and not catalog.transport("efa").ll128
    setup = cluster_setup(ClusterSpec.model_validate(P5), default_catalog())
    assert setup.graph.transport_kind == "efa"
    assert (setup.graph.transport.latency_s, setup.graph.transport.message_s) == (17e-6, 7.4e-6)
    swapped = cluster_setup(ClusterSpec.model_validate({**P5, "fabric": {"transport": "infiniband"}}), default_catalog())
    assert swapped.graph.transport == catalog.transport("infiniband")
    assert collective_choice(P5, "all_reduce", MiB) == "tree/LL128"
    assert collective_choice({"node": "p4de.24xlarge", "nodes": 2}, "all_reduce", MiB).endswith("/Simple")


def test_message_bound_of_a_tree_counts_its_steps_and_the_protocol_factor():
    """Tree/LL128, 1 MiB on 2 nodes x 8, 8 channels: LL128 steps are 512 KiB / 8 = 64 KiB and each
    channel's share 1 MiB / 8 = 128 KiB, so a message is 64 KiB; a GPU sends D/8 = 128 KiB, two
    messages, 2 x 7.4 = 14.8 us. The transfer alone at 400 GB/s and tree LL128's factor 0.9375 x
    0.6 (tree correction at log2(1 MiB / 64 B) = 14) = 0.5625: 1,048,576 / 400e9 / 0.5625 = 4.6603 us;
    the bound adds 10.1397 us."""
    phase = PhaseShape(seconds_per_byte=1 / 400e9, steps=16, inter_steps=2, intra_class="nvlink",
                       net_latency_s=20e-6, ppn=8, nodes=2, channels=8, net_message_s=7.4e-6)
    shape = CollectiveShape("all_reduce", "tree", 16, (phase,), ll128_ok=True)
    assert message_bound_s(nccl_model(), shape, "LL128", MiB) == pytest.approx(
        2 * 7.4e-6 - MiB / 400e9 / (0.9375 * 0.6), rel=1e-12)
