"""Collectives on real topologies: textbook formulas, nccl-tests reference points, tuner."""

from pathlib import Path

import pytest
from ruamel.yaml import YAML

import simulator
from simulator.catalog import default_catalog
from simulator.cluster.cache import clear_cluster_cache, cluster_setup
from simulator.costs.collectives import bus_bandwidth_factor, ring_all_reduce_time_s
from simulator.run import collective_choice
from simulator.scenario import ClusterSpec

ROOT = Path(__file__).resolve().parents[1]
GiB = 2**30


def test_ring_all_reduce_on_8_nvswitch_gpus_matches_the_alpha_beta_formula():
    """8 x A100 on NVSwitch, 1 GiB, ring/Simple: NCCL's latency 8.4 us base + 14 hops x
    3.4 us; bandwidth B = 300 GB/s NVLink x 0.775 NCCL efficiency = 232.5 GB/s.
    T = 8.4e-6 + 2(N-1)*3.4e-6 + 2(N-1)/N * 2**30 / 232.5e9 = 8.1378 ms."""
    t = simulator.simulate_collective({"node": "dgx-a100", "nodes": 1}, "all_reduce", GiB, "ring")
    expected = 8.4e-6 + ring_all_reduce_time_s(8, GiB, 3.4e-6, 300e9 * 0.775)
    assert t == pytest.approx(expected, rel=1e-9)


def test_dgx_a100_bus_bandwidth_is_about_230_GBps():
    """nccl-tests #175 measured 232.54 GB/s all-reduce busbw on 8 A100s at large sizes."""
    t = simulator.simulate_collective({"node": "dgx-a100", "nodes": 1}, "all_reduce", GiB)
    busbw = GiB / t * bus_bandwidth_factor("all_reduce", 8)
    assert 220e9 < busbw < 235e9


def test_h100_uses_nvlink_sharp_for_large_all_reduce():
    """nccl-tests #212: ~480 GB/s busbw on 8 H100 with NVLS (ring tops out at ~370)."""
    t = simulator.simulate_collective({"node": "dgx-h100", "nodes": 1}, "all_reduce", GiB)
    busbw = GiB / t * bus_bandwidth_factor("all_reduce", 8)
    assert collective_choice({"node": "dgx-h100", "nodes": 1}, "all_reduce", GiB).startswith("nvls")
    assert 450e9 < busbw < 490e9


def _p4de_curve():
    data = YAML(typ="safe").load((ROOT / "validation/published_runs.yaml").read_text())
    return {r["message_bytes"]: r["measured"]["out_of_place"]["time_us"] * 1e-6 for r in data["comm_records"]}


def test_two_p4de_track_the_nccl_tests_curve_from_1MiB():
    """aws-samples nccl-tests all_reduce on 2 x p4de.24xlarge (16 ranks, EFA): within 20%
    from 1 MiB to 2 GiB."""
    measured = _p4de_curve()
    cluster = {"node": "p4de.24xlarge", "nodes": 2}
    errors = {}
    for size, seconds in measured.items():
        if size >= 2**20:
            errors[size] = simulator.simulate_collective(cluster, "all_reduce", size) / seconds - 1
    assert max(abs(e) for e in errors.values()) < 0.20, errors
    # and the large-message bus bandwidth above the NIC rate comes from the tree algorithm
    assert collective_choice(cluster, "all_reduce", 2 * GiB).startswith("tree")


def test_flow_and_analytical_agree_for_a_collective_alone():
    for node, nodes, op in [("dgx-a100", 2, "all_reduce"), ("p4d.24xlarge", 4, "all_gather"),
                            ("p3.16xlarge", 1, "reduce_scatter"), ("g5.12xlarge", 2, "all_reduce")]:
        flow = simulator.simulate_collective({"node": node, "nodes": nodes}, op, 64 * 2**20)
        analytical = simulator.simulate_collective({"node": node, "nodes": nodes}, op, 64 * 2**20,
                                                   network="analytical")
        assert flow == pytest.approx(analytical, rel=1e-9), (node, op)


def _nic_bytes_per_node(node: str, nodes: int, algorithm: str) -> float:
    """Bytes per byte of D leaving node 0 through its NICs, from the collective plan."""
    from simulator.cluster import Router, build_cluster
    from simulator.cluster.collectives import CollectivePlanner
    from simulator.scenario import ClusterSpec

    cluster = build_cluster(ClusterSpec.model_validate({"node": node, "nodes": nodes}))
    plan = CollectivePlanner(cluster, Router(cluster)).plan("all_reduce", algorithm, tuple(range(cluster.world_size)))
    return sum(w for phase in plan.phases for link, w in phase.link_weights
               if cluster.links[link].tier == "nic-up" and cluster.links[link].node == 0)


def test_hierarchical_all_reduce_moves_less_over_the_network():
    """4 x dgx-a100 (N = 32, k = 4 nodes): a flat ring sends 2(N-1)/N * D = 1.9375 D per node
    per direction over its NICs, the hierarchical algorithm 2(k-1)/k * D = 1.5 D."""
    assert _nic_bytes_per_node("dgx-a100", 4, "ring") == pytest.approx(2 * 31 / 32, rel=1e-9)
    assert _nic_bytes_per_node("dgx-a100", 4, "hierarchical") == pytest.approx(2 * 3 / 4, rel=1e-9)
    # with a slow network (one 100 Gb/s NIC per node) that saving outweighs its two NVLink phases
    cluster = {"node": "p3dn.24xlarge", "nodes": 4}
    ring = simulator.simulate_collective(cluster, "all_reduce", GiB, "ring")
    hier = simulator.simulate_collective(cluster, "all_reduce", GiB, "hierarchical")
    assert hier < ring


def test_p3_hybrid_cube_mesh_rings_use_nvlink_bricks():
    """p3.16xlarge: each V100 has 6 NVLink bricks of 25 GB/s per direction; ring channels over
    Hamiltonian cycles of the mesh beat a PCIe-only g5 node by far."""
    p3 = simulator.simulate_collective({"node": "p3.16xlarge", "nodes": 1}, "all_reduce", GiB)
    g5 = simulator.simulate_collective({"node": "g5.48xlarge", "nodes": 1}, "all_reduce", GiB)
    assert p3 < g5 / 2


def test_tcp_is_slower_than_efa_at_the_same_line_rate():
    efa = simulator.simulate_collective({"node": "p3dn.24xlarge", "nodes": 4}, "all_reduce", GiB)
    tcp = simulator.simulate_collective(
        {"node": "p3dn.24xlarge", "nodes": 4, "fabric": {"transport": "ethernet-tcp"}}, "all_reduce", GiB)
    assert tcp > efa


@pytest.mark.parametrize("spec", [
    {"node": "dgx-a100", "nodes": 12, "fabric": {"oversubscription": 2, "nodes_per_leaf": 4}},
    {"node": "dgx-h100", "nodes": 12, "fabric": {"kind": "rail-optimized", "nodes_per_leaf": 4}},
    {"node": "p4d.24xlarge", "nodes": 6},
    {"node": "p5.48xlarge", "nodes": 6},
])
def test_phase_link_weights_equal_a_running_sum_over_routes(spec):
    """A phase's per-link bytes (summed over its flows' routes at once) equal, to the bit, the
    running sum flow by flow and link by link, and its arrays hold the same pairs: ring,
    tree and all-to-all plans of groups spanning nodes, on four fabrics."""
    clear_cluster_cache()
    setup = cluster_setup(ClusterSpec.model_validate(spec), default_catalog(), 3)
    n = setup.graph.world_size
    groups = [tuple(range(1, n, 8)), tuple(range(0, n, 5)), tuple(range(8, 24))]
    plans = [setup.planner.plan(op, algo, g) for g in groups
             for op, algo in (("all_reduce", "ring"), ("all_reduce", "tree"), ("all_to_all", "direct"))]
    assert len({p.phases[0].link_weights for p in plans}) == len(plans)  # distinct loads checked
    for plan in plans:
        for phase in plan.phases:
            running: dict[int, float] = {}
            for f in phase.flows:
                for link, frac in setup.router.route(f.src, f.dst).links:
                    running[link] = running.get(link, 0.0) + f.weight * frac
            assert phase.link_weights == tuple(sorted(running.items()))
            ids, weights = phase.arrays()
            assert list(zip(ids.tolist(), weights.tolist(), strict=True)) == list(phase.link_weights)
    clear_cluster_cache()
