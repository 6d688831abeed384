"""Hardware variants of the H100: H800 (reduced NVLink) and H100 NVL (94 GB), and the dgx-h800 node."""

import pytest

import simulator
from simulator.catalog import default_catalog
from simulator.cluster import build_cluster
from simulator.scenario import ClusterSpec

GiB = 2**30


def scenario(cluster: dict) -> simulator.Scenario:
    return simulator.Scenario.model_validate({
        "model": "gpt3-1.3b",
        "cluster": cluster,
        "parallelism": {"tp": 2},
        "training": {"micro_batch": 1, "global_batch": 16, "precision": "bf16"},
    })


def test_catalog_loads_the_variants_with_sources_and_profiles():
    catalog = default_catalog()
    h100, h800, nvl = catalog.gpu("h100-sxm"), catalog.gpu("h800"), catalog.gpu("h100-nvl")
    for gpu in (h800, nvl):
        assert gpu.sources and gpu.architecture == "hopper" and gpu.nvlink is not None
        profile = catalog.profile(catalog.builtin_profile_path(gpu.name))
        assert profile.gpu == gpu.name and not profile.calibrated
        assert profile.sustained_compute_fraction == 0.8
    # H800: H100 SXM's compute and HBM, NVLink 400 GB/s bidirectional = 200 GB/s one direction
    assert h800.peak_flops == h100.peak_flops
    assert h800.memory_bandwidth_bytes_per_s == h100.memory_bandwidth_bytes_per_s
    assert h800.nvlink.bandwidth_bytes_per_s == 200e9 and h800.nvlink.nvls
    # H100 NVL: half of the datasheet's sparse figures, 94 GB (95830 MiB in nvidia-smi), 3.9 TB/s
    assert nvl.peak_flops_per_s("bf16") == pytest.approx(835.5e12)
    assert nvl.peak_flops_per_s("fp8") == pytest.approx(1670.5e12)
    assert nvl.memory_bytes == 95830 * 2**20 and nvl.memory_bandwidth_bytes_per_s == 3.9e12
    assert nvl.nvlink.bandwidth_bytes_per_s == 300e9 and not nvl.nvlink.nvls
    node = catalog.node_type("dgx-h800")
    assert node.gpu == "h800" and node.gpus == 8 and node.intra_node.kind == "nvswitch"
    assert node.nics.count == 8 and node.nics.bandwidth_bytes_per_s == 50e9


def test_dgx_h800_nvswitch_links_carry_the_h800_bandwidth():
    """The NVSwitch builder takes the per-GPU NVLink rate from the GPU spec, not the node."""
    for node, rate in (("dgx-h800", 200e9), ("dgx-h100", 450e9)):
        c = build_cluster(ClusterSpec.model_validate({"node": node, "nodes": 1}))
        nvlink = [link for link in c.links if link.kind == "nvlink"]
        assert len(nvlink) == 16 and all(link.bandwidth_bytes_per_s == rate for link in nvlink)


def test_a_scenario_on_two_dgx_h800_runs():
    result = simulator.simulate(scenario({"node": "dgx-h800", "nodes": 2}))
    assert result.step_time_s > 0 and not result.oom
    assert result.gpu_memory_bytes == default_catalog().gpu("h800").memory_bytes


@pytest.mark.parametrize("algorithm", [None, "ring"])
def test_tp8_all_reduce_in_one_dgx_h800_is_slower_by_the_nvlink_ratio(algorithm):
    """1 GiB all-reduce over the 8 GPUs of one node, NVLS (the tuner's pick) and ring.

    Both nodes have the same NVSwitch graph, NCCL constants and nccl_efficiency (0.822); only
    the per-GPU NVLink rate differs: 450 GB/s (H100) vs 200 GB/s (H800) one direction, a
    ratio of 2.25. The NCCL model charges t = latency + bytes / (bandwidth x efficiency), so
    the bandwidth term scales by exactly 2.25 and the latency term not at all. At 1 GiB the
    bandwidth term dominates: NVLS on H100 moves 2^30 B / (450e9 x 0.61) = 3.911 ms against a
    25 us latency, giving (8.801 + 0.025) / (3.911 + 0.025) = 2.242; the ring's step latencies
    are of the same order. Latency can only pull the ratio below 2.25, by (1 - 1/2.25) x
    latency / t_H100 < 1%, hence 2.25 within 2% and never above it.
    """
    times = {
        node: simulator.simulate_collective(cluster={"node": node, "nodes": 1}, op="all_reduce", nbytes=GiB,
                                            algorithm=algorithm)
        for node in ("dgx-h100", "dgx-h800")
    }
    ratio = times["dgx-h800"] / times["dgx-h100"]
    assert ratio == pytest.approx(450 / 200, rel=0.02)
    assert ratio <= 450 / 200 + 1e-9


def test_h100_nvl_memory_shows_in_the_result():
    """cluster.gpu overrides the node's GPU: 4 H100 NVL on a PCIe node hold 95830 MiB each."""
    result = simulator.simulate(scenario({"node": "g5.12xlarge", "nodes": 1, "gpu": "h100-nvl"}))
    assert result.gpu_memory_bytes == 95830 * 2**20
    h100 = simulator.simulate(scenario({"node": "g5.12xlarge", "nodes": 1, "gpu": "h100-sxm"}))
    assert h100.gpu_memory_bytes == 81559 * 2**20 < result.gpu_memory_bytes


def test_grand_teton_h100_96gb_hbm2e_carries_the_stated_figures():
    """torchtitan's benchmark doc states 96 GB HBM2e at 2.4 TB/s, 500 W, 8 GPUs on NVLink and
    400 Gb/s RDMA per GPU; the peak is the middle of the SXM (989.4) and NVL (835.5) dense
    BF16 peaks the doc bounds it by: (989.4 + 835.5) / 2 = 912.45 TFLOPS; fp8 twice that."""
    catalog = default_catalog()
    gpu = catalog.gpu("h100-96gb-hbm2e")
    assert gpu.memory_bandwidth_bytes_per_s == 2.4e12
    assert gpu.peak_flops_per_s("bf16") == pytest.approx((989.4e12 + 835.5e12) / 2)
    assert gpu.peak_flops_per_s("fp8") == pytest.approx(2 * 912.45e12)
    assert gpu.memory_bytes == (96 * 1024 - 426) * 2**20  # 96 GiB less the NVL's hidden 426 MiB
    assert catalog.profile(catalog.builtin_profile_path(gpu.name)).gpu == gpu.name
    node = catalog.node_type("grand-teton")
    assert node.gpu == gpu.name and node.gpus == 8 and node.intra_node.kind == "nvswitch"
    assert node.nics.count == 8 and node.nics.bandwidth_bytes_per_s == 50e9  # 400 Gb/s = 50 GB/s each
