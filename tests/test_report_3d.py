"""The report as a 3D-parallel user reads it: one rank per pipeline stage, collectives as
in-flight intervals, one colour per legend name, memory per stage, effective settings.

Scenarios: the quickstart's GPT-3 XL at tp 2 x pp 4, global batch 32, micro-batch 4: on one
p4d node (8 GPUs, dp 1: 32 / 4 = 8 micro-batches) with symmetry off (all 8 ranks simulated,
the timeline must still pick one per stage), and on four nodes (dp 4: 32 / (4 x 4) = 2
micro-batches) with symmetry on (ranks 0, 2, 4, 6 simulated), with and without the
megatron-core profile.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import numpy as np
import pytest

import simulator
from simulator.results.rows import expand_fused
from simulator.viz.breakdown import breakdown_figure
from simulator.viz.memory import memory_figure
from simulator.viz.report import KEY_SETTINGS, effective_settings, report_html
from simulator.viz.style import COLOURS, colour
from simulator.viz.timeline import timeline_figure, timeline_ranks

QUICKSTART = "scenarios/quickstart.yaml"
PP4 = ["parallelism.tp=2", "parallelism.pp=4", "training.global_batch=32"]


@pytest.fixture(scope="module")
def all_ranks() -> tuple[Any, Any]:
    sc = simulator.load_scenario(QUICKSTART, overrides=[*PP4, "cluster.nodes=1", "sim.symmetry=off"])
    return sc, simulator.run_simulation(sc)


@pytest.fixture(scope="module")
def symmetric() -> tuple[Any, Any]:
    sc = simulator.load_scenario(QUICKSTART, overrides=PP4)
    return sc, simulator.run_simulation(sc)


@pytest.fixture(scope="module")
def profiled() -> tuple[Any, Any]:
    sc = simulator.load_scenario(QUICKSTART, overrides=[*PP4, "framework=megatron-core"])
    return sc, simulator.run_simulation(sc)


def _lane_rank(label: str) -> tuple[int, int]:
    found = re.match(r"s(\d+) r(\d+) ", label)
    assert found, label
    return int(found.group(1)), int(found.group(2))


def test_one_rank_per_stage_by_default(all_ranks: tuple[Any, Any]) -> None:
    """8 ranks simulated, rank = tp_i + 2 * pp_i (dp 1): stage s is ranks 2s and 2s+1; the
    timeline takes the first of each, 0, 2, 4, 6, unless the critical rank stands for its stage."""
    _, sim = all_ranks
    assert sorted(sim.facts.represents) == list(range(8))
    expected = [2 * s for s in range(4)]
    critical = sim.result.breakdown.rank
    expected[critical // 2] = critical
    assert timeline_ranks(sim) == expected
    fig = timeline_figure(sim)
    lanes = list(fig.layout.yaxis.categoryarray)[::-1]
    assert sorted({_lane_rank(label) for label in lanes}) == [(s, expected[s]) for s in range(4)]
    assert "one rank per pipeline stage" in fig.layout.title.text
    # requested ranks still win: rank 3 (stage 1) and rank 7 (stage 3)
    assert timeline_ranks(sim, [3, 7]) == [3, 7]


def test_staircase_first_forward_starts_later_on_each_stage(all_ranks: tuple[Any, Any]) -> None:
    """1F1B: stage s waits for stage s-1's first activation, so its first compute bar starts
    strictly after stage s-1's; the figure's bars agree with the simulation's rows."""
    _, sim = all_ranks
    fig = timeline_figure(sim)
    compute = next(t for t in fig.data if t.name == "compute")
    first: dict[int, float] = {}
    for label, base in zip(compute.y, compute.base, strict=True):
        stage, _ = _lane_rank(label)
        first[stage] = min(first.get(stage, float("inf")), base)
    starts = [first[s] for s in range(4)]
    assert all(starts[s] < starts[s + 1] for s in range(3)), starts
    for stage, rank in enumerate(timeline_ranks(sim)):
        rows = [r for r in sim.rows if r.rank == rank and r.category == "compute"]
        assert first[stage] == pytest.approx(min(r.start_s for r in rows) * 1e3, rel=1e-12)


def test_collectives_are_drawn_one_bar_per_interval(symmetric: tuple[Any, Any]) -> None:
    """Every communication trace has one bar per collective / transfer the simulation ran on
    the shown ranks (fused runs expanded: the quickstart is small), start and duration equal,
    several per lane, overlapping ones never merged. Pipeline rows: 3 stage boundaries x 2
    micro-batches x (activation, gradient) x (send, receive end) = 24 transfers, plus the
    tied-embedding gradient sync on the first and last stage = 26."""
    _, sim = symmetric
    fig = timeline_figure(sim)
    shown = set(timeline_ranks(sim))
    rows = [r for rank in shown for r in expand_fused([x for x in sim.rows if x.rank == rank])]
    comm_rows = [r for r in rows if r.category != "compute"]
    expected = Counter(r.category for r in comm_rows)
    assert expected["pp"] == 3 * 2 * 2 * 2 + 2 and expected["tp"] > 100 and expected["dp"] > 4  # 25 MiB DDP buckets: several per stage
    traces = {t.name: t for t in fig.data}
    for category, count in expected.items():
        trace = traces[category]
        assert len(trace.x) == count, category
        drawn = np.array(sorted(zip(trace.base, trace.x, strict=True)))
        simulated = np.array(sorted((r.start_s * 1e3, r.duration_s * 1e3) for r in comm_rows if r.category == category))
        assert np.allclose(drawn, simulated, rtol=1e-9, atol=1e-12)
        per_lane = Counter(trace.y)
        assert max(per_lane.values()) > 1  # intervals, not one bar per lane
        assert trace.marker.opacity < 1  # translucent: overlaps stay visible
    dp = traces["dp"]
    assert any(w > 0 for w in dp.marker.line.width)  # outlines separate back-to-back buckets


def test_no_spurious_lanes_and_every_lane_explained() -> None:
    """tp 8 inside a p4d node fuses runs of layers with their tp collectives; drawn as their
    kernels, those touch but never overlap: one compute lane per rank. The note under the
    figure names every stream shown."""
    sc = simulator.load_scenario(QUICKSTART, overrides=["parallelism.tp=8", "parallelism.pp=4",
                                                        "training.global_batch=32"])
    sim = simulator.run_simulation(sc)
    assert any(r.info is not None and r.info.fused is not None for r in sim.rows)
    fig = timeline_figure(sim)
    assert "drawn whole" not in fig.layout.title.text
    lanes = list(fig.layout.yaxis.categoryarray)
    assert not [label for label in lanes if "compute #" in label]
    note = fig.layout.meta["note"]
    for stream in {label.split(" ")[2] for label in lanes}:
        assert f"{stream}: " in note


def _legend(fig: Any) -> dict[str, str]:
    return {t.name: t.marker.color if t.type == "bar" else t.line.color
            for t in fig.data if t.showlegend is not False and t.name and t.legendgroup != "stage"}


def test_legend_colours_agree_across_figures(symmetric: tuple[Any, Any]) -> None:
    """A name has one colour in every figure (``exposed tp`` = ``tp``), no two names share
    one, and stage lines use none of the named colours."""
    _, sim = symmetric
    figures = [breakdown_figure(sim.result), timeline_figure(sim), memory_figure(sim)]
    seen: dict[str, str] = {}
    for fig in figures:
        for name, shade in _legend(fig).items():
            key = name.removeprefix("exposed ")
            assert shade == colour(key) == seen.setdefault(key, shade), name
    assert {"compute", "tp", "dp", "pp", "bubble", "params", "activations"} <= set(seen)
    assert len(set(COLOURS.values())) == len(COLOURS)
    stages = [t.line.color for t in figures[2].data if t.legendgroup == "stage"]
    assert len(set(stages)) == 4 and not set(stages) & set(COLOURS.values())


def test_memory_has_one_line_per_stage(symmetric: tuple[Any, Any]) -> None:
    """One total line per pipeline stage (4), in GiB; its maximum is the stage's reported peak."""
    _, sim = symmetric
    fig = memory_figure(sim)
    lines = [t for t in fig.data if t.legendgroup == "stage"]
    assert [t.name for t in lines] == [f"stage {s} (rank {2 * s})" for s in range(4)]
    peaks = {m.rank: m.peak_bytes for m in sim.result.memory}
    for s, line in enumerate(lines):
        assert max(line.y) == pytest.approx(peaks[2 * s] / 2**30, rel=1e-12)
    assert fig.layout.yaxis.title.text == "GiB"


def test_effective_settings_table(profiled: tuple[Any, Any]) -> None:
    """The key layout settings with their source, then megatron-core's profile settings (the
    rows dtsim run prints); no empty or null value; dp auto shows what it resolved to
    (32 GPUs / (tp 2 x pp 4) = 4)."""
    sc, sim = profiled
    rows = effective_settings(sim.result, sc)
    table = {path: (value, source) for path, value, source in rows}
    assert [path for path, _, _ in rows[: len(KEY_SETTINGS)]] == list(KEY_SETTINGS)
    assert table["parallelism.pp"] == ("4", "scenario") and table["parallelism.dp"] == ("auto (= 4)", "default")
    assert table["framework"] == ("megatron-core", "scenario")
    from simulator.scenario.framework import framework_setting_rows

    profile = framework_setting_rows(sc)
    assert profile and all(row in rows for row in profile if row[0] not in KEY_SETTINGS)
    assert any(source == "megatron-core" for _, _, source in rows)
    assert all(value and value not in ("null", "None") for _, value, _ in rows)
    page = report_html(sim, sc)
    assert "<h2>Effective settings</h2>" in page
    assert "<td>parallelism.pp</td><td>4</td><td>scenario</td>" in page
    assert 'class="note">Lanes, per rank' in page
