"""cluster.calibration with measured collectives: the intra-node links take the measured
alpha-beta (simulator.cluster.comm_profile). Numbers by hand from the catalog:

dgx-a100: NVLink 300 GB/s per GPU and direction, NCCL efficiency 0.775 -> 232.5 GB/s.
A 2-rank ring all-reduce loads each GPU's NVLink uplink with 2(N-1)/N = 1 byte per byte.
NCCL's LL latency for it (nccl.yaml): base 6.6 us + 2 steps x 0.6 us = 7.8 us.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import simulator
from simulator.cluster import build_cluster
from simulator.cluster.comm_profile import comm_override
from simulator.scenario import ClusterSpec

GiB = 2**30
ALPHA_S, BETA_S_PER_BYTE = 20e-6, 1e-11  # a measured 2-rank all-reduce: 20 us + D / 100 GB/s


def _profile(tmp_path: Path, comm: str, gpu: str = "a100-80gb") -> str:
    """A measured profile of ``gpu`` (a profile applies only to a cluster of the GPU it was measured on)."""
    path = tmp_path / "measured.yaml"
    path.write_text(f"""
kind: dtsim-compute-profile
gpu: {gpu}
calibrated: true
gemm: {{bf16: {{log10_flops: [9], efficiency: [0.5]}}}}
attention_fwd: {{bf16: {{log10_flops: [9], efficiency: [0.5]}}}}
attention_bwd: {{bf16: {{log10_flops: [9], efficiency: [0.5]}}}}
comm:
{comm}
""")
    return str(path)


@pytest.fixture
def measured(tmp_path: Path) -> str:
    return _profile(tmp_path, f"  all_reduce: {{alpha: {ALPHA_S}, beta: {BETA_S_PER_BYTE}, ranks: 2, backend: nccl}}")


def test_nvlink_takes_the_measured_bus_bandwidth_and_latency(measured: str) -> None:
    cluster = build_cluster(ClusterSpec.model_validate({"node": "dgx-a100", "nodes": 1, "calibration": measured}))
    nvlink = [link for link in cluster.links if link.tier == "nvlink"]
    # busbw = 2(N-1)/N / beta = 1 / 1e-11 = 100 GB/s on a 300 GB/s line
    assert {round(link.efficiency, 12) for link in nvlink} == {round(100 / 300, 12)}
    assert all(link.capacity_bytes_per_s == pytest.approx(100e9) for link in nvlink)
    # per step: measured (20 - 6.6) / 2 = 6.7 us, modelled (7.8 - 6.6) / 2 = 0.6 us -> 6.1 us extra
    assert cluster.intra_hop_latency_s == pytest.approx(6.1e-6)
    # NICs and PCIe keep their catalog values
    plain = build_cluster(ClusterSpec.model_validate({"node": "dgx-a100", "nodes": 1}))
    for a, b in zip(plain.links, cluster.links, strict=True):
        if a.tier != "nvlink":
            assert a == b


def test_the_measured_collective_is_reproduced(measured: str) -> None:
    spec = {"node": "dgx-a100", "nodes": 1, "gpus_per_node": 2, "calibration": measured}
    # 8 bytes: LL, 6.6 + 2 x (0.6 + 6.1) = 20 us (+ 8 B at 50 GB/s)
    assert simulator.simulate_collective(spec, "all_reduce", 8, "ring") == pytest.approx(ALPHA_S, rel=1e-3)
    # 1 GiB: Simple, 8.4 + 2 x (3.4 + 6.1) = 27.4 us + 2^30 B x 1e-11 s/B
    big = simulator.simulate_collective(spec, "all_reduce", GiB, "ring")
    assert big == pytest.approx(27.4e-6 + GiB * BETA_S_PER_BYTE, rel=1e-9)
    assert big == pytest.approx(ALPHA_S + GiB * BETA_S_PER_BYTE, rel=1e-3)
    # uncalibrated, the same all-reduce runs at 232.5 GB/s after 8.4 + 2 x 3.4 = 15.2 us
    plain = simulator.simulate_collective({"node": "dgx-a100", "nodes": 1, "gpus_per_node": 2}, "all_reduce",
                                          GiB, "ring")
    assert plain == pytest.approx(15.2e-6 + GiB / 232.5e9, rel=1e-9)


def test_other_rank_counts_inherit_the_measured_links(measured: str) -> None:
    spec = {"node": "dgx-a100", "nodes": 1, "calibration": measured}
    # 8 ranks: 2 x 7/8 x 2^30 / 100 GB/s + 8.4 + 14 x (3.4 + 6.1) us
    expected = 2 * 7 / 8 * GiB / 100e9 + 8.4e-6 + 14 * 9.5e-6
    assert simulator.simulate_collective(spec, "all_reduce", GiB, "ring") == pytest.approx(expected, rel=1e-9)


def test_pcie_nodes_recalibrate_their_peer_path_not_the_network(tmp_path: Path) -> None:
    path = _profile(tmp_path, "  all_gather: {alpha: 50us, beta: 1.0e-10, ranks: 2, backend: nccl}", gpu="a10g")
    plain = build_cluster(ClusterSpec.model_validate({"node": "g5.12xlarge", "nodes": 2}))
    cluster = build_cluster(ClusterSpec.model_validate({"node": "g5.12xlarge", "nodes": 2, "calibration": path}))
    changed = {b.tier for a, b in zip(plain.links, cluster.links, strict=True) if a != b}
    assert changed and "nvlink" not in changed
    assert not changed & {"nic-up", "nic-down", "leaf-up", "spine-down", "pcie-nic"}


def test_no_comm_section_changes_nothing(tmp_path: Path) -> None:
    path = _profile(tmp_path, "  {}")
    plain = build_cluster(ClusterSpec.model_validate({"node": "dgx-a100", "nodes": 2}))
    cluster = build_cluster(ClusterSpec.model_validate({"node": "dgx-a100", "nodes": 2, "calibration": path}))
    assert plain.links == cluster.links and cluster.intra_hop_latency_s == 0.0


def test_single_gpu_nodes_have_no_intra_node_path(measured: str) -> None:
    from simulator.scenario.calibration import load_profile_spec

    cluster = build_cluster(ClusterSpec.model_validate({"node": "dgx-a100", "nodes": 2, "gpus_per_node": 1}))
    assert comm_override(cluster, dict(load_profile_spec(measured).comm)) is None
