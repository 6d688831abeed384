"""The public interface of CONTRACT.md, as a user's script would use it."""

import json

import pytest

import simulator
from tests.conftest import small_scenario


def test_contract_api(root):
    scenario = simulator.load_scenario(root / "scenarios/quickstart.yaml", overrides=["cluster.nodes=2"])
    same = simulator.Scenario.model_validate(small_scenario(model="gpt3-1.3b", training={
        "micro_batch": 4, "global_batch": 128}))
    assert isinstance(same, simulator.Scenario)
    result = simulator.simulate(scenario)
    assert isinstance(result, simulator.Result)
    for field in ("step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "hfu", "peak_memory_bytes", "oom",
                  "params", "memory", "breakdown"):
        assert hasattr(result, field), field
    entry = result.memory[0]
    for field in ("rank", "params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "buffers_bytes",
                  "peak_bytes"):
        assert hasattr(entry, field), field
    data = json.loads(result.model_dump_json())
    assert data["scenario_hash"] == scenario.content_hash() and data["simulator_version"] == simulator.__version__
    assert "uncalibrated" in data["calibration"] and "PaLM" in data["flops_convention"]
    seconds = simulator.simulate_collective(cluster={"node": "p4de.24xlarge", "nodes": 2}, op="all_reduce",
                                            nbytes=2**30, algorithm=None)
    assert 0.02 < seconds < 0.03  # nccl-tests: 26.2 ms


def test_breakdown_adds_up_to_the_step(root):
    result = simulator.simulate(simulator.load_scenario(root / "scenarios/quickstart.yaml"))
    b = result.breakdown
    total = b.compute_s + sum(b.exposed_comm_s.values()) + b.bubble_s + b.idle_s
    assert total == pytest.approx(result.step_time_s, rel=1e-9)


def test_throughput_and_mfu_are_consistent(root):
    """tokens/s = global batch x seq / step; MFU = model FLOPs / (step x world x peak)."""
    sc = simulator.load_scenario(root / "scenarios/quickstart.yaml")
    r = simulator.simulate(sc)
    assert r.tokens_per_s == pytest.approx(sc.training.global_batch * sc.model.seq_len / r.step_time_s)
    assert r.mfu == pytest.approx(r.model_flops_per_step / (r.step_time_s * r.world_size * 312e12))
    assert r.hfu == pytest.approx(r.mfu)  # no recomputation
