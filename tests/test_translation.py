"""Routes by translation (simulator/cluster/translation.py): a phase built from the routes of
the flows in the first translation period, moved, equals the phase routing every flow."""

from typing import Any

import pytest

import simulator
from simulator.catalog import default_catalog
from simulator.cluster.builders import build_cluster
from simulator.cluster.cache import clear_cluster_cache
from simulator.cluster.collectives import CollectivePlanner
from simulator.cluster.fabrics.leaf_spine import FatTree
from simulator.cluster.faults import apply_link_faults
from simulator.cluster.routing import Router
from simulator.cluster.translation import Translation
from simulator.scenario.faults import LinkFault

A100 = {"node": "dgx-a100"}
FABRICS: dict[str, dict[str, Any]] = {
    "fat-tree": {},  # radix 64: 32 ports down / 8 NICs = 4 nodes a leaf, 32 spines
    "rail": {"kind": "rail-optimized"},  # 32 nodes a rail-leaf, 32 spines
    "switch": {"kind": "single-switch"},
    "small-leaves": {"switch_radix": 16, "spines": 3},  # 1 node a leaf, 3 spines
}


def _scenario(nodes: int, fabric: dict[str, Any], node: str = "dgx-a100", pp: int = 2, **over: Any) -> Any:
    dp = nodes * 8 // (8 * pp)
    data: dict[str, Any] = {"model": "gpt3-1.3b", "cluster": {"node": node, "nodes": nodes, "fabric": fabric},
                            "parallelism": {"tp": 8, "pp": pp, "sharding": "zero1"},
                            "training": {"micro_batch": 1, "global_batch": 4 * dp}}
    data.update(over)
    return simulator.Scenario.model_validate(data)


def _planner(nodes: int, fabric: dict[str, Any], translate: bool, node: str = "dgx-a100") -> CollectivePlanner:
    cluster = build_cluster(_scenario(nodes, fabric, node).cluster, default_catalog(), replicated=nodes > 16)
    planner = CollectivePlanner(cluster, Router(cluster))
    planner.translate = translate
    return planner


@pytest.mark.parametrize(("fabric", "period"), [("fat-tree", 4), ("rail", 32), ("switch", 1), ("small-leaves", 3)])
def test_periods_by_hand(fabric: str, period: int) -> None:
    """Whole leaves, enough that D-mod-k (spine = destination NIC's index mod spines) picks
    the same spine: fat tree 4 nodes a leaf, 4 x 8 NICs = 32 = 0 mod 32 spines: 4; rail-optimised
    32 nodes a rail-leaf, 32 x 8 = 0 mod 32: 32; one switch: any node, 1; 1 node a leaf and
    3 spines: 8 NICs = 2 mod 3, so 3 leaves (24 = 0 mod 3): 3 (96 nodes: a multiple of all)."""
    cluster = _planner(96, FABRICS[fabric], True).cluster
    found = Translation.of(cluster)
    assert found is not None and found.period_nodes == period


def test_no_translation_for_ecmp_faults_or_partial_leaves() -> None:
    """ECMP hashes NIC names (no period); a degraded link breaks the symmetry; 6 nodes on leaves
    of 4 leave the last leaf half full; each routes every flow."""
    tcp = _planner(8, {"transport": "ethernet-tcp"}, True)
    assert tcp.cluster.transport.multipath == "ecmp" and tcp.translation is None
    faulty = build_cluster(_scenario(8, {}).cluster, default_catalog())
    apply_link_faults(faulty, [LinkFault(select="node=3 nic=0", bandwidth_factor=0.5)])
    assert Translation.of(faulty) is None
    assert _planner(6, {}, True).translation is None


def test_a_fabric_subclass_wiring_its_own_way_has_no_period() -> None:
    """The leaf-spine shift reads the layout its own builds make; a subclass with its own
    build (here the same wiring, but the fabric cannot know) routes every flow."""

    class Rewired(FatTree):
        def build(self, cluster: Any) -> None:
            super().build(cluster)

    cluster = _planner(8, {}, True).cluster
    assert cluster.scale_out is not None and cluster.scale_out.period_nodes(cluster) == 4
    rewired = Rewired(cluster.fabric)
    rewired.__dict__.update(vars(cluster.scale_out))
    assert rewired.period_nodes(cluster) is None


@pytest.mark.parametrize("fabric", list(FABRICS))
@pytest.mark.parametrize("nodes", [12, 96])
def test_plans_equal_routing_every_flow(fabric: str, nodes: int) -> None:
    """Ring and tree plans over data-parallel groups (GPU k of every node, every other node),
    one node's group and all-to-all: phases equal, weights to the bit, with fewer routes."""
    moved, full = _planner(nodes, FABRICS[fabric], True), _planner(nodes, FABRICS[fabric], False)
    assert moved.translation is not None  # 12 nodes on rail-leaves of 32: one leaf a rail, period 12
    half = nodes // 2 * 8  # groups starting there are moved plans of groups in the first period
    groups = [tuple(range(3, nodes * 8, 8)), tuple(range(5, nodes * 8, 16)), tuple(range(8, 16)),
              tuple(range(half + 1, nodes * 8, 8)), tuple(range(half + 2, nodes * 8, 24)),
              tuple(range(nodes * 8 - 8, nodes * 8)), (half + 9, half + 4, half + 30, half + 17)]
    for gpus in groups:
        for op, algorithm in [("all_reduce", "ring"), ("all_reduce", "tree"), ("all_gather", "ring"),
                              ("reduce_scatter", "ring"), ("all_to_all", "direct")]:
            if algorithm == "tree" and len({g // 8 for g in gpus}) == 1:
                continue
            assert moved.plan(op, algorithm, gpus) == full.plan(op, algorithm, gpus), (op, algorithm, gpus)
    if moved.translation.period_nodes < nodes:
        assert len(moved.router._routes) < len(full.router._routes)
        assert moved._moved("all_reduce", "ring", groups[3]) is not None  # a moved plan, compared above


def test_ring_routes_do_not_grow_with_the_cluster() -> None:
    """A ring all-reduce over GPU 0 of every node on the default fat tree (period 4 nodes):
    flows n -> n + 1 and the last back to node 0; moved into the first period, the sources
    are nodes 0..3, so 4 routes (0->1, 1->2, 2->3, 3->4) at 8 nodes (64 GPUs) and at 512 nodes
    (4,096 GPUs); routing every flow computes 8 and 512."""
    for nodes in (8, 512):
        gpus = tuple(range(0, nodes * 8, 8))
        moved, full = _planner(nodes, {}, True), _planner(nodes, {}, False)
        assert moved.plan("all_reduce", "ring", gpus) == full.plan("all_reduce", "ring", gpus)
        assert len(moved.router._routes) == 4 and len(full.router._routes) == nodes


@pytest.mark.parametrize(("nodes", "fabric", "node"), [(16, "fat-tree", "dgx-a100"), (64, "rail", "dgx-a100"),
                                                       (32, "switch", "dgx-h100"), (24, "small-leaves", "dgx-a100"),
                                                       (32, "fat-tree", "p4d.24xlarge")])
def test_results_equal_routing_every_flow(monkeypatch: pytest.MonkeyPatch, nodes: int, fabric: str,
                                          node: str) -> None:
    """A symmetric simulate (tp 8, pp 2, ZeRO-1) gives the same step time and breakdown as with
    every flow routed (p4d: EFA sprays over every spine, period one leaf)."""
    sc = _scenario(nodes, FABRICS[fabric], node)
    results = []
    for translate in (True, False):
        clear_cluster_cache()
        monkeypatch.setattr(CollectivePlanner, "translate", translate)
        results.append(simulator.simulate(sc))
    clear_cluster_cache()
    moved, full = results
    assert moved.step_time_s == full.step_time_s
    assert moved.breakdown == full.breakdown


def test_a_run_without_symmetry_is_the_same_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every rank simulated (sim.symmetry off) on 8 DGX A100 (period 4 nodes): the plans are the
    same to the bit, so the result is the one routing every flow gives."""
    sc = _scenario(8, {}, sim={"symmetry": "off"})
    results = []
    for translate in (True, False):
        clear_cluster_cache()
        monkeypatch.setattr(CollectivePlanner, "translate", translate)
        results.append(simulator.simulate(sc))
    clear_cluster_cache()
    assert results[0].step_time_s == results[1].step_time_s and results[0].breakdown == results[1].breakdown
