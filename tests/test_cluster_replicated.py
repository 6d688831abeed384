"""Node interiors held once (simulator/cluster/links.py): a replicated graph reads as the graph
that copies node 0 into every node, link by link, and everything computed on it is the same."""

import numpy as np
import pytest

import simulator
from simulator.catalog import default_catalog
from simulator.cluster import builders, cache
from simulator.cluster.builders import build_cluster
from simulator.cluster.collectives import CollectivePlanner
from simulator.cluster.describe import summarize
from simulator.cluster.graph import ClusterGraph
from simulator.cluster.routing import Router
from simulator.engine import LinkClasses
from simulator.scenario import ClusterSpec

# node interiors of every kind (NVSwitch, NVLink mesh, PCIe, torus) on every built-in fabric,
# with a small switch radix where it gives several leaves and spines
CASES = [
    ("dgx-a100", 6, {}),
    ("dgx-a100", 6, {"switch_radix": 8}),
    ("p5.48xlarge", 4, {"kind": "rail-optimized", "switch_radix": 8}),
    ("p3dn.24xlarge", 4, {"kind": "single-switch"}),
    ("trn1.32xlarge", 4, {"kind": "torus", "dims": [2, 2]}),
    ("g5.48xlarge", 3, {"oversubscription": 2}),
]


def _graphs(node, nodes, fabric):
    spec = ClusterSpec.model_validate({"node": node, "nodes": nodes, "fabric": fabric})
    return build_cluster(spec), build_cluster(spec, replicated=True)


@pytest.mark.parametrize("node,nodes,fabric", CASES)
def test_a_replicated_graph_reads_as_the_copied_graph(node, nodes, fabric):
    """Every link (id, names, rates, slot, node), vertex, out-list, pair and per-node slot list
    of the replicated graph equals the copied graph's, and so does its topology summary; names
    outside the cluster are absent."""
    built, rep = _graphs(node, nodes, fabric)
    assert rep.replicated and not built.replicated
    assert len(rep.links) == len(built.links) and list(rep.links) == built.links
    assert rep.links[-1] == built.links[-1] and rep.links[2:9] == built.links[2:9]
    tail = rep.links.interior  # slices of the tail are the tail's own: the same links
    for a, b in [(tail, None), (tail + 3, tail + 9), (tail + 5, tail + 2), (tail - 2, tail + 4)]:
        assert rep.links[a:b] == built.links[a:b]
    assert len(rep.vertices) == len(built.vertices) and list(rep.vertices.items()) == list(built.vertices.items())
    for name in built.vertices:
        assert name in rep.vertices and rep.out_links(name) == built.out_links(name)
    for (a, b), i in built._pair.items():
        assert rep.link_id(a, b) == i and rep.link_between(a, b) == built.links[i]
    for n in range(nodes):
        assert rep.node_link_ids(n) == built.node_link_ids(n)
    assert rep.link_between("n0.gpu0", "n1.gpu0") is None
    assert summarize(rep) == summarize(built)  # dtsim topo's summary, networkx max flow included
    assert f"n{nodes}.gpu0" not in rep.vertices and "n0.nosuch" not in rep.vertices and 3 not in rep.vertices
    with pytest.raises(KeyError):
        rep.vertices[f"n{nodes}.gpu0"]
    with pytest.raises(KeyError):
        rep.link_id("n0.gpu0", f"n{nodes}.gpu0")


@pytest.mark.parametrize("node,nodes,fabric", CASES)
def test_routes_plans_and_link_classes_are_the_same(node, nodes, fabric):
    """Routes between every pair of GPUs and to the host, ring and tree plans over all GPUs
    (link weights and the shape the tuner sees), and link classes for blocks of 1 and 2 nodes
    are equal on both graphs, to the bit."""
    built, rep = _graphs(node, nodes, fabric)
    a, b = Router(built, seed=3), Router(rep, seed=3)
    world = built.world_size
    for s in range(world):
        assert a.route_to_host(s) == b.route_to_host(s) and a.route_from_host(s) == b.route_from_host(s)
        for d in range(world):
            assert a.route(s, d) == b.route(s, d)
    pa, pb = CollectivePlanner(built, a), CollectivePlanner(rep, b)
    everyone = tuple(range(world))
    for op, algorithm in (("all_reduce", "ring"), ("all_reduce", "tree"), ("all_gather", "ring")):
        x, y = pa.plan(op, algorithm, everyone), pb.plan(op, algorithm, everyone)
        assert x.ll128_ok == y.ll128_ok and x.shape(built) == y.shape(rep)
        assert [p.link_weights for p in x.phases] == [p.link_weights for p in y.phases]
    for block in (1, 2):
        if nodes % block:
            continue
        u, v = LinkClasses(built, block), LinkClasses(rep, block)
        for field in ("class_of", "block_of", "position_of", "size", "capacity"):
            assert np.array_equal(getattr(u, field), getattr(v, field)), field
        assert u.members == v.members and u.uniform == v.uniform
        for kinds in (frozenset({"infiniband", "efa"}), frozenset({"nvlink"}), frozenset({"pcie"})):
            assert np.array_equal(u.classes_of_kinds(kinds), v.classes_of_kinds(kinds))


def _gpt3(gpus):
    """GPT-3 175B, tp 8, pp 8, ZeRO-1 on DGX A100, 4 micro-batches per data-parallel replica
    (bench/bench_scale.py's case, shorter)."""
    return simulator.Scenario.model_validate({
        "model": "gpt3-175b", "cluster": {"node": "dgx-a100", "nodes": gpus // 8},
        "parallelism": {"tp": 8, "pp": 8, "sharding": "zero1"},
        "training": {"micro_batch": 1, "global_batch": 4 * (gpus // 64), "recompute": "full"}})


def test_a_simulate_on_a_replicated_cluster_gives_the_same_result(monkeypatch):
    """GPT-3 175B on 32 DGX A100 nodes: the whole Result (every field, links included) is the
    same whether the cached cluster holds its nodes once (above REPLICATE_ABOVE_NODES) or copies them."""
    sc = _gpt3(256)
    assert sc.cluster.n_nodes > cache.REPLICATE_ABOVE_NODES
    cache.clear_cluster_cache()
    replicated = simulator.simulate(sc)
    assert cache.cluster_setup(sc.cluster, default_catalog(), sc.sim.seed).graph.replicated
    cache.clear_cluster_cache()
    monkeypatch.setattr(cache, "REPLICATE_ABOVE_NODES", 10**9)
    copied = simulator.simulate(sc)
    assert not cache.cluster_setup(sc.cluster, default_catalog(), sc.sim.seed).graph.replicated
    cache.clear_cluster_cache()
    assert replicated.model_dump() == copied.model_dump()


def test_a_fresh_symmetric_simulate_builds_two_nodes_at_any_size(monkeypatch):
    """A fresh simulate of GPT-3 175B builds the same node interiors at 256 and at 4,096 GPUs
    (32 and 512 nodes): nodes 0 and 1 by the node builder (node 1 to check it is node 0
    renamed), no node copied, the rest derived from node 0 when read. Counts, never timings.
    A DGX A100 interior has 58 links: 8 GPUs x 2 (NVLink to the NVSwitch, both ways) + 8 GPUs
    x 2 (PCIe) + 8 NICs x 2 (PCIe) + 4 PCIe switches x 2 (to the CPU) + 1 x 2 (socket to socket)."""
    built: list[int] = []
    copied: list[int] = []
    nvswitch = builders.NODE_BUILDERS["nvswitch"]

    def counting(cluster, node):
        built.append(node)
        nvswitch(cluster, node)

    original_copy = ClusterGraph.copy_node

    def counting_copy(self, vertices, links, node):
        copied.append(node)
        original_copy(self, vertices, links, node)

    monkeypatch.setitem(builders.NODE_BUILDERS, "nvswitch", counting)
    monkeypatch.setattr(ClusterGraph, "copy_node", counting_copy)
    counts = {}
    for gpus in (256, 4096):
        built.clear()
        copied.clear()
        cache.clear_cluster_cache()
        simulator.simulate(_gpt3(gpus))
        graph = cache.cluster_setup(_gpt3(gpus).cluster, default_catalog(), 0).graph
        counts[gpus] = (list(built), list(copied), len(graph.links.template))
    cache.clear_cluster_cache()
    assert counts[256] == counts[4096] == ([0, 1], [], 58)


def test_a_measured_profile_rewrites_every_node_of_a_replicated_graph(tmp_path):
    """cluster.calibration with a measured 2-rank all-reduce (20 us + D / 100 GB/s) rescales the
    NVLink links of every node (simulator/cluster/comm_profile.py): a replicated graph keeps the
    rewritten links over its template, and reads, routes and classes as the copied graph does."""
    path = tmp_path / "measured.yaml"
    path.write_text("""
kind: dtsim-compute-profile
gpu: a100-80gb
calibrated: true
gemm: {bf16: {log10_flops: [9], efficiency: [0.5]}}
attention_fwd: {bf16: {log10_flops: [9], efficiency: [0.5]}}
attention_bwd: {bf16: {log10_flops: [9], efficiency: [0.5]}}
comm:
  all_reduce: {alpha: 2.0e-05, beta: 1.0e-11, ranks: 2, backend: nccl}
""")
    spec = ClusterSpec.model_validate({"node": "dgx-a100", "nodes": 4, "calibration": str(path)})
    built, rep = build_cluster(spec), build_cluster(spec, replicated=True)
    plain = build_cluster(ClusterSpec.model_validate({"node": "dgx-a100", "nodes": 4}))
    nvlink = [i for i, link in enumerate(plain.links) if link.tier == "nvlink"]
    assert all(built.links[i] != plain.links[i] for i in nvlink)  # the profile rewrote every node's NVLink
    assert rep.links.changed and list(rep.links) == built.links
    a, b = Router(built), Router(rep)
    assert all(a.route(s, d) == b.route(s, d) for s in range(32) for d in range(32))
    u, v = LinkClasses(built, 2), LinkClasses(rep, 2)
    assert np.array_equal(u.class_of, v.class_of) and np.array_equal(u.capacity, v.capacity)
