"""Plotly figures and the HTML report: numbers in the figures are the Result's numbers."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from trace_checks import MS, synthetic_result

import simulator
from simulator.units import GiB
from simulator.viz.breakdown import breakdown_figure, breakdown_parts
from simulator.viz.links import link_heatmap_figure, top_links_figure
from simulator.viz.memory import memory_figure, memory_series
from simulator.viz.report import report_html, write_report
from simulator.viz.scaling import scaling_efficiency, scaling_figure, scaling_series
from simulator.viz.timeline import timeline_figure, timeline_ranks

QUICKSTART = "scenarios/quickstart.yaml"


@pytest.fixture(scope="module")
def pipeline() -> tuple[Any, Any]:
    sc = simulator.load_scenario(QUICKSTART, overrides=["parallelism.tp=2", "parallelism.pp=2"])
    return sc, simulator.run_simulation(sc, record_series=True)


@pytest.fixture(scope="module")
def synthetic() -> Any:
    return synthetic_result()


# -- breakdown -------------------------------------------------------------------------------


def test_breakdown_parts_hand_checked(synthetic: Any) -> None:
    labels, parts = breakdown_parts(synthetic.result)
    assert labels == ["rank 0<br>stage 0 ★", "rank 1<br>stage 1"]
    # rank 0: compute 2.5, exposed pp 0.5, exposed dp 2 ms; rank 1: compute 1, pp 0.5, bubble 1 (waits for
    # the activation), idle 2.5 ms (done at 2.5 of 5 ms); priority order puts dp before pp
    assert list(parts) == ["compute", "exposed dp", "exposed pp", "bubble", "idle"]
    expected_ms = [[2.5, 1.0], [2.0, 0.0], [0.5, 0.5], [0.0, 1.0], [0.0, 2.5]]
    assert np.allclose(np.array(list(parts.values())) / MS, np.array(expected_ms))


def test_breakdown_bars_stack_to_the_step_time(pipeline: tuple[Any, Any]) -> None:
    _, result = pipeline
    fig = breakdown_figure(result.result)
    totals = np.sum([trace.y for trace in fig.data], axis=0)
    assert totals == pytest.approx([result.result.step_time_s * 1e3] * len(result.result.stage_breakdown), rel=1e-9)
    assert {t.name for t in fig.data} >= {"compute", "exposed tp", "exposed dp", "bubble"}


# -- timeline --------------------------------------------------------------------------------


def test_timeline_has_a_bar_per_task_and_lanes(synthetic: Any) -> None:
    fig = timeline_figure(synthetic)
    bars = {t.name: t for t in fig.data}
    assert sum(len(t.x) for t in fig.data) == len(synthetic.rows)
    assert list(bars["dp"].y) == ["s0 r0 dp", "s0 r0 dp #2"]  # the overlapping all-reduces get two lanes
    assert list(bars["dp"].base) == pytest.approx([2.0, 3.0]) and list(bars["dp"].x) == pytest.approx([2.0, 2.0])
    f0 = next(c for c in bars["compute"].customdata if c[0] == "f0")
    assert f0[1:3] == [0.0, 1.0] and "achieved_tflop_per_s: 200.0" in f0[3]  # start, duration (ms), details
    assert list(fig.layout.yaxis.categoryarray)[::-1] == [
        "s0 r0 compute", "s0 r0 dp", "s0 r0 dp #2", "s0 r0 pp.send.act", "s1 r1 compute", "s1 r1 pp.recv.act"]
    assert "dp #2" not in fig.layout.meta["note"] and "#2, #3" in fig.layout.meta["note"]  # explains the extra lane


def test_timeline_keeps_the_critical_rank(pipeline: tuple[Any, Any]) -> None:
    _, result = pipeline
    assert timeline_ranks(result, max_ranks=1) == [result.result.breakdown.rank]
    critical = result.result.breakdown.rank
    critical_rows = sum(1 for r in result.rows if r.rank == critical)
    # a budget below one rank's tasks: only the critical rank, cut to the budget
    fig = timeline_figure(result, max_slices=100)
    assert sum(len(t.x) for t in fig.data) == 100
    assert f"first 100 of {critical_rows} tasks" in fig.layout.title.text
    other = [r for r in result.facts.represents if r != critical]
    assert f"ranks {', '.join(map(str, other))} left out" in fig.layout.title.text
    # a budget for every task: everything
    fig = timeline_figure(result, max_slices=len(result.rows))
    assert sum(len(t.x) for t in fig.data) == len(result.rows) and "left out" not in fig.layout.title.text


# -- memory ----------------------------------------------------------------------------------


def test_memory_series_hand_checked(synthetic: Any) -> None:
    times, values = memory_series(synthetic, 1)
    assert times == pytest.approx([0.0, 2 * MS, 5 * MS])  # start, the 1.5 GiB allocation, step end
    assert [v / GiB for v in values["activations"]] == [0.0, 1.5, 1.5]
    assert [v / GiB for v in values["params"]] == [1.0, 1.0, 1.0]


def test_memory_figure_marks_capacity_peak_and_oom(synthetic: Any) -> None:
    fig = memory_figure(synthetic)
    markers = [t for t in fig.data if t.mode == "markers"]
    assert [(t.name, t.x[0], t.y[0]) for t in markers] == [("peak", 1.0, 1.5), ("OOM", 2.0, 2.5)]
    texts = [a.text for a in fig.layout.annotations]
    assert "OOM at 2.0 ms; peak needs 2.5 GiB" in texts and texts.count("capacity 2 GiB") == 2
    assert "OUT OF MEMORY" in fig.layout.title.text


def test_memory_stack_reaches_the_reported_peak(pipeline: tuple[Any, Any]) -> None:
    _, result = pipeline
    for m in result.result.memory:
        _, values = memory_series(result, m.rank)
        totals = np.sum(list(values.values()), axis=0)
        assert totals.max() == pytest.approx(m.peak_bytes, rel=1e-12)


# -- links -----------------------------------------------------------------------------------


def test_link_heatmap_averages_integrate_to_bytes(pipeline: tuple[Any, Any]) -> None:
    _, result = pipeline
    fig = link_heatmap_figure(result, max_links=12, bins=50)
    (heat,) = fig.data
    z = np.array(heat.z)
    assert z.shape == (12, 50) and z.min() >= 0 and z.max() <= 100 + 1e-6
    capacity = dict(zip(result.series["labels"], result.series["capacity"], strict=True))
    carried = {u.label: u.bytes for u in result.result.links}
    width_s = (heat.x[1] - heat.x[0]) * 1e-3
    for label, row in zip(heat.y, z, strict=True):
        name = label.rsplit(" [", 1)[0]
        if name in carried:
            assert row.sum() / 100 * width_s * capacity[name] == pytest.approx(carried[name], rel=1e-6)


def test_link_figures_without_series_say_so(synthetic: Any) -> None:
    from dataclasses import replace

    bare = replace(synthetic, series=None)
    fig = link_heatmap_figure(bare)
    assert "not recorded" in fig.layout.annotations[0].text
    top = top_links_figure(synthetic)
    assert list(top.data[0].x) == pytest.approx([100 * 1e6 / (100e9 * 5 * MS)])  # 1 MB on 100 GB/s in 5 ms


# -- scaling ---------------------------------------------------------------------------------


def test_scaling_efficiency_hand_checked() -> None:
    # 16 GPUs: 190 / (2 * 100) = 0.95; 32 GPUs: 340 / (4 * 100) = 0.85; baseline = fewest GPUs
    assert scaling_efficiency([16, 8, 32], [190, 100, 340]) == pytest.approx([0.95, 1.0, 0.85])
    with pytest.raises(ValueError):
        scaling_efficiency([8], [0.0])
    with pytest.raises(ValueError):
        scaling_efficiency([], [])


def test_scaling_series_skips_infeasible_points() -> None:
    records: list[dict[str, Any]] = [
        {"world_size": 8, "tokens_per_s": 100.0, "sharding": "zero3"},
        {"world_size": 16, "tokens_per_s": "190", "sharding": "zero3"},
        {"world_size": 32, "tokens_per_s": None, "sharding": "zero3", "error": "OOM"},
        {"world_size": 16, "tokens_per_s": 120.0, "sharding": "mics"},
        {"world_size": 32, "tokens_per_s": 200.0, "sharding": "mics"},
        {"world_size": 64, "tokens_per_s": float("nan"), "sharding": "mics"},
    ]
    series = scaling_series(records, series_key="sharding")
    assert series == {"mics": [(16.0, 120.0, 1.0), (32.0, 200.0, pytest.approx(200 / 240))],
                      "zero3": [(8.0, 100.0, 1.0), (16.0, 190.0, pytest.approx(0.95))]}


def test_scaling_figure_draws_the_ideal_line() -> None:
    fig = scaling_figure([{"gpus": 8, "tput": 100}, {"gpus": 16, "tput": 190}, {"gpus": 32, "tput": 340}],
                         gpus_key="gpus", throughput_key="tput", throughput_label="samples/s")
    by_name = {t.name: t for t in fig.data}
    assert list(by_name["samples/s ideal"].y) == [100, 200, 400]
    efficiency = next(t for t in fig.data if t.xaxis == "x2" and t.name == "samples/s")
    assert list(efficiency.y) == pytest.approx([100, 95, 85])


# -- report ----------------------------------------------------------------------------------


def test_report_is_self_contained(tmp_path: Any, pipeline: tuple[Any, Any]) -> None:
    sc, result = pipeline
    path = write_report(result, sc, tmp_path / "sub" / "r.html")
    text = path.read_text()
    assert text.count('class="plotly-graph-div"') == 5
    from plotly.offline import get_plotlyjs

    assert text.count(get_plotlyjs()) == 1  # plotly.js inline, once
    rest = text.replace(get_plotlyjs(), "")
    assert "<script src=" not in rest and "http" not in rest.replace("http://www.w3.org", "")  # works offline
    assert result.result.scenario_hash[:16] in text and "tp 2 x pp 2 x cp 1 x dp 8" in text
    assert '"pipeline_schedule": "1f1b"' in text  # the resolved scenario


def test_report_escapes_names(synthetic: Any) -> None:
    sc = simulator.load_scenario(QUICKSTART, overrides=["name=<b>bold</b> & co"])
    result = simulator.run_simulation(sc)
    html = report_html(result, sc)
    assert "&lt;b&gt;bold&lt;/b&gt; &amp; co" in html and "<b>bold</b>" not in html


def test_simulator_and_results_do_not_import_plotly() -> None:
    code = ("import sys, simulator, simulator.results.export, simulator.results.link_load; "
            "assert 'plotly' not in sys.modules, 'plotly imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
