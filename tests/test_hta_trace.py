"""Per-rank traces in the layout Holistic Trace Analysis (HTA) reads.

HTA's rules checked here (facebookresearch/HolisticTraceAnalysis): a file's rank is the
first match of ``"rank":\\s+(\\d+)`` (hta/common/trace_file.py); GPU kernels have
``args.stream > 0``, CPU events no stream (hta/common/trace_filter.py); a kernel's
iteration is that of the CPU event with the same ``correlation``, which lies inside
``ProfilerStep#N`` (hta/common/trace.py); kernels matching ``^nccl.*Kernel`` are
communication, others computation (hta/utils/utils.py). The temporal breakdown is
recomputed here the way HTA defines it and compared with the Result's breakdown.
"""

from __future__ import annotations

import gzip
import json
import re
from typing import Any

import pytest
from trace_checks import synthetic_result, trace_problems, union_us

import simulator
from simulator.results.export import (
    HTA_FIRST_CORRELATION,
    HTA_LAUNCH_LEAD_US,
    hta_document,
    nccl_kernel_name,
    write_hta_traces,
)
from simulator.results.rows import CommRecord

HTA_RANK = re.compile(r'"rank":\s+(\d+)')
NCCL_KERNEL = re.compile(r"^nccl.*Kernel")


@pytest.fixture(scope="module")
def pipeline() -> Any:
    sc = simulator.load_scenario("scenarios/quickstart.yaml", overrides=["parallelism.tp=2", "parallelism.pp=2"])
    return simulator.run_simulation(sc)


def _kernels(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] in ("kernel", "gpu_memcpy")]


def _launches(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "cuda_runtime"]


def test_nccl_kernel_names() -> None:
    ar = CommRecord("all_reduce", 0.0, algorithm="ring", protocol="LL")
    assert nccl_kernel_name(ar, "bf16") == "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"
    assert nccl_kernel_name(CommRecord("reduce_scatter", 0.0, algorithm="ring", protocol="LL128"), "fp16") == \
        "ncclDevKernel_ReduceScatter_Sum_f16_RING_LL128"
    assert nccl_kernel_name(CommRecord("all_gather", 0.0, algorithm="tree", protocol="Simple"), "bf16") == \
        "ncclDevKernel_AllGather_TREE_SIMPLE"
    assert nccl_kernel_name(CommRecord("all_reduce", 0.0, algorithm="nvls", protocol="Simple"), "fp32") == \
        "ncclDevKernel_AllReduce_Sum_f32_NVLS_SIMPLE"
    assert nccl_kernel_name(CommRecord("p2p", 0.0, algorithm="direct", protocol="Simple"), "bf16") == "ncclDevKernel_SendRecv"
    assert nccl_kernel_name(CommRecord("all_to_all", 0.0), "bf16") == "ncclDevKernel_SendRecv"


def test_synthetic_rank_file_hand_checked() -> None:
    doc = hta_document(synthetic_result(), 0, step=3)
    assert doc["distributedInfo"] == {"backend": "nccl", "rank": 0, "world_size": 4}
    kernels = {e["name"]: e for e in _kernels(doc)}
    lead = HTA_LAUNCH_LEAD_US
    # integer microseconds, shifted by the launch lead; streams 7.. in thread order compute, dp, dp #2, pp.send.act
    assert [(k["ts"], k["dur"], k["args"]["stream"]) for k in (kernels["f0"], kernels["b0"])] == [
        (lead, 1000, 7), (1500 + lead, 1500, 7)]
    ar1 = kernels["ncclDevKernel_AllReduce_Sum_bf16_RING_LL"]
    ar2 = kernels["ncclDevKernel_AllReduce_Sum_bf16_RING_LL128"]
    assert (ar1["ts"], ar1["args"]["stream"], ar2["ts"], ar2["args"]["stream"]) == (2000 + lead, 8, 3000 + lead, 9)
    send = kernels["ncclDevKernel_SendRecv"]
    assert (send["ts"], send["dur"], send["args"]["stream"]) == (1000 + lead, 500, 10)
    launches = sorted((e["ts"], e["args"]["correlation"]) for e in _launches(doc))
    c = HTA_FIRST_CORRELATION  # one launch per kernel, in start order, correlation ids from 2**20
    assert launches == [(0, c), (1000, c + 1), (1500, c + 2), (2000, c + 3), (3000, c + 4)]
    (step,) = [e for e in doc["traceEvents"] if e["name"] == "ProfilerStep#3"]
    assert (step["ts"], step["dur"]) == (0, 5000 + lead + 1)


def test_rank_files_follow_hta_rules(tmp_path: Any, pipeline: Any) -> None:
    paths = write_hta_traces(pipeline, tmp_path)
    assert [p.name for p in paths] == [f"rank{r}.json.gz" for r in sorted(pipeline.facts.represents)]
    for path in paths:
        with gzip.open(path, "rt") as fh:
            text = fh.read()
        rank = int(path.name.removeprefix("rank").removesuffix(".json.gz"))
        match = HTA_RANK.search(text)
        assert match is not None and int(match.group(1)) == rank
        doc = json.loads(text)
        assert trace_problems(doc) == []
        kernels, launches = _kernels(doc), _launches(doc)
        assert len(kernels) == len(launches) == sum(1 for r in pipeline.rows if r.rank == rank)
        assert all(isinstance(k["args"]["stream"], int) and k["args"]["stream"] > 0 for k in kernels)
        assert all("stream" not in e["args"] for e in launches)
        assert all(isinstance(e[key], int) for e in kernels + launches for key in ("ts", "dur"))
        by_corr = {e["args"]["correlation"]: e for e in launches}
        assert len(by_corr) == len(launches) and set(by_corr) == {k["args"]["correlation"] for k in kernels}
        (step,) = [e for e in doc["traceEvents"] if e["name"].startswith("ProfilerStep#")]
        for k in kernels:
            launch = by_corr[k["args"]["correlation"]]
            assert step["ts"] <= launch["ts"] and launch["ts"] + launch["dur"] <= step["ts"] + step["dur"]
            assert launch["ts"] + launch["dur"] <= k["ts"]  # launched before it runs
        comm = [k for k in kernels if NCCL_KERNEL.match(k["name"])]
        rows = [r for r in pipeline.rows if r.rank == rank]
        assert len(comm) == sum(1 for r in rows if r.category != "compute")


def test_hta_temporal_breakdown_matches_the_result(pipeline: Any) -> None:
    """HTA's temporal breakdown: compute = union of computation kernels; idle = gaps between
    the first kernel's start and the last kernel's end; non-compute = the rest. That is our
    compute, exposed communication, and bubble/idle between first and last task."""
    for b in pipeline.result.stage_breakdown:
        doc = hta_document(pipeline, b.rank)
        kernels = _kernels(doc)
        spans = [(k["ts"], k["ts"] + k["dur"]) for k in kernels]
        compute = union_us([(k["ts"], k["ts"] + k["dur"]) for k in kernels if not NCCL_KERNEL.match(k["name"])])
        busy = union_us(spans)
        span = max(e for _, e in spans) - min(s for s, _ in spans)
        tolerance_us = len(kernels)  # each kernel's ends round to the microsecond
        assert compute * 1e-6 == pytest.approx(b.compute_s, abs=tolerance_us * 1e-6)
        assert (busy - compute) * 1e-6 == pytest.approx(b.exposed_comm_total_s, abs=tolerance_us * 1e-6)
        rows = [r for r in pipeline.rows if r.rank == b.rank]
        first, last = min(r.start_s for r in rows), max(r.end_s for r in rows)
        gaps_s = b.bubble_s + b.idle_s - first - (pipeline.result.step_time_s - last)  # waiting between first and last task
        assert (span - busy) * 1e-6 == pytest.approx(gaps_s, abs=tolerance_us * 1e-6)


def test_hta_library_reads_the_files(tmp_path: Any, pipeline: Any) -> None:
    """With HTA installed (``pip install HolisticTraceAnalysis``), its own temporal breakdown
    agrees with ours; checked by hand with HTA 0.5.0 (not a dependency of the project)."""
    trace_analysis = pytest.importorskip("hta.trace_analysis")
    write_hta_traces(pipeline, tmp_path)
    df = trace_analysis.TraceAnalysis(trace_dir=str(tmp_path)).get_temporal_breakdown(visualize=False)
    for b in pipeline.result.stage_breakdown:
        row = df[df["rank"] == b.rank].iloc[0]
        assert row["compute_time(us)"] * 1e-6 == pytest.approx(b.compute_s, rel=1e-3)


def _unions_us(doc: dict[str, Any]) -> dict[str, float]:
    """From one rank file: the first kernel's start, the last one's end, and the lengths of the
    unions of all kernels, of computation kernels and of NCCL kernels (integer microseconds)."""
    spans = [(k["ts"], k["ts"] + k["dur"], bool(NCCL_KERNEL.match(k["name"]))) for k in _kernels(doc)]
    return {"first": min(s for s, _, _ in spans), "last": max(e for _, e, _ in spans),
            "busy": union_us([(s, e) for s, e, _ in spans]),
            "compute": union_us([(s, e) for s, e, nccl in spans if not nccl]),
            "comm": union_us([(s, e) for s, e, nccl in spans if nccl])}


@pytest.mark.slow
def test_hta_breakdowns_of_a_175b_3d_run_at_realistic_size(tmp_path: Any) -> None:
    """The shipped GPT-3 175B run (tp 8 x pp 8 x dp 16, 96 micro-batches, full recomputation,
    fused layers) traced for ranks 0 and 56 (first and last pipeline stage): each file holds
    over 40,000 events, which HTA 0.5.0 failed on with correlation ids from 1 ("Invalid value ...
    for dtype 'int16'", see HTA_FIRST_CORRELATION). HTA's numbers are those of the files, by its
    definitions (hta/analyzers/breakdown_analysis.py, communication_analysis.py):
    kernel_time = last kernel end - first kernel start; idle = kernel_time - |all kernels|;
    compute = |computation kernels| (unions); the overlap ratio = |comm n comp| / |comm| =
    (|comm| + |comp| - |all|) / |comm|; the kernel-type breakdown sums over ranks |comp \\ comm|
    (COMPUTATION), |comm \\ comp| (COMMUNICATION) and |comm n comp|. And they are the Result's
    (to 1 us per kernel: times round to the microsecond): busy = compute + non-compute = the
    rank's compute + exposed communication; idle = its waiting between first and last kernel.
    HTA's compute exceeds the Result's by the slowdown of kernels beside the backward's
    tensor-parallel all-reduces: a slowed kernel runs longer (HTA: compute), the Result counts
    the extra time as exposed communication (simulator/workload/fusion.py)."""
    trace_analysis = pytest.importorskip("hta.trace_analysis")
    sim = simulator.run_simulation(simulator.load_scenario("scenarios/gpt3-175b-3d-dgx-a100.yaml"))
    ranks = [0, 56]
    write_hta_traces(sim, tmp_path, ranks=ranks)
    files = {}
    for rank in ranks:
        with gzip.open(tmp_path / f"rank{rank}.json.gz", "rt") as fh:
            files[rank] = json.load(fh)
        assert len(files[rank]["traceEvents"]) >= 40_000
    analysis = trace_analysis.TraceAnalysis(trace_dir=str(tmp_path))
    temporal = analysis.get_temporal_breakdown(visualize=False).set_index("rank")
    overlap = analysis.get_comm_comp_overlap(visualize=False).set_index("rank")
    by_type, _ = analysis.get_gpu_kernel_breakdown(visualize=False)
    by_type = by_type.set_index("kernel_type")["sum"]
    breakdown = {b.rank: b for b in sim.result.stage_breakdown}
    totals = {"COMPUTATION": 0.0, "COMMUNICATION": 0.0, "COMPUTATION overlapping COMMUNICATION": 0.0}
    for rank in ranks:
        u, row = _unions_us(files[rank]), temporal.loc[rank]
        assert row["kernel_time(us)"] == u["last"] - u["first"]
        assert row["idle_time(us)"] == u["last"] - u["first"] - u["busy"]
        assert row["compute_time(us)"] == u["compute"]
        assert row["non_compute_time(us)"] == u["busy"] - u["compute"]
        both = u["comm"] + u["compute"] - u["busy"]
        ratio = overlap.loc[rank, "comp_comm_overlap_pctg"] / 100
        assert ratio == pytest.approx(both / u["comm"], abs=5e-5)
        totals["COMPUTATION"] += u["compute"] - both
        totals["COMMUNICATION"] += u["comm"] - both
        totals["COMPUTATION overlapping COMMUNICATION"] += both
        b = breakdown[rank]
        tolerance_s = len(_kernels(files[rank])) * 1e-6
        busy_s = (row["compute_time(us)"] + row["non_compute_time(us)"]) * 1e-6
        assert busy_s == pytest.approx(b.compute_s + b.exposed_comm_total_s, abs=tolerance_s)
        assert row["compute_time(us)"] * 1e-6 > b.compute_s + tolerance_s
        rows = [r for r in sim.rows if r.rank == rank]
        first, last = min(r.start_s for r in rows), max(r.end_s for r in rows)
        gaps_s = b.bubble_s + b.idle_s - first - (sim.result.step_time_s - last)
        assert row["idle_time(us)"] * 1e-6 == pytest.approx(gaps_s, abs=tolerance_s)
    assert {k: float(by_type[k]) for k in totals} == totals
