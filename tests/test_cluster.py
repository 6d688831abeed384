"""Cluster graphs, routing, placement and process groups."""

import pytest

from simulator.catalog import default_catalog
from simulator.cluster import Mesh, Router, build_cluster
from simulator.cluster.describe import summarize
from simulator.scenario import ClusterSpec

CONTRACT_NODES = {"dgx-a100", "dgx-h100", "dgx-h200", "dgx2-v100", "p3.16xlarge", "p3dn.24xlarge", "p4d.24xlarge",
                  "p4de.24xlarge", "p5.48xlarge", "g5.12xlarge", "g5.48xlarge"}
CONTRACT_GPUS = {"v100-16gb", "v100-32gb", "a100-40gb", "a100-80gb", "a10g", "h100-sxm", "h200"}


def cluster(node, nodes=1, **fabric):
    return build_cluster(ClusterSpec.model_validate({"node": node, "nodes": nodes, "fabric": fabric}))


def test_catalog_has_every_contract_node_and_gpu_with_sources():
    assert set(default_catalog().node_type_names()) >= CONTRACT_NODES
    assert set(default_catalog().gpus) >= CONTRACT_GPUS
    for name in CONTRACT_NODES:
        assert default_catalog().node_type(name).sources
    for gpu in default_catalog().gpus.values():
        assert (gpu.sources and gpu.peak_flops.bf16) or gpu.peak_flops.fp16


def test_nvswitch_node():
    c = cluster("dgx-a100")
    nvlink = [link for link in c.links if link.kind == "nvlink"]
    assert len(nvlink) == 16  # 8 GPUs x up and down to the switch plane
    assert all(link.bandwidth_bytes_per_s == 300e9 for link in nvlink)


def test_hybrid_cube_mesh_has_six_bricks_per_gpu():
    """DGX-1 / p3.16xlarge: 6 NVLink 2 bricks per V100, 25 GB/s each way = 150 GB/s."""
    c = cluster("p3.16xlarge")
    for i in range(8):
        out = sum(link.bandwidth_bytes_per_s for link in c.out_links(f"n0.gpu{i}") if link.kind == "nvlink")
        assert out == pytest.approx(150e9)


def test_routes_inside_and_between_nodes():
    c = cluster("p4d.24xlarge", 2)
    r = Router(c)
    intra = r.route(0, 1)
    assert intra.hop_class == "nvlink" and {c.links[i].kind for i, _ in intra.links} == {"nvlink"}
    inter = r.route(0, 9)
    kinds = {c.links[i].tier for i, _ in inter.links}
    assert inter.hop_class == "net" and {"nic-up", "nic-down", "pcie-nic"} <= kinds
    # GPUs 0 and 1 share NIC 0 on p4d (4 NICs for 8 GPUs)
    assert any(c.links[i].src == "n0.nic0" for i, _ in r.route(1, 9).links)


def test_mesh_gpus_without_a_link_go_through_the_host():
    c = cluster("p3.16xlarge")
    route = Router(c).route(0, 5)  # GPU0 has no NVLink to GPU5
    assert route.hop_class == "pcie"


def test_fat_tree_oversubscription_thins_the_uplinks():
    """16 p4d (4 NICs of 12.5 GB/s) under 64-port leaves: 8 nodes per leaf, 2 leaves; each
    leaf's uplinks carry 8 x 4 x 12.5 / oversubscription GB/s over 32 spines."""
    full = cluster("p4d.24xlarge", 16)
    thin = cluster("p4d.24xlarge", 16, oversubscription=4.0)
    up = [link.bandwidth_bytes_per_s for link in full.links if link.tier == "leaf-up"]
    up_thin = [link.bandwidth_bytes_per_s for link in thin.links if link.tier == "leaf-up"]
    assert len(up) == 2 * 32 and up[0] == pytest.approx(8 * 4 * 12.5e9 / 32)
    assert up_thin[0] == pytest.approx(up[0] / 4)


def test_multipath_policies():
    # EFA sprays over every spine; InfiniBand takes one (D-mod-k); TCP hashes flows
    efa = cluster("p4d.24xlarge", 16)
    r = Router(efa).route(0, 8 * 8)  # node 0 -> node 8, different leaves
    spines = [efa.links[i] for i, _ in r.links if efa.links[i].tier == "leaf-up"]
    assert len(spines) == 32 and sum(w for i, w in r.links if efa.links[i].tier == "leaf-up") == pytest.approx(1.0)
    ib = cluster("dgx-a100", 16)
    r = Router(ib).route(0, 4 * 8)
    assert sum(1 for i, _ in r.links if ib.links[i].tier == "leaf-up") == 2  # 2 NICs for GPU0, one spine each


def test_rail_optimized_same_rail_skips_the_spine():
    c = cluster("dgx-a100", 4, kind="rail-optimized")
    r = Router(c)
    same_rail = r.route(0, 8)  # GPU0 of node 0 -> GPU0 of node 1
    assert not any(c.links[i].tier == "leaf-up" for i, _ in same_rail.links)


def test_mesh_groups_tp_innermost():
    m = Mesh.from_sizes(tp=2, cp=1, pp=2, dp=2)
    assert m.group(0, "tp") == (0, 1)
    assert m.group(0, "pp") == (0, 2)
    assert m.group(0, "dp") == (0, 4)
    assert m.coords(7) == {"tp": 1, "cp": 0, "pp": 1, "dp_shard": 1, "dp_replicate": 0}
    mics = Mesh.from_sizes(tp=1, cp=1, pp=1, dp=8, shard_group_size=4)
    assert mics.group(5, "dp_shard") == (4, 5, 6, 7) and mics.group(5, "dp_replicate") == (1, 5)


def test_topo_summary_of_four_p4d():
    """4 x 12.5 GB/s EFA per node: bisection = 2 nodes x 50 GB/s = 100 GB/s."""
    s = summarize(cluster("p4d.24xlarge", 4))
    assert s.gpus == 32 and s.network_per_gpu_bytes_per_s == pytest.approx(6.25e9)
    assert s.bisection_bytes_per_s == pytest.approx(100e9)


def test_topo_cli(cli):
    out = cli("topo", "dgx-h100", "--nodes", "2")
    assert out.exit_code == 0 and "bisection bandwidth" in out.output and "400 GB/s" in out.output
    assert cli("topo", "dgx-h900").exit_code == 2
