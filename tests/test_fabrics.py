"""Fabrics as registered kinds (builder + router), the torus (as a fabric and inside trn1
nodes), collective algorithms by name, and the Trainium nodes end to end."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Literal, get_args

import pytest
from pydantic import ValidationError

import simulator
from simulator.cluster import Router, build_cluster
from simulator.cluster.collective_algorithms import ALGORITHMS
from simulator.cluster.collectives import CollectivePlanner, nccl_model
from simulator.cluster.fabrics import FABRICS, Fabric, FabricPath, NicRef, add_nic_link, register_fabric
from simulator.cluster.fabrics.torus import dimension_order_hops, neighbours, snake_order
from simulator.cluster.graph import ClusterGraph, Vertex
from simulator.costs.collectives import collective_time_s
from simulator.scenario import ClusterSpec
from simulator.scenario.fabric import FABRIC_SPECS, FabricBase, FabricKind
from simulator.yamlio import error_from_validation

ROOT = Path(__file__).resolve().parents[1]


def cluster_spec(node: str, nodes: int, **fabric: Any) -> ClusterSpec:
    return ClusterSpec.model_validate({"node": node, "nodes": nodes, "fabric": fabric})


# -- registries ---------------------------------------------------------------------------


def test_fabric_registry_keys_are_the_kind_tags():
    assert set(FABRICS) == set(get_args(FabricKind)) == set(FABRIC_SPECS)
    for kind, model in FABRIC_SPECS.items():
        assert get_args(model.model_fields["kind"].annotation) == (kind,)


def test_collective_algorithms_are_registered_by_name(cli):
    assert list(ALGORITHMS) == ["ring", "tree", "nvls", "nvls_tree", "hierarchical", "direct", "chain", "deepep"]
    out = cli("collective", "--node", "p4d.24xlarge", "--algorithm", "bogus", "--sizes", "1MiB")
    assert out.exit_code == 2 and "ring, tree, nvls, nvls_tree, hierarchical, direct, chain" in out.output


def test_fabric_without_kind_is_a_fat_tree():
    spec = cluster_spec("p4d.24xlarge", 2, oversubscription=2.0)
    assert spec.fabric.kind == "fat-tree" and spec.fabric.label == "fat-tree 2:1"


@pytest.mark.parametrize(("fabric", "field", "owner"), [
    ({"kind": "torus", "dims": [2, 2], "oversubscription": 2.0}, "oversubscription", "fat-tree and rail-optimized"),
    ({"kind": "fat-tree", "dims": [2, 2]}, "dims", "torus"),
    ({"kind": "single-switch", "spines": 4}, "spines", "fat-tree and rail-optimized"),
])
def test_a_field_of_another_fabric_kind_is_an_error_naming_it(fabric, field, owner):
    with pytest.raises(ValidationError) as info:
        cluster_spec("p4d.24xlarge", 4, **fabric)
    error = error_from_validation(info.value)
    assert error.field == f"fabric.{field}"
    assert f"{field!r} is a field of {owner} fabrics, not of {fabric['kind']}" in error.message


def test_foreign_fabric_field_in_a_file_names_file_line_and_field(cli, tmp_path):
    path = tmp_path / "torus.yaml"
    path.write_text(textwrap.dedent("""\
        model: gpt3-125m
        cluster:
          node: p4d.24xlarge
          nodes: 4
          fabric:
            kind: torus
            dims: [2, 2]
            switch_radix: 32
        training: {micro_batch: 4, global_batch: 128}
        """))
    out = cli("run", path, "--quiet")
    assert out.exit_code == 2
    assert f"{path}:8" in out.output and "cluster.fabric.switch_radix" in out.output
    assert "is a field of fat-tree and rail-optimized fabrics, not of torus" in out.output


def test_torus_dims_must_multiply_to_the_node_count():
    with pytest.raises(simulator.ScenarioError, match=r"a 2 x 3 torus holds 6 nodes but cluster.nodes = 4") as info:
        cluster_spec("p4d.24xlarge", 4, kind="torus", dims=[2, 3])
    assert info.value.field == "cluster.fabric.dims"


# -- torus geometry -----------------------------------------------------------------------


def test_dimension_order_hops_by_hand():
    """4 x 4, row-major (i = 4 row + col). 0 = (0,0) -> 10 = (2,2): along dim 0 two steps
    either way (tie: +), rows 1, 2 -> points 4, 8; then dim 1 +1, +1 -> 9, 10: 4 hops.
    0 -> 15 = (3,3): dim 0 is 3 steps + or 1 step - -> 12 = (3,0); dim 1 one step - -> 15."""
    assert dimension_order_hops(0, 10, [4, 4]) == [4, 8, 9, 10]
    assert dimension_order_hops(0, 15, [4, 4]) == [12, 15]
    # 3D 2 x 3 x 4: 0 = (0,0,0) -> 23 = (1,2,3): dim0 +1 -> 12; dim1 2 steps + or 1 step - -> (1,2,0) = 20;
    # dim2 3 steps + or 1 step - -> (1,2,3) = 23
    assert dimension_order_hops(0, 23, [2, 3, 4]) == [12, 20, 23]


def test_neighbours_wrap_around():
    assert sorted(neighbours(0, [4, 4])) == [1, 3, 4, 12]  # right, left (wrap), down, up (wrap)
    assert sorted(neighbours(5, [4, 4])) == [1, 4, 6, 9]
    assert sorted(neighbours(0, [2, 2, 3])) == [1, 2, 3, 6]  # size-2 dimensions: one neighbour each


def test_torus_fabric_links_per_node():
    """3 x 4 torus of 12 nodes: every node router has 4 torus neighbours (2 per dimension,
    wrapping), one link each way: 12 x 4 directed torus links; 3 x 3 x 2 in 3D: 2 + 2 + 1."""
    c = build_cluster(cluster_spec("g5.12xlarge", 12, kind="torus", dims=[3, 4]))
    torus = [link for link in c.links if link.tier == "torus"]
    assert len(torus) == 12 * 4
    for node in range(12):
        out = {link.dst for link in c.out_links(f"torus{node}") if link.tier == "torus"}
        assert len(out) == 4
    assert {link.dst for link in c.out_links("torus0") if link.tier == "torus"} == {
        "torus1", "torus3", "torus4", "torus8"}
    c3 = build_cluster(cluster_spec("g5.12xlarge", 18, kind="torus", dims=[3, 3, 2]))
    assert all(sum(1 for link in c3.out_links(f"torus{n}") if link.tier == "torus") == 5 for n in range(18))


def test_torus_fabric_routes_in_dimension_order():
    """Node 0 = (0,0) -> node 6 = (1,2) on 3 x 4: dim 0 one hop to (1,0) = 4; dim 1 two steps
    either way (tie: +) -> 5, 6: three torus links, in that order."""
    c = build_cluster(cluster_spec("g5.12xlarge", 12, kind="torus", dims=[3, 4]))
    g = c.gpus_per_node
    route = Router(c).route(0, 6 * g)
    hops = [(c.links[i].src, c.links[i].dst) for i, _ in route.links if c.links[i].tier == "torus"]
    assert sorted(hops) == sorted([("torus0", "torus4"), ("torus4", "torus5"), ("torus5", "torus6")])
    assert route.hop_class == "net"


def test_p2p_time_on_a_torus_by_hand():
    """1 GiB from GPU 0 of node 0 to GPU 0 of node 4 on a 3 x 3 torus of p4d.24xlarge, torus
    links of 40 Gb/s = 5 GB/s, costed with NCCL's Simple protocol:

    * route (4 = (1,1)): GPU0 -> PCIe switch -> NIC0 (2 PCIe links, 0.1 us each), NIC uplink
      (EFA message latency 34 us + switch 1 us), torus (0,0)->(1,0)->(1,1) (2 hops, 1 us each),
      NIC downlink (0), NIC -> PCIe switch -> GPU (0.2 us): 0.4 + 35 + 2 = 37.4 us;
    * EFA's staged copy: the message goes in 512 KiB steps, above the 32 KiB staging threshold,
      so it costs the copy of 32 KiB at 1.2 GB/s: 32768 / 1.2e9 = 27.307 us (transports.yaml);
    * alpha = base 8.4 us + one network hop 14 us + 37.4 us + 27.307 us = 87.107 us (nccl.yaml,
      ring family);
    * beta: the bottleneck is a torus link, 5e9 B/s x EFA efficiency 0.91 = 4.55e9 B/s;
    * t = 87.107e-6 + 2**30 / 4.55e9 = 87.107e-6 + 0.2359882... s.
    """
    c = build_cluster(cluster_spec("p4d.24xlarge", 9, kind="torus", dims=[3, 3], link_bandwidth="40Gbps"))
    planner = CollectivePlanner(c, Router(c))
    plan = planner.plan("p2p", "direct", (0, 4 * 8))
    assert plan.phases[0].net_latency_s == pytest.approx(37.4e-6)
    seconds = collective_time_s(nccl_model(), plan.shape(c), "Simple", 2**30)
    alpha = 8.4e-6 + 14e-6 + 37.4e-6 + 32768 / 1.2e9
    assert seconds == pytest.approx(alpha + 2**30 / 4.55e9, rel=1e-12)


def test_collectives_run_on_a_torus_fabric():
    spec = cluster_spec("p4d.24xlarge", 4, kind="torus", dims=[2, 2])
    for algorithm in ("ring", "tree", "hierarchical"):
        assert simulator.simulate_collective(spec, "all_reduce", 2**26, algorithm) > 0


# -- Trainium -------------------------------------------------------------------------------


def test_trn1_node_is_a_4x4_neuronlink_torus():
    c = build_cluster(cluster_spec("trn1.32xlarge", 1))
    for chip in range(16):
        out = [link for link in c.out_links(f"n0.gpu{chip}") if link.kind == "neuronlink"]
        assert len(out) == 4 and all(link.bandwidth_bytes_per_s == 48 * 2**30 for link in out)
    assert c.node_type.nics.count == 8 and c.node_type.network_bytes_per_s == 100e9  # 800 Gb/s
    trn1n = build_cluster(cluster_spec("trn1n.32xlarge", 1))
    assert trn1n.node_type.network_bytes_per_s == 200e9  # 16 x 100 Gb/s = 1600 Gb/s
    assert c.gpu.memory_bytes == 32 * 2**30 and c.gpu.peak_flops_per_s("bf16") == 190e12


def test_trn1_routes_between_chips_follow_dimension_order():
    """0 -> 15 on the 4 x 4 chip torus: 0 -> 12 -> 15 (see the hop test), NeuronLink only."""
    c = build_cluster(cluster_spec("trn1.32xlarge", 1))
    route = Router(c).route(0, 15)
    assert route.hop_class == "nvlink"
    assert sorted((c.links[i].src, c.links[i].dst) for i, _ in route.links) == [
        ("n0.gpu0", "n0.gpu12"), ("n0.gpu12", "n0.gpu15")]
    assert len(Router(c).route(0, 10).links) == 4


def test_trn1_rings_use_torus_neighbours():
    c = build_cluster(cluster_spec("trn1.32xlarge", 1))
    assert snake_order([4, 4]) == [0, 1, 2, 3, 7, 6, 5, 4, 8, 9, 10, 11, 15, 14, 13, 12]
    plan = CollectivePlanner(c, Router(c)).plan("all_reduce", "ring", tuple(range(16)))
    assert {c.links[i].kind for i, _ in plan.phases[0].link_weights} == {"neuronlink"}
    for flow in plan.phases[0].flows:
        assert flow.dst in neighbours(flow.src, [4, 4])


def test_scenario_on_four_trn1_runs():
    sc = simulator.Scenario.model_validate({
        "model": "llama2-7b",
        "cluster": {"node": "trn1.32xlarge", "nodes": 4},
        "parallelism": {"tp": 8, "sequence_parallel": True, "sharding": "zero1"},
        "training": {"micro_batch": 1, "global_batch": 64, "recompute": "selective"},
    })
    result = simulator.simulate(sc)
    assert result.world_size == 64 and not result.oom
    assert result.step_time_s > 0 and 0 < result.mfu < 1


def test_topo_trn1_prints_the_torus():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", "from simulator.cli import main; main()", "topo", "trn1.32xlarge",
                          "--nodes", "2"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "4 x 4 torus of trainium1" in out.stdout and "gpu15" in out.stdout and "neuronlink" in out.stdout


# -- a fabric registered from outside the package -----------------------------------------


class LineFabric(FabricBase):
    kind: Literal["toy-line"] = "toy-line"


class ToyLine(Fabric):
    """Node routers in a line (no wraparound); routes walk the line."""

    def build(self, cluster: ClusterGraph) -> None:
        self.nic: dict[NicRef, tuple[int, int]] = {}
        for node in range(cluster.n_nodes):
            cluster.add_vertex(Vertex(f"line{node}", "switch", None, f"line{node}"))
            for j, nic in enumerate(cluster.nics_of_node(node)):
                self.nic[(node, j)] = add_nic_link(cluster, nic, f"line{node}", None)
            if node:
                cluster.add_link(f"line{node - 1}", f"line{node}", kind="efa", bandwidth_bytes_per_s=10e9,
                                 efficiency=1.0, latency_s=0.0, tier="line")

    def paths(self, cluster: ClusterGraph, src: NicRef, dst: NicRef, flow: int, seed: int) -> list[FabricPath]:
        step = 1 if dst[0] > src[0] else -1
        hops = [cluster.link_id(f"line{n}", f"line{n + step}") for n in range(src[0], dst[0], step)]
        return [([self.nic[src][0], *hops, self.nic[dst][1]], 1.0)]


def test_a_fabric_registered_from_outside_builds_and_routes():
    """Registration alone: the spec model (a FabricBase with its own kind tag) and the Fabric
    live in this test; a validated cluster spec takes the toy fabric by model_copy (the
    scenario file format itself lists its kinds in FabricSpec)."""
    register_fabric("toy-line")(ToyLine)
    try:
        spec = cluster_spec("p4d.24xlarge", 3).model_copy(update={"fabric": LineFabric()})
        c = build_cluster(spec)
        assert isinstance(c.scale_out, ToyLine) and "toy-line" in c.description
        route = Router(c).route(0, 2 * 8)
        assert [c.links[i].dst for i, _ in route.links if c.links[i].tier == "line"] == ["line1", "line2"]
        assert simulator.simulate_collective(spec, "all_reduce", 2**24, "ring") > 0
    finally:
        FABRICS.pop("toy-line")


@pytest.mark.parametrize("spec", [
    {"node": "dgx-a100", "nodes": 12, "fabric": {"nodes_per_leaf": 4, "spines": 3}},
    {"node": "dgx-h100", "nodes": 6, "fabric": {"kind": "rail-optimized", "nodes_per_leaf": 2, "spines": 5}},
])
def test_a_chosen_spine_pair_is_that_entry_of_the_leaf_pairs_spine_list(spec):
    """D-mod-k and ECMP pick one spine by index; the pair of links found for that index alone
    equals the index-th entry of the full list of the leaf pair's spine paths, for every pair
    of leaves and every index (3 leaves x 3 spines; 8 rails x 3 leaves x 5 spines)."""
    graph = build_cluster(ClusterSpec.model_validate(spec))
    fabric = graph.scale_out
    leaves = sorted(set(fabric.nic_leaf.values()))
    checked = 0
    for a in leaves:
        for b in leaves:
            if a == b:
                continue
            full = fabric._spines(graph, a, b)
            assert [fabric._spine_pair(graph, a, b, i) for i in range(len(full))] == full
            checked += len(full)
    assert checked == len(leaves) * (len(leaves) - 1) * len(fabric.leaf_spines[leaves[0]])
