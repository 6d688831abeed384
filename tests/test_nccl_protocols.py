"""NCCL's protocols per node type, its channel count per message, and EFA's staged messages:
hand-derived values (arithmetic in the docstrings)."""

import pytest

from simulator.catalog import default_catalog
from simulator.catalog.hardware import NicSpec
from simulator.cluster.collective_plan import nccl_model
from simulator.costs.collectives import (
    CollectiveShape,
    PhaseShape,
    channels_used,
    collective_latency_s,
    net_message_bytes,
    protocols_for,
    staged_copy_s,
)
from simulator.run import collective_choice

KiB, MiB = 2**10, 2**20


def _tree_phase(**kw: float) -> PhaseShape:
    """2 nodes x 8 GPUs, NVLink chains, 8 channels; no pipeline fill (channel bandwidth 0)."""
    base = dict(seconds_per_byte=1e-12, steps=16, inter_steps=2, intra_class="nvlink", net_latency_s=35e-6,
                ppn=8, nodes=2, channels=8, net_staged_bytes=32 * KiB, net_staged_bytes_per_s=1.2e9)
    base.update(kw)
    return PhaseShape(**base)  # type: ignore[arg-type]


def _shape(algorithm: str = "tree", protocols: tuple[str, ...] = ("LL", "LL128", "Simple"),
           **kw: float) -> CollectiveShape:
    return CollectiveShape("all_reduce", algorithm, 16, (_tree_phase(**kw),), ll128_ok=False, protocols=protocols)


def test_nccl_drops_channels_below_its_per_thread_threshold():
    """Simple: 512 threads x 64 B = 32 KiB per channel, so 100 KiB runs on int(102400 / 32768)
    = 3 of 8 channels, 8 B on 1 and 16 MiB on all 8. Ring LL: 512 x 8 B x 16 ranks = 64 KiB
    per channel, so 200 KiB runs on int(204800 / 65536) = 3; tree LL: 512 x 8 = 4 KiB, so
    200 KiB fills the 8 channels."""
    assert channels_used("tree", "Simple", 16, 8, 100 * KiB) == 3
    assert channels_used("tree", "Simple", 16, 8, 8) == 1
    assert channels_used("tree", "Simple", 16, 8, 16 * MiB) == 8
    assert channels_used("ring", "LL", 16, 8, 200 * KiB) == 3
    assert channels_used("tree", "LL", 16, 8, 200 * KiB) == 8


def test_network_message_is_a_channels_share_up_to_the_step():
    """Tree/Simple, 8 channels: 64 KiB runs on 2 channels, 32 KiB each; 16 MiB on 8, 2 MiB
    each, cut to the 512 KiB step (4 MiB NCCL_BUFFSIZE / 8 steps). Ring/Simple, 16 ranks:
    4 MiB on 8 channels sends 4 MiB / (16 x 8) = 32 KiB per step. Point-to-point: 8 KiB whole,
    4 MiB in 512 KiB steps."""
    model = nccl_model()
    tree = _shape()
    assert net_message_bytes(model, tree, tree.phases[0], "Simple", 64 * KiB) == 32 * KiB
    assert net_message_bytes(model, tree, tree.phases[0], "Simple", 16 * MiB) == 512 * KiB
    ring = _shape("ring")
    assert net_message_bytes(model, ring, ring.phases[0], "Simple", 4 * MiB) == 32 * KiB
    p2p = CollectiveShape("p2p", "direct", 2, (_tree_phase(channels=1),))
    assert net_message_bytes(model, p2p, p2p.phases[0], "Simple", 8 * KiB) == 8 * KiB
    assert net_message_bytes(model, p2p, p2p.phases[0], "Simple", 4 * MiB) == 512 * KiB


def test_staged_copy_grows_to_the_threshold_then_stays():
    """32 KiB staged at 1.2 GB/s: 8 KiB costs 8192 / 1.2e9 = 6.827 us; 1 MiB costs what
    32 KiB costs, 32768 / 1.2e9 = 27.307 us; a transport without staging costs nothing."""
    phase = _tree_phase()
    assert staged_copy_s(phase, 8 * KiB) == pytest.approx(8192 / 1.2e9, rel=1e-12)
    assert staged_copy_s(phase, MiB) == pytest.approx(32768 / 1.2e9, rel=1e-12)
    assert staged_copy_s(_tree_phase(net_staged_bytes_per_s=0.0), 8 * KiB) == 0.0


def test_tree_simple_latency_adds_the_staged_copy_per_network_hop():
    """Tree/Simple over 2 nodes of 8, 16 KiB (one channel, one 16 KiB message per network
    hop): base 8.4 us + 2 x (7 NVLink hops x 4.0 us + net hop 14 us + transport 35 us +
    copy 16384 / 1.2e9 = 13.653 us) = 8.4 + 2 x 90.653 = 189.707 us."""
    model = nccl_model()
    t = collective_latency_s(model, _shape(), "Simple", 16 * KiB)
    assert t == pytest.approx(8.4e-6 + 2 * (7 * 4.0e-6 + 14e-6 + 35e-6 + 16384 / 1.2e9), rel=1e-9)


def test_node_type_can_restrict_nccl_to_simple():
    """A shape whose node type allows only Simple gets only Simple, even at 8 B; otherwise
    LL is offered below ll_max_bytes (LL128 not: the shape's hops cannot carry it)."""
    model = nccl_model()
    assert protocols_for(model, _shape(protocols=("Simple",)), 8) == ("Simple",)
    assert protocols_for(model, _shape(), 8) == ("LL", "Simple")


def test_p4de_runs_simple_only_as_aws_ofi_nccl_sets_it():
    """aws-ofi-nccl sets NCCL_PROTO=simple on p4d/p4de (no 128-byte ordering on the EFA
    endpoint): the catalog says so, and 8 B on 2 x p4de is tree/Simple; p5 keeps LL."""
    catalog = default_catalog()
    assert catalog.node_type("p4de.24xlarge").nics.nccl_protocols == ["Simple"]
    assert catalog.node_type("p5.48xlarge").nics.nccl_protocols is None
    assert collective_choice({"node": "p4de.24xlarge", "nodes": 2}, "all_reduce", 8) == "tree/Simple"


def test_nccl_protocols_must_keep_simple():
    with pytest.raises(ValueError, match="Simple"):
        NicSpec.model_validate({"count": 1, "bandwidth": 1e9, "transport": "efa", "nccl_protocols": ["LL"]})
