"""What the outputs show of the ``faults`` section (issue 16): the report's step-time
distribution and perturbation table, fault markers in the HTA rank files, and the inner
kernels of a slowed fused task stretched over its slowed span."""

from __future__ import annotations

import gzip
import json
from typing import Any

import pytest
from conftest import SCENARIOS

import simulator
from simulator.results.export import hta_document, write_hta_traces
from simulator.results.export.chrome import trace_document
from simulator.results.rows import expand_fused
from simulator.scenario.faults import FaultsSpec
from simulator.units import MILLISECOND

STRAGGLER = SCENARIOS / "straggler-ddp-p4d.yaml"


@pytest.fixture(scope="module")
def straggler() -> Any:
    """The shipped straggler scenario (4 p4d, rank 3 at 1.5x, NIC 0 of node 1 at half rate and
    +5 us, 2% jitter) with 4 samples (seeds 7..10) instead of 10."""
    return simulator.run_simulation(simulator.load_scenario(STRAGGLER, overrides=["sim.samples=4"]))


def _quick(**faults: Any) -> Any:
    """The quick-start DDP job on one p4d, overlap slowdown 0 (a fused task's nominal span is
    exactly its kernels' sum), with the given faults."""
    sc = simulator.load_scenario(SCENARIOS / "quickstart.yaml", overrides=["sim.overlap_slowdown=0"])
    return simulator.run_simulation(sc.model_copy(update={"faults": FaultsSpec.model_validate(faults)}))


def test_the_report_draws_the_samples_and_the_perturbations(straggler: Any) -> None:
    """The report of the straggler run ends with 'Step-time distribution' and 'Perturbations'.
    The distribution's sample trace is Result.faults.samples.step_times_s sorted, in ms; its
    mean, p50 and p99 lines sit at those fields; the slowest-rank bar is slowest_counts (rank 3
    in all 4 samples: its compute is 1.5x everyone's, far beyond 2% jitter). The table names
    rank 3 at x1.5, the 2% jitter, both directions of node 1's NIC 0 at x0.5 +5 us (entry
    faults.links[0]) and ranks 0-31 simulated individually."""
    from simulator.viz.faults import QUANTILE_LINES
    from simulator.viz.report import report_figures, report_html

    s = straggler.result.faults.samples
    figures = dict(report_figures(straggler))
    assert list(figures)[-2:] == ["Step-time distribution", "Perturbations"]
    dist = figures["Step-time distribution"]
    by_name = {t.name.split(" ")[0]: t for t in dist.data}
    assert list(by_name["samples"].y) == pytest.approx([t / MILLISECOND for t in sorted(s.step_times_s)], rel=1e-12)
    assert [c[0] for c in by_name["samples"].customdata] == [s.seeds[i] for i in
                                                            sorted(range(4), key=s.step_times_s.__getitem__)]
    for name, field, _ in QUANTILE_LINES:
        assert list(by_name[name].y) == pytest.approx([getattr(s, field) / MILLISECOND] * 2, rel=1e-12)
    assert s.slowest_counts == {3: 4}
    assert (list(by_name["slowest"].x), list(by_name["slowest"].y)) == (["rank 3"], [4])
    what, where, effect = (list(c) for c in figures["Perturbations"].data[0].cells.values)
    assert what == ["straggler", "jitter", "link", "link", "simulated individually"]
    assert where[0] == "rank 3" and effect[0] == "compute x1.5" and "cv 0.02" in effect[1]
    assert sorted(w.split(" ")[0] for w in where[2:4]) == ["leaf0->n1.nic0", "n1.nic0->leaf0"]
    assert all("faults.links[0]" in w for w in where[2:4])
    assert effect[2:4] == ["bandwidth x0.5, latency +5 us"] * 2 and where[4] == "ranks 0-31"
    html = report_html(straggler, simulator.load_scenario(STRAGGLER, overrides=["sim.samples=4"]))
    assert "<h2>Step-time distribution</h2>" in html and "<h2>Perturbations</h2>" in html


def test_no_distribution_without_samples_and_no_table_without_faults() -> None:
    """One iteration with a straggler: the table, no distribution; a healthy run: neither."""
    from simulator.viz.report import report_figures

    slowed = [title for title, _ in report_figures(_quick(stragglers=[{"ranks": [3], "slowdown": 1.5}]))]
    assert "Perturbations" in slowed and "Step-time distribution" not in slowed
    healthy = simulator.run_simulation(simulator.load_scenario(SCENARIOS / "quickstart.yaml"))
    titles = [title for title, _ in report_figures(healthy)]
    assert "Perturbations" not in titles and "Step-time distribution" not in titles


def test_inner_kernels_of_a_slowed_fused_task_fill_its_span() -> None:
    """Quick-start DDP, rank 3 at 1.5x, overlap slowdown 0. Each forward is one fused task of
    pure compute (no private collectives with tp 1): nominal span N = sum of its kernels, and
    the straggler's task takes N + (1.5 - 1) N = 1.5 N. Its inner timeline is stretched by
    1.5 N / N = 1.5, so a kernel at offset t with duration d on rank 0 sits at 1.5 t .. 1.5 (t + d)
    on rank 3, and the last kernel ends exactly at the task's end; the Chrome trace carries the
    same slices."""
    sim = _quick(stragglers=[{"ranks": [3], "slowdown": 1.5}])

    def first_fused(rank: int) -> Any:
        return next(r for r in sim.rows if r.rank == rank and r.info is not None and r.info.fused is not None)

    healthy, slowed = first_fused(0), first_fused(3)
    assert slowed.info.fused.nominal_s == healthy.duration_s
    assert slowed.duration_s == pytest.approx(1.5 * healthy.duration_s, rel=1e-12)
    fast, slow = expand_fused([healthy]), expand_fused([slowed])
    assert len(fast) == len(slow) > 2
    for a, b in zip(fast, slow, strict=True):
        assert b.start_s - slowed.start_s == pytest.approx(1.5 * (a.start_s - healthy.start_s), rel=1e-9, abs=1e-15)
        assert b.end_s - slowed.start_s == pytest.approx(1.5 * (a.end_s - healthy.start_s), rel=1e-9)
    assert slow[-1].end_s == pytest.approx(slowed.end_s, rel=1e-12)
    doc = trace_document(sim, ranks=[3])
    k = slow[2]
    (event,) = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e["pid"] == 3 and e["name"] == k.name
                and e["ts"] == pytest.approx(k.start_s * 1e6, abs=1e-3)]
    assert event["dur"] == pytest.approx((k.end_s - k.start_s) * 1e6, abs=2e-3)


def test_hta_files_carry_the_fault_markers_and_hta_still_reads_them(straggler: Any, tmp_path: Any) -> None:
    """Rank 3's HTA file: an instant 'straggler: compute x1.5' (process scope) and the two
    global link markers on its CPU thread at ts 0, without dur; its GPU label says straggler;
    rank 0's file has only the link markers. HTA drops events without dur on load, so its
    temporal breakdown still equals the Result's compute per rank (as for a healthy run)."""
    doc = hta_document(straggler, 3)
    faults = [e for e in doc["traceEvents"] if e.get("cat") == "fault"]
    assert {e["ph"] for e in faults} == {"i"} and all("dur" not in e and e["ts"] == 0 for e in faults)
    assert all(e["pid"] == 1_000_003 and e["tid"] == 1 for e in faults)
    assert [e["name"] for e in faults if e["s"] == "p"] == ["straggler: compute x1.5"]
    assert sorted(e["name"] for e in faults if e["s"] == "g") == [
        "link leaf0->n1.nic0: bandwidth x0.5, latency +5 us", "link n1.nic0->leaf0: bandwidth x0.5, latency +5 us"]
    labels = [e["args"]["labels"] for e in doc["traceEvents"] if e["name"] == "process_labels"]
    assert labels[0].endswith(", straggler x1.5")
    assert doc["otherData"]["faults"]["samples"]["slowest_counts"] == {"3": 4}
    assert [e["s"] for e in hta_document(straggler, 0)["traceEvents"] if e.get("cat") == "fault"] == ["g", "g"]
    paths = write_hta_traces(straggler, tmp_path, ranks=[0, 3])
    with gzip.open(paths[1], "rt") as fh:
        assert json.load(fh)["distributedInfo"]["rank"] == 3
    trace_analysis = pytest.importorskip("hta.trace_analysis")
    df = trace_analysis.TraceAnalysis(trace_dir=str(tmp_path)).get_temporal_breakdown(visualize=False)
    compute = {b.rank: b.compute_s for b in straggler.result.stage_breakdown}
    for rank in (0, 3):
        assert df[df["rank"] == rank].iloc[0]["compute_time(us)"] * 1e-6 == pytest.approx(compute[rank], rel=1e-3)
