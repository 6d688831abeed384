"""Strategy search: the memory pre-filter and the step bound against the simulator, the
short-run prediction, branch and bound against brute force, objectives, prices, the CLI."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import simulator
from simulator.scenario import Scenario, scenario_from_mapping
from simulator.search import (
    SearchSpace,
    enumerate_layouts,
    explain,
    probe_micro_batches,
    search,
    step_bound_s,
)
from simulator.search.prediction import _with_micro_batches
from simulator.search.pricing import (
    CHINCHILLA_TOKENS_PER_PARAM,
    NodePrice,
    chinchilla_tokens,
    load_prices,
    time_to_train_s,
    training_cost_usd,
)
from simulator.sweep import InlineExecutor
from simulator.workload.memory_estimate import estimate_peak_memory, in_flight_chunks

GIB = 2**30


def _scenario(model: str = "gpt3-1.3b", node: str = "g5.12xlarge", nodes: int = 1, mb: int = 1, gb: int = 32,
              recompute: str = "none", **par: Any) -> Scenario:
    return scenario_from_mapping({"model": model, "cluster": {"node": node, "nodes": nodes}, "parallelism": par,
                                  "training": {"micro_batch": mb, "global_batch": gb, "recompute": recompute}})


# layouts covering every strategy, pipelines, interleaving, recomputation, tp and cp
LAYOUTS = [
    {},
    {"sharding": "zero1"},
    {"sharding": "zero2", "mb": 2},
    {"sharding": "zero3"},
    {"sharding": "fsdp", "recompute": "full"},
    {"sharding": "hsdp", "shard_group_size": 2},
    {"sharding": "mics", "shard_group_size": 2, "recompute": "selective"},
    {"tp": 2, "sequence_parallel": True},
    {"tp": 2, "pp": 2, "sharding": "zero1"},
    {"pp": 4, "mb": 2},
    {"pp": 2, "pipeline_schedule": "interleaved", "virtual_stages": 2, "recompute": "full"},
    {"pp": 2, "pipeline_schedule": "gpipe"},
    {"pp": 2, "pipeline_schedule": "dualpipe"},
    {"tp": 2, "cp": 2, "sequence_parallel": True, "sharding": "zero1"},
]


def _layout_scenario(layout: dict[str, Any], model: str = "gpt3-1.3b") -> Scenario:
    spec = dict(layout)
    return _scenario(model, mb=spec.pop("mb", 1), recompute=spec.pop("recompute", "none"), **spec)


@pytest.fixture(scope="module")
def simulated() -> list[tuple[dict[str, Any], Scenario, Any]]:
    """GPT-3 XL and 2.7B on one g5.12xlarge (4 x A10G 24 GB): some layouts fit, some do not."""
    out = []
    for model in ("gpt3-1.3b", "gpt3-2.7b"):
        for layout in LAYOUTS:
            scenario = _layout_scenario(layout, model)
            out.append((layout, scenario, simulator.simulate(scenario)))
    return out


# ----------------------------------------------------------------------------------------
# memory pre-filter


def test_memory_estimate_is_a_lower_bound_that_agrees_with_the_simulators_verdict(simulated):
    verdicts = set()
    for layout, scenario, result in simulated:
        est = estimate_peak_memory(scenario)
        assert est.capacity_bytes == result.gpu_memory_bytes
        assert est.peak_bytes <= result.peak_memory_bytes * (1 + 1e-9), (layout, est.peak_bytes, result.peak_memory_bytes)
        if not est.fits:  # what the pre-filter prunes really does not fit
            assert result.oom, layout
        if not result.oom:
            assert est.fits, layout
        verdicts.add(result.oom)
        # tight where nothing is gathered on the fly: within 2 % of the simulated peak
        if scenario.parallelism.sharding in ("none", "zero1", "zero2"):
            assert est.peak_bytes >= 0.98 * result.peak_memory_bytes, (layout, est.peak_bytes / result.peak_memory_bytes)
        else:
            assert est.peak_bytes >= 0.7 * result.peak_memory_bytes, (layout, est.peak_bytes / result.peak_memory_bytes)
    assert verdicts == {True, False}  # the set has both verdicts


def test_memory_estimate_by_hand_for_ddp():
    """GPT-3 XL, DDP, one micro-batch of 1 x 2048 on one A10G: 16 bytes of states per parameter,
    a gradient-sized bucket copy (2 bytes/param), the CUDA context, 24 layers of activations
    (Korthikanti: s*b*h*(34 + 5*a*s/h) without flash; FlashAttention keeps 34*s*b*h + LSE),
    plus the embedding output and logits."""
    from simulator.workload.layout import ModelLayout

    sc = _scenario("gpt3-1.3b")
    est = estimate_peak_memory(sc)
    params = ModelLayout(sc).counts.total
    assert params == pytest.approx(1.3e9, rel=0.02)
    assert est.states_bytes == 16 * params
    assert est.buffers_bytes == 2 * params + GIB
    s, h, layers, a, vocab = 2048, 2048, 24, 16, 50257
    per_layer = 34 * s * h + 4 * a * s  # 16-bit tensors and masks, plus the fp32 log-sum-exp
    stored = layers * per_layer + 3 * s * h + (2 * s * h + 4 * s * vocab)
    workspace = s * (2 * 4 * h + 2 * h) * 2  # gradients of the MLP intermediate, layer input and output
    assert est.activations_bytes == pytest.approx(stored + max(0, workspace - 4 * s * vocab - 2 * s * h), rel=1e-9)


def test_in_flight_micro_batches_per_schedule():
    assert in_flight_chunks("gpipe", 4, 0, 16) == 16
    assert [in_flight_chunks("1f1b", 4, s, 16) for s in range(4)] == [4, 3, 2, 1]
    assert in_flight_chunks("1f1b", 4, 0, 2) == 2
    # Megatron's interleaved warm-up (p - s - 1) * 2 + (v - 1) * p, plus the steady-state forward
    assert in_flight_chunks("interleaved", 4, 0, 16, 2) == 3 * 2 + 1 * 4 + 1


# ----------------------------------------------------------------------------------------
# step bound and short-run prediction


def test_step_bound_never_exceeds_the_simulated_step(simulated):
    for layout, scenario, result in simulated:
        bound = step_bound_s(scenario)
        assert 0 < bound <= result.step_time_s * (1 + 1e-9), (layout, bound, result.step_time_s)
        assert bound >= 0.5 * result.step_time_s, layout  # and it is not vacuous


@pytest.mark.parametrize("layout", [
    {"pp": 2, "mb": 1},
    {"pp": 2, "pipeline_schedule": "interleaved", "virtual_stages": 2},
    {"sharding": "fsdp"},
    {"tp": 2, "sequence_parallel": True, "sharding": "zero1"},
])
def test_two_short_runs_predict_the_whole_step(layout):
    sc = _scenario(gb=64, **{k: v for k, v in layout.items() if k != "mb"})
    probe = probe_micro_batches(sc)
    assert probe is not None
    m1, m2 = probe
    s1 = simulator.simulate(_with_micro_batches(sc, m1))
    s2 = simulator.simulate(_with_micro_batches(sc, m2))
    whole = simulator.simulate(sc)
    m = sc.micro_batches
    predicted = s1.step_time_s + (m - m1) * (s2.step_time_s - s1.step_time_s) / (m2 - m1)
    assert predicted == pytest.approx(whole.step_time_s, rel=1e-6)
    assert s1.peak_memory_bytes == pytest.approx(whole.peak_memory_bytes, rel=1e-9)


# ----------------------------------------------------------------------------------------
# search


def _base(model: str = "gpt3-2.7b", node: str = "g5.12xlarge", nodes: int = 1, gb: int = 32) -> Scenario:
    return _scenario(model, node, nodes, gb=gb)


SMALL = SearchSpace(max_micro_batch=2)


def test_search_finds_a_feasible_layout_that_beats_naive_data_parallelism():
    """GPT-3 2.7B does not fit in 24 GB under DDP (16 bytes/param = 43 GB); the search finds
    a layout that fits, is simulated whole, and says why it wins."""
    report = search(_base(), executor=InlineExecutor(), space=SMALL, top=3)
    assert report.baseline is not None and report.baseline["verdict"] == "out of memory"
    assert report.ranked, "no feasible layout"
    best = report.ranked[0]
    assert not best.metrics["oom"] and best.metrics["error"] is None
    assert best.metrics["peak_memory_bytes"] <= best.metrics["gpu_memory_bytes"]
    assert best.metrics["memory_headroom_bytes"] >= 0
    assert [r.metrics["tokens_per_s"] for r in report.ranked] == sorted(
        (r.metrics["tokens_per_s"] for r in report.ranked), reverse=True)
    # every layout is accounted for: pruned, bounded out, or estimated (retries re-enter the queue)
    assert report.enumerated == report.invalid + report.over_memory + report.candidates
    assert report.candidates + report.retried == report.estimated + report.bounded_out + report.capped
    lines = explain(report)
    assert "does not fit" in lines[-1] and "runner-up" in lines[1]


def test_search_with_model_parallelism_only():
    """Without sharding the only way to fit 2.7B is tensor or pipeline parallelism."""
    report = search(_base(), executor=InlineExecutor(), space=SearchSpace(max_micro_batch=2, shardings=("none",)),
                    top=2)
    best = report.ranked[0]
    assert best.candidate.layout.tp * best.candidate.layout.pp > 1
    assert not best.metrics["oom"]


def test_branch_and_bound_keeps_the_brute_force_best():
    base = _base("gpt3-1.3b")
    space = SearchSpace(max_micro_batch=1, shardings=("none", "zero1", "fsdp"), virtual_stages=(2,))
    exhaustive = search(base, executor=InlineExecutor(), space=space, top=1000)  # everything estimated and confirmed
    assert exhaustive.bounded_out == 0
    pruned = search(base, executor=InlineExecutor(), space=space, top=3)
    assert pruned.estimated < exhaustive.estimated  # the bound saved work
    assert [r.label for r in pruned.ranked] == [r.label for r in exhaustive.ranked[:3]]
    assert [r.metrics["step_time_s"] for r in pruned.ranked] == [r.metrics["step_time_s"] for r in exhaustive.ranked[:3]]
    # every estimated candidate's prediction is above the bound it was queued with
    for label, step in exhaustive.predictions:
        assert step is not None and step > 0, label


def test_enumeration_follows_the_space_rules():
    base = _scenario("llama3-8b", "p5.48xlarge", 2, gb=64)
    layouts = list(enumerate_layouts(base, SearchSpace(max_micro_batch=4)))
    assert layouts
    for lay in layouts:
        assert lay.tp <= 8 and lay.tp & (lay.tp - 1) == 0  # powers of two within a node
        assert lay.tp * lay.pp * lay.cp * lay.dp == 16
        assert 8192 // lay.cp >= 4096
        assert lay.micro_batch <= 4 and 64 % (lay.micro_batch * lay.dp) == 0
        assert lay.schedule in ("1f1b", "interleaved")
        assert lay.pp > 1 or lay.schedule == "1f1b"
        assert lay.sharding == "none" or lay.dp * lay.cp > 1
        if lay.sharding in ("hsdp", "mics"):
            assert lay.shard_group_size == 8 // (lay.tp * lay.cp) and lay.dp % lay.shard_group_size == 0


def test_objectives_differ_when_the_cluster_size_varies():
    """Two nodes are faster; one node is cheaper per token (scaling efficiency below 1)."""
    base = _scenario("gpt3-1.3b", "p4d.24xlarge", 1, gb=64)
    space = SearchSpace(nodes=(1, 2), max_micro_batch=2, shardings=("none", "zero1"))
    fast = search(base, executor=InlineExecutor(), space=space, top=1, objective="throughput", prices=load_prices())
    cheap = search(base, executor=InlineExecutor(), space=space, top=1, objective="cost", prices=load_prices())
    quick = search(base, executor=InlineExecutor(), space=space, top=1, objective="time-to-train",
                   prices=load_prices())
    assert fast.ranked[0].candidate.layout.nodes == 2 and cheap.ranked[0].candidate.layout.nodes == 1
    assert quick.ranked[0].label == fast.ranked[0].label
    assert cheap.ranked[0].cost_usd < fast.ranked[0].cost_usd
    assert cheap.ranked[0].time_to_train_s > fast.ranked[0].time_to_train_s


# ----------------------------------------------------------------------------------------
# prices and time to train


def test_time_and_cost_to_train_by_hand():
    price = NodePrice(usd_per_hour=32.77, date="x", source="y")
    params = 1.3e9
    tokens = chinchilla_tokens(params)
    assert tokens == CHINCHILLA_TOKENS_PER_PARAM * params == 26e9
    seconds = time_to_train_s(tokens, 200_000.0)  # 26e9 / 2e5 = 130,000 s
    assert seconds == pytest.approx(130_000.0)
    assert training_cost_usd(seconds, 4, price) == pytest.approx(130_000 / 3600 * 4 * 32.77)


def test_price_table_has_every_node_it_promises_with_sources(tmp_path):
    table = load_prices()
    for node in ("p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p3.16xlarge", "p3dn.24xlarge", "g5.12xlarge",
                 "g5.48xlarge", "dgx-a100", "dgx-h100"):
        price = table.get(node)
        assert price is not None and price.usd_per_hour > 0 and price.source and price.date, node
    assert table.get("dgx-h100").kind == "estimate"  # bought, not rented  # type: ignore[union-attr]
    own = tmp_path / "prices.yaml"
    own.write_text("prices:\n  p5.48xlarge: {usd_per_hour: 55.04, kind: reserved, date: '2025-07', source: me}\n")
    merged = load_prices(own)
    assert merged.get("p5.48xlarge").usd_per_hour == 55.04  # type: ignore[union-attr]
    assert merged.get("p4d.24xlarge").usd_per_hour == table.get("p4d.24xlarge").usd_per_hour  # type: ignore[union-attr]


# ----------------------------------------------------------------------------------------
# CLI


def _write_base(tmp_path: Path, node: str = "g5.12xlarge") -> Path:
    path = tmp_path / "base.yaml"
    path.write_text(f"model: gpt3-2.7b\ncluster: {{node: {node}, nodes: 1}}\n"
                    "training: {micro_batch: 1, global_batch: 32}\n")
    return path


def test_cli_search_prints_a_ranked_table_and_why(cli, tmp_path):
    prices = tmp_path / "prices.yaml"
    prices.write_text("prices:\n  g5.12xlarge: {usd_per_hour: 10.0, date: '2026-01', source: test}\n")
    out = tmp_path / "out"
    result = cli("search", _write_base(tmp_path), "--executor", "serial", "--top", "3", "--max-micro-batch", "2",
                 "--tokens", "1B", "--prices", prices, "--objective", "cost", "--out", out)
    assert result.exit_code == 0, result.output
    text = result.output
    assert "best by cost" in text and "why the best wins" in text and "does not fit" in text
    assert "g5.12xlarge at $10.00 per node-hour" in text and "1e+09 tokens" in text
    import json

    document = json.loads((out / "search.json").read_text())
    best = document["ranked"][0]
    days = best["time_to_train_s"] / 86400
    assert best["cost_usd"] == pytest.approx(days * 24 * 1 * 10.0)
    assert best["time_to_train_s"] == pytest.approx(1e9 / best["metrics"]["tokens_per_s"])


def test_cli_search_bad_input(cli, tmp_path):
    base = _write_base(tmp_path, node="dgx-h200")
    result = cli("search", base, "--objective", "cost", "--executor", "serial")
    assert result.exit_code == 2 and "no price for node type 'dgx-h200'" in result.output
    result = cli("search", base, "--objective", "speed")
    assert result.exit_code == 2 and "--objective 'speed'" in result.output
    result = cli("search", base, "--tokens", "lots")
    assert result.exit_code == 2 and "--tokens 'lots'" in result.output
