"""PyTorch DDP semantics: buckets, overlap with backward, communication on the last micro-batch."""

import pytest

import simulator
from simulator.workload.data_parallel.buckets import Param, assign_buckets
from tests.conftest import small_scenario

MiB = 2**20


def test_bucket_assignment_follows_pytorch():
    """Definition order, first bucket capped at 1 MiB, then 25 MiB, then reversed: the
    last-defined parameters (ready first in backward) are reduced first; a parameter larger
    than the cap fills a bucket alone."""
    params = [Param("embedding", 40 * MiB // 2, 0)] + [Param(f"w{i}", 5 * MiB // 2, i + 1) for i in range(12)]
    buckets = assign_buckets(params, 2, 25 * MiB, 1 * MiB)
    assert [len(b.params) for b in buckets] == [2, 5, 5, 1]
    assert buckets[-1].params[0].name == "embedding" and buckets[-1].nbytes == 40 * MiB
    assert buckets[0].params[-1].name == "w11" and buckets[0].ready_unit == 11


def _dp_rows(result):
    return [r for r in result.rows if r.category == "dp"]


def test_gradient_accumulation_communicates_once():
    one = simulator.simulate(simulator.Scenario.model_validate(small_scenario(
        training={"micro_batch": 8, "global_batch": 128})))
    four = simulator.simulate(simulator.Scenario.model_validate(small_scenario(
        training={"micro_batch": 2, "global_batch": 128})))
    assert four.micro_batches == 4 and one.micro_batches == 1
    assert sum(r.comm["bytes"] * r.comm["count"] for r in _dp_rows(one)) == pytest.approx(
        sum(r.comm["bytes"] * r.comm["count"] for r in _dp_rows(four)))
    last_backward_start = min(r.start_s for r in four.rows
                              if r.meta and r.meta.get("mb") == 3 and r.meta.get("phase") == "bwd")
    assert min(r.start_s for r in _dp_rows(four)) >= last_backward_start


def test_all_gradients_are_all_reduced_once_per_step():
    """The DP collectives of one step carry exactly the gradients: Psi x 2 bytes (bf16), where
    Psi = 125,226,240 for GPT-3 125M (12 x 7,087,872 per layer + 50257 x 768 tied embedding +
    2048 x 768 positions + final norm 1,536)."""
    r = simulator.simulate(simulator.Scenario.model_validate(small_scenario()))
    total = sum(row.comm["bytes"] * row.comm["count"] for row in _dp_rows(r))
    assert r.params == 12 * 7_087_872 + 50257 * 768 + 2048 * 768 + 1536
    assert total == pytest.approx(r.params * 2, rel=1e-6)
    assert all(row.comm["op"] == "all_reduce" and row.comm["ranks"] == 16 for row in _dp_rows(r))


def test_buckets_overlap_with_backward():
    r = simulator.simulate(simulator.Scenario.model_validate(small_scenario(model="gpt3-1.3b",
                           training={"micro_batch": 2, "global_batch": 32})))
    backward_end = max(row.end_s for row in r.rows if row.category == "compute" and row.meta.get("phase") == "bwd")
    first_dp = min(row.start_s for row in _dp_rows(r))
    assert first_dp < backward_end  # the first buckets go out while backward still runs
    assert r.breakdown.comm_s["dp"] > r.breakdown.exposed_comm_s["dp"]


def test_ddp_memory_counts_bucket_copies():
    """Model states 16 bytes/param (ZeRO accounting) + DDP bucket buffers 2 bytes/param."""
    r = simulator.simulate(simulator.Scenario.model_validate(small_scenario()))
    m = r.memory[0]
    assert m.params_bytes + m.grads_bytes + m.optimizer_bytes == pytest.approx(16 * r.params, rel=1e-3)
    assert m.buffers_bytes == pytest.approx(2 * r.params, rel=1e-3)
    view = simulator.simulate(simulator.Scenario.model_validate(small_scenario(
        parallelism={"ddp": {"gradient_as_bucket_view": True}})))
    assert view.memory[0].buffers_bytes == 0


def test_flow_and_analytical_agree_without_contention():
    """DDP buckets run one after another on one stream: nothing contends, so the flow model
    and the closed form give the same step."""
    flow = simulator.simulate(simulator.Scenario.model_validate(small_scenario()))
    closed = simulator.simulate(simulator.Scenario.model_validate(small_scenario(sim={"network": "analytical"})))
    assert flow.step_time_s == pytest.approx(closed.step_time_s, rel=1e-9)


def test_symmetry_reduction_is_exact_for_data_parallelism():
    on = simulator.simulate(simulator.Scenario.model_validate(small_scenario()))
    off = simulator.simulate(simulator.Scenario.model_validate(small_scenario(sim={"symmetry": "off"})))
    assert on.step_time_s == pytest.approx(off.step_time_s, rel=1e-9)
    assert on.engine["simulated_ranks"] == 1 and off.engine["simulated_ranks"] == 16
