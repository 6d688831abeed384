"""Chrome/Perfetto trace export: hand-checked events, validity, agreement with the Result."""

from __future__ import annotations

import gzip
import itertools
import json
import re
from collections import defaultdict
from typing import Any

import numpy as np
import pytest
from trace_checks import MS, slices_of, synthetic_result, trace_problems, union_us

import simulator
from simulator.errors import ScenarioError
from simulator.results.export import (
    MEMORY_COUNTER,
    MEMORY_TOTAL_COUNTER,
    assign_lanes,
    trace_document,
    write_trace,
)
from simulator.results.link_load import LinkLoad
from simulator.results.ranks import format_rank_ranges, select_ranks
from simulator.results.rows import expand_fused
from simulator.units import GiB

QUICKSTART = "scenarios/quickstart.yaml"
PIPELINE = ["parallelism.tp=2", "parallelism.pp=2"]  # 32 GPUs: tp 2 x pp 2 x dp 8, 8 micro-batches
OOM = ["training.micro_batch=16", "training.global_batch=512"]  # GPT-3 XL, 16 x 2048 tokens on a 40 GB A100


def _simulate(overrides: list[str]) -> Any:
    return simulator.simulate(simulator.load_scenario(QUICKSTART, overrides=overrides), record_series=True)


@pytest.fixture(scope="module")
def quickstart() -> Any:
    return _simulate([])


@pytest.fixture(scope="module")
def pipeline() -> Any:
    return _simulate(PIPELINE)


@pytest.fixture(scope="module")
def oom() -> Any:
    return _simulate(OOM)


@pytest.fixture(scope="module")
def synthetic() -> Any:
    return synthetic_result()


def _by(doc: dict[str, Any], ph: str) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e["ph"] == ph]


def _thread_names(doc: dict[str, Any], pid: int) -> dict[int, str]:
    return {e["tid"]: e["args"]["name"] for e in _by(doc, "M") if e["name"] == "thread_name" and e["pid"] == pid}


# -- hand-made result: every number below is derived in trace_checks.synthetic_result --------


def test_synthetic_breakdown_is_what_the_rows_say(synthetic: Any) -> None:
    # rank 0: compute [0,1]+[1.5,3] = 2.5 ms; pp [1,1.5] exposed 0.5 ms; dp [2,5] minus compute = [3,5] = 2 ms
    b = synthetic.breakdown
    assert b.rank == 0 and synthetic.step_time_s == pytest.approx(5 * MS)
    assert b.compute_s == pytest.approx(2.5 * MS)
    assert b.exposed_comm_s == pytest.approx({"pp": 0.5 * MS, "dp": 2 * MS})


def test_synthetic_processes_threads_and_lanes(synthetic: Any) -> None:
    doc = trace_document(synthetic)
    names = {e["pid"]: e["args"]["name"] for e in _by(doc, "M") if e["name"] == "process_name"}
    assert names[0] == "rank 0 (node 0 GPU 0) for 2 ranks: stage 0, ranks 0,2"
    assert names[1] == "rank 1 (node 0 GPU 1) for 2 ranks: stage 1, ranks 1,3"
    assert names[4].startswith("network")  # pid = world size, not a rank
    # the two dp all-reduces overlap in [3, 4] ms: the second goes to its own thread
    assert _thread_names(doc, 0) == {1: "iteration", 2: "compute", 3: "dp", 4: "dp #2", 5: "pp.send.act"}
    assert _thread_names(doc, 1) == {1: "iteration", 2: "compute", 3: "pp.recv.act"}
    sort = {e["pid"]: e["args"]["sort_index"] for e in _by(doc, "M") if e["name"] == "process_sort_index"}
    assert sort[0] == 0 and sort[1] == 1
    assert trace_problems(doc) == []


def test_synthetic_slices_carry_times_and_details(synthetic: Any) -> None:
    doc = trace_document(synthetic, step=7)
    x = {(e["pid"], e["name"]): e for e in _by(doc, "X")}
    step = x[(0, "ProfilerStep#7")]
    assert (step["ts"], step["dur"], step["tid"]) == (0.0, 5000.0, 1)
    f0 = x[(0, "f0")]
    assert (f0["ts"], f0["dur"], f0["tid"]) == (0.0, 1000.0, 2)
    assert f0["args"] == {"category": "compute", "phase": "fwd", "micro_batch": 0, "layer": 0, "flops": 2e11,
                          "achieved_tflop_per_s": 200.0}  # 2e11 FLOP / 1 ms
    assert x[(0, "b0")]["args"]["achieved_tflop_per_s"] == 300.0  # 4.5e11 FLOP / 1.5 ms
    send = x[(0, "send.act")]["args"]
    # 1 MB in 0.5 ms = 2 GB/s; alone it would take 0.25 ms, so it ran 2x slower
    assert (send["op"], send["bytes"], send["group_size"], send["group"]) == ("p2p", 1e6, 2, "0-1")
    assert (send["algbw_GB_per_s"], send["alone_us"], send["slowdown_vs_alone"]) == (2.0, 250.0, 2.0)
    assert (x[(0, "ar1")]["tid"], x[(0, "ar2")]["tid"]) == (3, 4)
    assert (x[(0, "ar2")]["args"]["algorithm"], x[(0, "ar2")]["args"]["protocol"]) == ("ring", "LL128")


def test_synthetic_flow_goes_from_send_to_recv(synthetic: Any) -> None:
    doc = trace_document(synthetic)
    (start,), (end,) = _by(doc, "s"), _by(doc, "f")
    assert (start["pid"], start["tid"], start["ts"]) == (0, 5, 1250.0)  # middle of send.act on pp.send.act
    assert (end["pid"], end["tid"], end["ts"], end["bp"]) == (1, 3, 1250.0, "e")  # middle of recv.act
    assert start["id"] == end["id"] and start["cat"] == end["cat"] == "p2p"
    # with only one end traced, no arrow
    assert _by(trace_document(synthetic, ranks=[0]), "f") == []


def test_synthetic_counters(synthetic: Any) -> None:
    doc = trace_document(synthetic)
    memory = [(e["ts"], e["args"]) for e in _by(doc, "C") if e["pid"] == 0 and e["name"] == MEMORY_COUNTER]
    assert [(ts, a["params"], a["activations"]) for ts, a in memory] == [
        (0.0, 1.0, 0.0), (1000.0, 1.0, 0.5), (3000.0, 1.0, 0.0)]
    totals = [(e["ts"], e["args"]["total"]) for e in _by(doc, "C") if e["pid"] == 1 and e["name"] == MEMORY_TOTAL_COUNTER]
    assert totals == [(0.0, 1.0), (2000.0, 2.5)]
    (oom,) = _by(doc, "i")  # rank 1 exceeds its 2 GiB when f1 allocates 1.5 GiB at 2 ms
    assert (oom["pid"], oom["ts"], oom["args"]["peak_GiB"], oom["args"]["capacity_GiB"]) == (1, 2000.0, 2.5, 2.0)
    link = [(e["ts"], e["args"]) for e in _by(doc, "C") if e["pid"] == 4]
    assert link == [(1000.0, {"utilisation [%]": 2.0}), (1500.0, {"utilisation [%]": 0.0})]  # 2 of 100 GB/s


def test_metadata_names_the_run(synthetic: Any) -> None:
    meta = trace_document(synthetic, ranks=[2])["otherData"]
    assert meta["simulator_version"] == "test" and meta["scenario_hash"] == "0" * 64
    assert meta["calibration"] == "none" and meta["ranks_traced"] == "0"
    assert meta["simulated_rank_stands_for"] == {"0": "0,2"}


# -- helpers -------------------------------------------------------------------------------


def test_assign_lanes() -> None:
    # touching spans share a lane; a span inside a busy lane opens the next free one
    assert assign_lanes([(0, 2), (2, 3), (1, 4), (3, 5), (1.5, 1.6)]) == [0, 0, 1, 0, 2]
    assert assign_lanes([]) == []


def test_format_rank_ranges() -> None:
    assert format_rank_ranges([8, 0, 1, 4, 5]) == "0-1,4-5,8"
    assert format_rank_ranges(range(0, 20, 2), limit=3) == "0,2,4,… (10 ranks)"


def test_select_ranks_maps_to_simulated_stand_ins(synthetic: Any) -> None:
    facts = synthetic.facts
    assert select_ranks(facts, None) == [0, 1]
    assert select_ranks(facts, [2]) == [0]  # rank 2 is stage 0, simulated as rank 0
    assert select_ranks(facts, [3, 2]) == [0, 1]
    with pytest.raises(ScenarioError, match="rank 4 is outside"):
        select_ranks(facts, [4])


def test_link_load_integrals_and_bins() -> None:
    # class 0: 10 B/s in [0,1), 5 B/s in [1,2); class 1: 20 B/s in [1,2); nothing after 2 s (record ends at 3 s)
    series = {"samples": [(0.0, [0], [10.0]), (1.0, [0, 1], [5.0, 20.0]), (2.0, [], [])],
              "labels": ["x", "y"], "kinds": ["k", "k"], "tiers": ["t", "t"], "capacity": [20.0, 40.0]}
    load = LinkLoad.from_series(series, end_s=3.0)
    assert load is not None
    assert load.bytes_carried().tolist() == [15.0, 20.0]
    assert load.busiest(5) == [0, 1]  # mean utilisation 15/20 = 0.75 over 20/40 = 0.5 (per second of record)
    bins = load.binned_utilisation([0], np.array([0.0, 0.5, 1.5, 3.0]))
    # utilisation 0.5 then 0.25: bin [0.5,1.5) = (0.5*0.5 + 0.5*0.25)/1; bin [1.5,3) = (0.5*0.25)/1.5
    assert bins[0] == pytest.approx([0.5, 0.375, 0.125 / 1.5])
    assert LinkLoad.from_series(None, 1.0) is None


# -- real runs: validity -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["quickstart", "pipeline", "oom"])
def test_trace_is_valid(name: str, request: pytest.FixtureRequest) -> None:
    result = request.getfixturevalue(name)
    doc = trace_document(result)
    assert trace_problems(doc) == []
    json.dumps(doc, allow_nan=False)  # strict JSON, no NaN / Infinity
    # one slice per row plus one ProfilerStep per traced rank
    assert len(_by(doc, "X")) == len(expand_fused(result.rows)) + len(result.facts.represents)


def test_trace_validator_catches_problems() -> None:
    base = [{"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "p"}},
            {"ph": "M", "name": "thread_name", "pid": 0, "tid": 1, "args": {"name": "t"}}]
    overlap = [{"ph": "X", "name": "a", "pid": 0, "tid": 1, "ts": 0, "dur": 10},
               {"ph": "X", "name": "b", "pid": 0, "tid": 1, "ts": 5, "dur": 10}]
    assert "improper overlap" in trace_problems({"traceEvents": base + overlap})[0]
    nested = [{"ph": "X", "name": "a", "pid": 0, "tid": 1, "ts": 0, "dur": 10},
              {"ph": "X", "name": "b", "pid": 0, "tid": 1, "ts": 5, "dur": 5}]
    assert trace_problems({"traceEvents": base + nested}) == []
    dangling = [{"ph": "f", "name": "x", "cat": "p2p", "id": 3, "pid": 0, "tid": 1, "ts": 1, "bp": "e"}]
    assert "without start" in trace_problems({"traceEvents": base + dangling})[0]
    negative = [{"ph": "C", "name": "m", "pid": 0, "tid": 0, "ts": 0, "args": {"v": -1.0}}]
    assert "counter" in trace_problems({"traceEvents": base + negative})[0]


# -- real runs: the trace says what the Result says ---------------------------------------------


@pytest.mark.parametrize("name", ["quickstart", "pipeline"])
def test_slices_add_up_to_the_breakdown(name: str, request: pytest.FixtureRequest) -> None:
    result = request.getfixturevalue(name)
    doc = trace_document(result)
    for b in result.stage_breakdown:
        compute = slices_of(doc, b.rank, "compute")
        # compute slices never overlap (one stream), so their sum is the compute time; ns rounding per slice
        assert sum(e["dur"] for e in compute) * 1e-6 == pytest.approx(b.compute_s, abs=len(compute) * 1e-9)
        for kind, in_flight_s in b.comm_s.items():
            spans = [(e["ts"], e["ts"] + e["dur"]) for e in slices_of(doc, b.rank, kind)]
            assert union_us(spans) * 1e-6 == pytest.approx(in_flight_s, abs=len(spans) * 1e-9)
        (step,) = [e for e in slices_of(doc, b.rank) if e["name"].startswith("ProfilerStep#")]
        assert step["dur"] * 1e-6 == pytest.approx(result.step_time_s, abs=1e-9)


def test_memory_counter_peaks_at_the_result_peak(pipeline: Any) -> None:
    doc = trace_document(pipeline)
    for m in pipeline.memory:
        totals = [(e["ts"], e["args"]["total"]) for e in _by(doc, "C")
                  if e["pid"] == m.rank and e["name"] == MEMORY_TOTAL_COUNTER]
        ts, peak = max(totals, key=lambda p: p[1])
        assert peak == pytest.approx(m.peak_bytes / GiB, abs=1e-5)
        assert ts == pytest.approx(m.peak_time_s * 1e6, abs=1e-3)


def test_oom_is_marked(oom: Any) -> None:
    assert oom.oom
    doc = trace_document(oom)
    marks = _by(doc, "i")
    assert [e["pid"] for e in marks] == [m.rank for m in oom.memory if m.peak_bytes > m.capacity_bytes]
    mark = marks[0]
    assert mark["args"]["peak_us"] == pytest.approx(oom.oom_detail.time_s * 1e6, abs=1e-3)
    # the mark sits where the memory total first goes over the capacity, at or before the peak
    capacity_gib = oom.gpu_memory_bytes / GiB
    totals = sorted((e["ts"], e["args"]["total"]) for e in _by(doc, "C")
                    if e["pid"] == mark["pid"] and e["name"] == MEMORY_TOTAL_COUNTER)
    first_over = next(ts for ts, total in totals if total > capacity_gib)
    assert mark["ts"] == first_over <= mark["args"]["peak_us"]


def test_link_counters_integrate_to_the_bytes_carried(pipeline: Any) -> None:
    doc = trace_document(pipeline, max_links=8)
    network_pid = pipeline.facts.world_size
    by_track: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for e in _by(doc, "C"):
        if e["pid"] == network_pid:
            by_track[e["name"]].append((e["ts"], e["args"]["utilisation [%]"]))
    assert 0 < len(by_track) <= 8
    series = pipeline._series
    capacity = dict(zip(series["labels"], series["capacity"], strict=True))
    carried = {u.label: u.bytes for u in pipeline.links}
    matched = 0
    for name, samples in by_track.items():
        label = name.rsplit(" (", 1)[0]
        assert all(0.0 <= v <= 100.0 + 1e-6 for _, v in samples)  # max-min fairness never oversubscribes
        samples.append((pipeline.step_time_s * 1e6, 0.0))
        nbytes = sum(v / 100 * capacity[label] * (t1 - t0) * 1e-6 for (t0, v), (t1, _) in itertools.pairwise(samples))
        if label in carried:  # Result.links keeps the 12 busiest
            assert nbytes == pytest.approx(carried[label], rel=1e-4)
            matched += 1
    assert matched >= 3


def test_pipeline_flows_pair_every_p2p_transfer(pipeline: Any) -> None:
    doc = trace_document(pipeline)
    sends = [r for r in pipeline.rows if r.comm and r.comm["op"] == "p2p" and r.comm["group"][0] == r.rank]
    assert len(sends) == 2 * pipeline.micro_batches  # activations forward, gradients back, per micro-batch
    starts, ends = _by(doc, "s"), _by(doc, "f")
    assert len(starts) == len(ends) == len(sends)
    stage_pid = {m.stage: m.rank for m in pipeline.memory}
    assert {(s["pid"], e["pid"]) for s, e in zip(starts, ends, strict=True)} == {
        (stage_pid[0], stage_pid[1]), (stage_pid[1], stage_pid[0])}


# -- files and size ------------------------------------------------------------------------------


def test_gzip_and_plain_files_hold_the_document(tmp_path: Any, synthetic: Any) -> None:
    doc = trace_document(synthetic)
    write_trace(synthetic, tmp_path / "t.json.gz")
    write_trace(synthetic, tmp_path / "t.json")
    with gzip.open(tmp_path / "t.json.gz", "rt") as fh:
        assert json.load(fh) == doc
    assert json.loads((tmp_path / "t.json").read_text()) == doc


def test_large_cluster_trace_stays_bounded_with_rank_subsetting() -> None:
    # 64 GPUs without symmetry: all 64 ranks simulated; the trace of ranks 0-7 holds 8 processes
    result = _simulate(["cluster.nodes=8", "sim.symmetry=off"])
    assert len(result.facts.represents) == 64
    full = trace_document(result)
    subset = trace_document(result, ranks=range(8), max_links=4)
    assert trace_problems(subset) == []
    pids = {e["pid"] for e in _by(subset, "X")}
    assert pids == set(range(8))
    rows_0_7 = len(expand_fused([r for r in result.rows if r.rank < 8]))
    assert len(_by(subset, "X")) == rows_0_7 + 8
    assert len({e["name"] for e in _by(subset, "C") if e["pid"] == 64}) <= 4
    assert len(json.dumps(subset)) < len(json.dumps(full)) / 5


def test_huge_symmetric_cluster_trace_is_small() -> None:
    # 4096 GPUs, pp 4: four simulated ranks; ranks 0-7,1024 stand for stages 0-3
    result = _simulate(["cluster.nodes=512", "parallelism.pp=4", "training.global_batch=8192"])
    doc = trace_document(result, ranks=[*range(8), 1024])
    assert doc["otherData"]["ranks_traced"] == "0,1,2,3"
    assert trace_problems(doc) == []
    assert len(json.dumps(doc)) < 2_000_000


def test_cli_writes_trace_and_rejects_bad_ranks(tmp_path: Any) -> None:
    from typer.testing import CliRunner

    from simulator.cli import app

    out = tmp_path / "q.json.gz"
    hta = tmp_path / "hta"
    ok = CliRunner().invoke(app, ["run", QUICKSTART, "-q", "--set", "parallelism.pp=2", "--trace", str(out),
                                  "--trace-ranks", "0-3,31", "--hta", str(hta)])
    assert ok.exit_code == 0, ok.output
    with gzip.open(out, "rt") as fh:
        doc = json.load(fh)
    assert doc["otherData"]["ranks_traced"] == "0,1"
    assert sorted(p.name for p in hta.iterdir()) == ["rank0.json.gz", "rank1.json.gz"]
    bad = CliRunner().invoke(app, ["run", QUICKSTART, "-q", "--trace", str(out), "--trace-ranks", "0-40"])
    assert bad.exit_code == 2
    assert re.search(r"rank 32 is outside", bad.output.replace("\n", ""))
