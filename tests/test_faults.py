"""faults: stragglers, jitter and degraded or failed links inside one iteration (issue 16)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import SCENARIOS, small_scenario

import simulator
from simulator.catalog import default_catalog
from simulator.cluster import Router, build_cluster
from simulator.cluster.collectives import CollectivePlanner, nccl_model
from simulator.cluster.faults import apply_link_faults
from simulator.cluster.routing import NoPathError
from simulator.engine import CommResolver, LinkClasses, run_program
from simulator.errors import InfeasibleError, ScenarioError
from simulator.ir import CommOp, ProgramBuilder
from simulator.scenario import ClusterSpec, Scenario, scenario_from_mapping
from simulator.scenario.faults import FaultsSpec, LinkFault, parse_selector
from simulator.workload.perturb import lognormal_factors

MiB = 2**20


def _quick(nodes: int = 1, **faults: Any) -> Scenario:
    """The quick-start DDP job on ``nodes`` p4d nodes, overlap slowdown 0 (compute beside a
    collective runs at full speed, so a rank's compute is exactly the sum of its kernels)."""
    return simulator.load_scenario(SCENARIOS / "quickstart.yaml", overrides=[
        f"cluster.nodes={nodes}", f"training.global_batch={64 * nodes}", "sim.overlap_slowdown=0"]
    ).model_copy(update={"faults": FaultsSpec.model_validate(faults)})


def test_one_rank_1_5x_slower_in_pure_data_parallelism_makes_the_step_1_5x() -> None:
    """Pure DDP on one p4d (dp 8). Healthy: every rank computes C, the step is C + e, e the
    exposed tail of the last gradient bucket (0.3% of the step). Rank 3 at slowdown 1.5
    computes 1.5 C; every other rank waits for it at each bucket's all-reduce, so the step is
    1.5 C + e' with e' the same kind of tail: step'/step = (1.5 C + e')/(C + e) = 1.5 within
    e/step. Rank 3 is the critical rank, and symmetry is off with all 8 ranks simulated."""
    healthy = simulator.simulate(_quick())
    slow = simulator.simulate(_quick(stragglers=[{"ranks": [3], "slowdown": 1.5}]))
    c, step = healthy.breakdown.compute_s, healthy.step_time_s
    assert step - c < 0.004 * step  # communication is (almost) all hidden
    assert slow.breakdown.rank == 3
    assert slow.breakdown.compute_s == pytest.approx(1.5 * c, rel=1e-12)
    assert slow.step_time_s / step == pytest.approx(1.5, rel=0.004)
    assert slow.step_time_s == pytest.approx(slow.breakdown.compute_s + slow.breakdown.exposed_comm_total_s, rel=1e-9)
    assert healthy.faults is None and healthy.engine["simulated_ranks"] == 1
    assert slow.faults is not None and slow.faults.simulated_individually == "0-7"
    assert slow.faults.stragglers == {3: 1.5} and "ranks 0 and 3 of stage 0 differ" in slow.faults.symmetry
    # a healthy rank computes C and idles while it waits for rank 3
    others = [b for b in slow.stage_breakdown if b.rank != 3]
    assert not others or all(b.compute_s == pytest.approx(c, rel=1e-12) for b in others)


def test_a_slow_node_is_its_ranks() -> None:
    """nodes: [0] on a one-node cluster slows all 8 ranks by 2: every compute task takes 2x, so
    the step is 2 C + e exactly as if every rank were listed."""
    by_node = simulator.simulate(_quick(stragglers=[{"nodes": [0], "slowdown": 2}]))
    by_rank = simulator.simulate(_quick(stragglers=[{"ranks": list(range(8)), "slowdown": 2}]))
    assert by_node.step_time_s == by_rank.step_time_s
    assert by_node.faults is not None and by_node.faults.stragglers == {r: 2.0 for r in range(8)}


def _all_reduce_s(spec: ClusterSpec, faults: list[LinkFault], nbytes: float) -> float:
    graph = build_cluster(spec, default_catalog())
    apply_link_faults(graph, faults)
    resolver = CommResolver(graph, CollectivePlanner(graph, Router(graph)), LinkClasses(graph, None),
                            nccl_model(graph.nccl), block_ranks=None)
    group = tuple(range(graph.world_size))
    pb = ProgramBuilder()
    pb.add(0, "comm", "all_reduce", "dp", comm=CommOp("all_reduce", group, float(nbytes), "dp", (group,), "ring"))
    return run_program(pb.build((0,), {0: 1}, {0: {}}), resolver).makespan_s


@pytest.mark.parametrize(("nodes", "select"), [(1, "gpu=3 kind=nvlink"), (4, "node=1 nic=0")])
def test_halving_one_link_of_a_ring_doubles_its_bandwidth_term(nodes: int, select: str) -> None:
    """Ring all-reduce of S bytes: T = latency + 2 (n-1)/n S / B, B the bottleneck link's rate.
    The bandwidth term is T(1 GiB) - T(256 MiB) (latency cancels). Halving one link the ring
    crosses (GPU 3's NVLink port on one node; NIC 0 of node 1, whose channel then runs at half
    rate) halves B: the bandwidth term doubles, exactly."""
    spec = ClusterSpec.model_validate({"node": "p4d.24xlarge", "nodes": nodes})
    half = [LinkFault(select=select, bandwidth_factor=0.5)]
    healthy = _all_reduce_s(spec, [], 1024 * MiB) - _all_reduce_s(spec, [], 256 * MiB)
    degraded = _all_reduce_s(spec, half, 1024 * MiB) - _all_reduce_s(spec, half, 256 * MiB)
    assert degraded / healthy == pytest.approx(2.0, rel=1e-9)


def test_a_link_off_the_bottleneck_does_not_matter_and_latency_adds() -> None:
    """On 4 nodes the ring is bound by the NICs (50 GB/s per node of EFA against 300 GB/s of
    NVLink per GPU): halving every GPU 3's NVLink port leaves the ring's time unchanged."""
    spec = ClusterSpec.model_validate({"node": "p4d.24xlarge", "nodes": 4})
    healthy = _all_reduce_s(spec, [], 1024 * MiB)
    assert _all_reduce_s(spec, [LinkFault(select="gpu=3 kind=nvlink", bandwidth_factor=0.5)], 1024 * MiB) == healthy
    slower = _all_reduce_s(spec, [LinkFault(select="node=1 nic=0", latency_add=1e-3)], 8)
    assert slower > _all_reduce_s(spec, [], 8) + 1e-3  # a latency-bound all-reduce crosses it at least once


def test_a_failed_link_is_routed_around_where_the_fabric_has_another_path() -> None:
    """GPU 3's NVLink port failed: its peers reach it over PCIe (route hop class pcie), slower
    but finite. NIC 0 of node 1 failed: its GPUs' traffic takes the node's other NICs. Every
    NIC uplink of node 1 failed: node 1 is cut off, an error naming faults.links."""
    one = ClusterSpec.model_validate({"node": "p4d.24xlarge", "nodes": 1})
    graph = build_cluster(one, default_catalog())
    apply_link_faults(graph, [LinkFault(select="gpu=3 kind=nvlink", bandwidth_factor=0)])
    route = Router(graph).route(3, 4)
    assert route.hop_class == "pcie" and all(graph.links[i].bandwidth_bytes_per_s > 0 for i, _ in route.links)
    failed = _all_reduce_s(one, [LinkFault(select="gpu=3 kind=nvlink", bandwidth_factor=0)], 1024 * MiB)
    assert np.isfinite(failed) and failed > _all_reduce_s(one, [], 1024 * MiB)
    four = ClusterSpec.model_validate({"node": "p4d.24xlarge", "nodes": 4})
    assert np.isfinite(_all_reduce_s(four, [LinkFault(select="node=1 nic=0", bandwidth_factor=0)], 1024 * MiB))
    with pytest.raises(NoPathError, match="no path") as info:
        _all_reduce_s(four, [LinkFault(select="node=1 tier=nic-up", bandwidth_factor=0)], 1024 * MiB)
    assert info.value.field == "faults.links"


def test_jitter_is_deterministic_per_seed_and_has_the_asked_mean_and_spread() -> None:
    """Same seed, same iteration; another seed, another; cv 0 is the healthy run. The
    lognormal factors: mean 1 and coefficient of variation cv (checked on 200,000 draws of
    cv 0.1: standard error of the mean 0.1/sqrt(2e5) = 2.2e-4)."""
    a = simulator.simulate(_quick(jitter={"compute_cv": 0.05, "seed": 1}))
    b = simulator.simulate(_quick(jitter={"compute_cv": 0.05, "seed": 1}))
    c = simulator.simulate(_quick(jitter={"compute_cv": 0.05, "seed": 2}))
    assert a.step_time_s == b.step_time_s != c.step_time_s
    assert simulator.simulate(_quick(jitter={"compute_cv": 0.0})).step_time_s == simulator.simulate(_quick()).step_time_s
    draws = lognormal_factors(np.random.default_rng(0), np.full(200_000, 0.1))
    assert draws.mean() == pytest.approx(1.0, abs=1e-3)
    assert draws.std() / draws.mean() == pytest.approx(0.1, rel=0.01)


def test_samples_report_the_distribution_and_the_slowest_rank() -> None:
    """5 seeded iterations (seeds 4..8) of a straggler at 1.3x with 1% jitter: rank 5's compute
    is 1.3x everyone's, far beyond what 1% jitter moves, so it is the slowest in all 5; the
    mean, p50 and p99 are numpy's of the 5 step times, and sample 0 is the Result's own step."""
    sc = _quick(stragglers=[{"ranks": [5], "slowdown": 1.3}], jitter={"compute_cv": 0.01, "seed": 4})
    sc = sc.model_copy(update={"sim": sc.sim.model_copy(update={"samples": 5})})
    result = simulator.simulate(sc)
    s = result.faults.samples if result.faults else None
    assert s is not None and s.seeds == [4, 5, 6, 7, 8] and len(set(s.step_times_s)) == 5
    assert s.step_times_s[0] == result.step_time_s
    assert (s.mean_s, s.p50_s, s.p99_s) == (np.mean(s.step_times_s), np.percentile(s.step_times_s, 50),
                                            np.percentile(s.step_times_s, 99))
    assert s.slowest_rank == [5] * 5 and s.slowest_counts == {5: 5}
    assert all(x / m == pytest.approx(1.3, rel=0.03) for x, m in zip(s.slowest_compute_s, s.median_compute_s, strict=True))


@pytest.mark.parametrize(("select", "message"), [
    ("", "empty selector"), ("node3", "cannot read 'node3'"), ("nod=3", "unknown key 'nod'"),
    ("node=x", "node takes whole numbers"), ("node=1 node=2", "'node' given twice"),
])
def test_bad_selectors_are_refused_with_the_reason(select: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_selector(select)


def test_errors_name_the_field() -> None:
    """A selector naming a node outside the cluster, a straggler rank outside it, both ranks and
    nodes, samples without jitter: each is bad input naming its field. A selector that matches
    no link of the built cluster names its field when the run builds the graph."""
    def error(faults: dict[str, Any], **over: Any) -> ScenarioError:
        with pytest.raises(ScenarioError) as info:
            scenario_from_mapping(small_scenario(faults=faults, **over))
        return info.value

    assert "faults.links[0].select" in str(error({"links": [{"select": "node=2 nic=0", "bandwidth_factor": 0.5}]}))
    assert "faults.stragglers[0].ranks" in str(error({"stragglers": [{"ranks": [16], "slowdown": 2}]}))
    assert "exactly one of ranks or nodes" in str(error({"stragglers": [{"ranks": [1], "nodes": [0], "slowdown": 2}]}))
    assert "unknown key" in str(error({"links": [{"select": "nod=1"}]}))
    samples = error({}, sim={"samples": 3})
    assert isinstance(samples, InfeasibleError) and samples.field == "sim.samples"
    nothing = scenario_from_mapping(small_scenario(faults={"links": [{"select": "tier=leaf-up", "bandwidth_factor": 0.5}]}))
    with pytest.raises(ScenarioError, match="matches no link") as info:
        simulator.simulate(nothing)
    assert info.value.field == "faults.links[0].select"


def test_dtsim_run_prints_the_faults_and_samples_lines(cli: Any, tmp_path: Path) -> None:
    """The shipped straggler scenario (4 p4d, rank 3 at 1.5x, NIC 0 of node 1 at half rate, 10
    jittered samples), shortened to 3 samples: the summary names the perturbations, the ranks
    simulated individually, the distribution and rank 3 as the slowest; a selector matching
    nothing exits 2 with the file and field."""
    path = SCENARIOS / "straggler-ddp-p4d.yaml"
    out = cli("run", path, "--set", "sim.samples=3")
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    for words in ("ranks simulated individually: 0-31", "rank 3 compute x1.5", "bandwidth x0.5, latency +5 us",
                  "3 iterations (jitter seeds 7..9)", "slowest rank │ rank 3 in 3 of 3 samples"):
        assert words in text, words
    nowhere = tmp_path / "nowhere.yaml"
    nowhere.write_text(path.read_text().replace("select: node=1 nic=0", "select: tier=leaf-up"))
    bad = cli("run", nowhere)
    assert bad.exit_code == 2 and "nowhere.yaml" in bad.output and "faults.links[0].select" in bad.output
    assert "Traceback" not in bad.output


def test_the_trace_marks_the_straggler_and_the_degraded_link(tmp_path: Path) -> None:
    """4 p4d with rank 3 at 1.5x and NIC 0 of node 1 at half rate: rank 3 carries an instant
    'straggler: compute x1.5' and a labelled process; both directions of the NIC's cable carry
    a global link marker; otherData.faults says all 32 ranks were simulated individually."""
    from simulator.results.export.chrome import trace_document

    sc = _quick(4, stragglers=[{"ranks": [3], "slowdown": 1.5}],
                links=[{"select": "node=1 nic=0", "bandwidth_factor": 0.5, "latency_add": 5e-6}])
    doc = trace_document(simulator.run_simulation(sc), ranks=[0, 3])
    faults = [e for e in doc["traceEvents"] if e.get("cat") == "fault"]
    assert [(e["pid"], e["name"]) for e in faults if e["s"] == "p"] == [(3, "straggler: compute x1.5")]
    assert sorted(e["name"] for e in faults if e["s"] == "g") == [
        "link leaf0->n1.nic0: bandwidth x0.5, latency +5 us", "link n1.nic0->leaf0: bandwidth x0.5, latency +5 us"]
    labels = {e["pid"]: e["args"]["labels"] for e in doc["traceEvents"] if e["name"] == "process_labels"}
    assert labels[3].endswith("straggler x1.5") and "straggler" not in labels[0]
    assert doc["otherData"]["faults"]["simulated_individually"] == "0-31"


def test_a_selector_outside_the_cluster_names_file_line_and_field(cli: Any, tmp_path: Path) -> None:
    """The second link fault names node 7 of a 2-node cluster: exit 2, one line with the file,
    the line of that list item (8) and the field faults.links[1].select."""
    path = tmp_path / "bad.yaml"
    path.write_text("model: gpt3-125m\ncluster: {node: p4d.24xlarge, nodes: 2}\n"
                    "training: {micro_batch: 4, global_batch: 128}\nfaults:\n  links:\n"
                    "    - select: node=1 nic=0\n      bandwidth_factor: 0.5\n"
                    "    - select: node=7 nic=0\n      bandwidth_factor: 0.5\n")
    out = cli("run", path)
    assert out.exit_code == 2
    assert out.output.strip() == f"error: {path}:8: faults.links[1].select: node=7 is outside the cluster (0..1)"
