"""Clusters kept across runs (simulator/cluster/cache.py), nodes copied instead of rebuilt, and
mesh groups built without enumeration: none of it may change a result."""

import gc

import pytest

import simulator
from simulator import limits
from simulator.catalog import default_catalog
from simulator.cluster import Router, build_cluster, builders, cache
from simulator.cluster.cache import CACHE_SIZE, clear_cluster_cache, cluster_setup
from simulator.cluster.mesh import GROUPS, Mesh
from simulator.errors import ScenarioError
from simulator.scenario import ClusterSpec


def _gpt3(nodes: int) -> simulator.Scenario:
    """GPT-3 175B tp8 pp8 on DGX A100 nodes, 4 micro-batches per data-parallel replica."""
    return simulator.Scenario.model_validate({
        "model": "gpt3-175b", "cluster": {"node": "dgx-a100", "nodes": nodes},
        "parallelism": {"tp": 8, "pp": 8, "sharding": "zero1"},
        "training": {"micro_batch": 1, "global_batch": 4 * nodes // 8, "recompute": "full"}})


def _fsdp(nodes: int) -> simulator.Scenario:
    """Llama-3 8B FSDP on p5.48xlarge nodes, one sequence per GPU."""
    return simulator.Scenario.model_validate({
        "model": "llama3-8b", "cluster": {"node": "p5.48xlarge", "nodes": nodes}, "parallelism": {"sharding": "fsdp"},
        "training": {"micro_batch": 1, "global_batch": 8 * nodes, "recompute": "full"}})


# Step time, exposed communication and peak memory of these scenarios as simulated by commit
# fb3482d, before clusters were kept, nodes copied and groups built without enumeration, then
# moved once on purpose by the embedding's dense weight gradient (8fe0671: +0.12 ms on the
# gpt3 steps, 0.44 ms less exposed shard all-gather under FSDP), and on the p5 rows by p5's
# EFAv2 transport (efa-v2: 17 us, 7.4 us per message, LL128; 4 nodes -2.8 ms, 8 nodes -6.6 ms
# per step), and by NCCL's single-node LL ceiling (ring LL at llMaxBw inside a node: gpt3 steps
# +0.48 us, fsdp dp +2.4e-11 s). Not hand-derived: they pin
# that this machinery moves no result, at several cluster sizes.
BEFORE = {
    ("gpt3", 8): (2.70529429492688, {"tp": 0.09204718075500191, "pp": 0.018214388400000447}, 50410433024.0),
    ("gpt3", 16): (3.0731783584366976, {"tp": 0.09204718075500191, "dp": 0.3766428630772487,
                                        "pp": 0.0204513505333338}, 33482733056.0),
    ("gpt3", 64): (3.339044775969405, {"tp": 0.09204718075500191, "dp": 0.6608224314855295,
                                       "pp": 0.0204513505333338}, 20786958080.0),
    ("fsdp", 1): (1.2332304576608644, {"shard": 0.01012864183606245, "dp": 1.500009929067403e-05}, 26770694144.0),
    ("fsdp", 4): (1.2323420454179896, {"shard": 0.012496149072006997, "dp": 0.00012420008791202974}, 14725302272.0),
    ("fsdp", 8): (1.2364216737166, {"shard": 0.014084428280798174, "dp": 0.00017500013186810826}, 12717736960.0),
}
BUILD = {"gpt3": _gpt3, "fsdp": _fsdp}


def _key(result: simulator.Result) -> tuple:
    return result.step_time_s, dict(result.breakdown.exposed_comm_s), result.peak_memory_bytes


def test_symmetric_results_as_before_at_several_sizes_fresh_and_kept():
    """Each scenario fresh (cache emptied), then kept after every other size has run (the
    cache then holds, or has evicted and rebuilt, its cluster): both equal the numbers of the
    code before the cache, exactly."""
    clear_cluster_cache()
    fresh = {k: _key(simulator.simulate(BUILD[k[0]](k[1]))) for k in BEFORE}
    kept = {k: _key(simulator.simulate(BUILD[k[0]](k[1]))) for k in reversed(list(BEFORE))}
    for k, want in BEFORE.items():
        assert fresh[k] == want, k
        assert kept[k] == want, k


def test_kept_cluster_is_reused_and_the_cache_is_bounded():
    """The same (spec, catalog, seed) gives the same setup object; another seed another one;
    after CACHE_SIZE other clusters the first is rebuilt (least recently used out)."""
    clear_cluster_cache()
    catalog = default_catalog()
    spec = ClusterSpec.model_validate({"node": "dgx-a100", "nodes": 2})
    first = cluster_setup(spec, catalog, 0)
    assert cluster_setup(spec, catalog, 0) is first
    assert cluster_setup(spec, catalog, 1) is not first
    for nodes in range(3, 3 + CACHE_SIZE):
        cluster_setup(ClusterSpec.model_validate({"node": "dgx-a100", "nodes": nodes}), catalog, 0)
    assert cluster_setup(spec, catalog, 0) is not first
    clear_cluster_cache()


def test_the_cache_holds_at_most_cache_gpus(monkeypatch):
    """With room for 48 GPUs: a 16-GPU cluster is kept beside a 32-GPU one (48), dropped when a
    second 16-GPU one comes (64 > 48); a cluster larger than the bound is still kept alone."""
    clear_cluster_cache()
    monkeypatch.setattr(cache, "CACHE_GPUS", 48)
    catalog = default_catalog()
    small, big, other = (ClusterSpec.model_validate({"node": "dgx-a100", "nodes": n}) for n in (2, 4, 3))
    first = cluster_setup(small, catalog)
    cluster_setup(big, catalog)
    assert cluster_setup(small, catalog) is first  # 16 + 32 = 48 GPUs kept (small now the newest)
    cluster_setup(other, catalog)  # 32 + 16 + 24: the least recent (big) goes, 40 left
    assert [k[0] for k in cache._CACHE] == [small, other]
    huge = ClusterSpec.model_validate({"node": "dgx-a100", "nodes": 8})  # 64 GPUs
    assert cluster_setup(huge, catalog) is cluster_setup(huge, catalog)
    assert [k[0] for k in cache._CACHE] == [huge]
    clear_cluster_cache()


def test_limits_apply_to_a_kept_cluster():
    """A cluster kept from an earlier run is still refused when a lower limit is in force."""
    clear_cluster_cache()
    spec = ClusterSpec.model_validate({"node": "dgx-a100", "nodes": 4})  # 32 GPUs
    cluster_setup(spec, default_catalog(), 0)
    with limits.raised(world_size=16), pytest.raises(ScenarioError, match="GPUs"):
        cluster_setup(spec, default_catalog(), 0)
    clear_cluster_cache()


@pytest.mark.parametrize("node,nodes", [("dgx-a100", 5), ("p5.48xlarge", 3), ("p3dn.24xlarge", 4),
                                        ("trn1.32xlarge", 3), ("g5.48xlarge", 3)])
def test_copied_nodes_equal_built_nodes(node, nodes, monkeypatch):
    """Nodes 2.. copied from node 0 give the graph that building each node gives: the same
    vertices, links (ids, names, rates, slots), out-lists, pair index and slot counters."""
    spec = ClusterSpec.model_validate({"node": node, "nodes": nodes})
    copied = build_cluster(spec)
    monkeypatch.setattr(builders, "_renamed", lambda a, b: False)  # every node built by its builder
    built = build_cluster(spec)
    assert list(copied.vertices.items()) == list(built.vertices.items())
    assert copied.links == built.links
    assert copied._out == built._out and copied._pair == built._pair and copied._node_slots == built._node_slots


def test_a_node_builder_that_varies_is_not_copied(monkeypatch):
    """A registered builder whose node 1 differs from node 0 builds every node itself."""
    calls = []

    def odd(cluster, node):
        calls.append(node)
        builders.build_pcie_node(cluster, node)
        if node % 2:  # an extra socket link on odd nodes
            cluster.add_link(f"n{node}.cpu0", f"n{node}.gpu0", kind="pcie", bandwidth_bytes_per_s=1e9, efficiency=1.0,
                             latency_s=0.0, tier="pcie")

    monkeypatch.setitem(builders.NODE_BUILDERS, "pcie", odd)
    graph = build_cluster(ClusterSpec.model_validate({"node": "g5.48xlarge", "nodes": 4}))
    assert calls == [0, 1, 2, 3]
    per_node = [sum(1 for link in graph.links if link.node == n and link.tier == "pcie") for n in range(4)]
    assert per_node[1] == per_node[0] + 2 and per_node[3] == per_node[2] + 2  # the extra link, both ways


@pytest.mark.parametrize("sizes", [dict(tp=2, cp=2, pp=3, dp=4, shard_group_size=2), dict(dp=8),
                                   dict(tp=4, pp=2, dp=6, shard_group_size=3), dict(tp=2, cp=3, dp=4)])
def test_mesh_groups_are_the_ranks_sharing_the_other_coordinates(sizes):
    """A group is, by definition, every rank whose coordinates on the axes it does not vary
    equal the rank's own, in ascending order: checked against that definition on every rank."""
    mesh = Mesh.from_sizes(**sizes)
    for name, axes in GROUPS.items():
        fixed = [a for a, _ in mesh.axes if a not in axes]
        for rank in range(mesh.world):
            want = tuple(r for r in range(mesh.world)
                         if all(mesh.coord(r, a) == mesh.coord(rank, a) for a in fixed))
            assert mesh.group(rank, name) == want, (name, rank)


@pytest.mark.parametrize("spec", [
    {"node": "dgx-a100", "nodes": 40},  # two NICs per GPU pair, InfiniBand D-mod-k over spines
    {"node": "p5.48xlarge", "nodes": 6},  # EFA sprayed over every spine
    {"node": "dgx-h100", "nodes": 40, "fabric": {"kind": "rail-optimized"}},
    {"node": "dgx-a100", "nodes": 24, "fabric": {"kind": "fat-tree", "nodes_per_leaf": 4, "transport": "ethernet-tcp"}},
    {"node": "dgx-a100", "nodes": 12, "fabric": {"kind": "torus", "dims": [3, 4]}},
])
def test_routes_summed_in_parts_equal_the_general_sum(spec, monkeypatch):
    """Routes between nodes summed as node parts plus fabric equal, to the bit, the general
    sum over NIC pairs, flows and fabric paths (the router with the split switched off)."""
    graph = build_cluster(ClusterSpec.model_validate(spec))
    n = graph.world_size
    pairs = [(a, (a * 7 + 13) % n) for a in range(0, n, 3)]
    split = Router(graph, seed=5)
    want = {p: split.route(*p) for p in pairs}
    monkeypatch.setattr(Router, "_split_route", lambda self, *args: None)
    general = Router(graph, seed=5)
    assert {p: general.route(*p) for p in pairs} == want


def test_a_new_cluster_goes_straight_to_the_oldest_gc_generation():
    """Every link and vertex of a newly built setup's graph is in the collector's oldest
    generation (2) at once, so young-generation collections never rescan them; the cluster's
    objects are still tracked (a full collection sees them)."""
    setup = cache.new_setup(ClusterSpec.model_validate({"node": "dgx-a100", "nodes": 4}), default_catalog(), 0)
    oldest = {id(o) for o in gc.get_objects(generation=2)}
    assert all(id(link) in oldest for link in setup.graph.links)
    assert all(gc.is_tracked(link) for link in setup.graph.links)
