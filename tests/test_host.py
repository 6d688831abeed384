"""Host-side issue costs (simulator/costs/host.py): the arithmetic, the layer timing, a run."""

from __future__ import annotations

import pytest

import simulator
from simulator.costs.compute import ComputeProfile, EfficiencyCurve
from simulator.costs.host import NO_HOST, HostCosts, host_time_s, issue_bound_time_s
from simulator.workload.model import Kernel
from simulator.workload.steps import CommStep, ComputeStep, timed

FLAT = EfficiencyCurve((0.0, 20.0), (0.5, 0.5))
# 1e12 FLOP/s peak at 50%, 1e12 B/s HBM at 100%, 4 us launch overhead per kernel
PROFILE = ComputeProfile("test", {"bf16": 1e12}, 1e12, {"bf16": FLAT}, {"bf16": FLAT}, {"bf16": FLAT},
                         memory_efficiency=1.0, launch_overhead_s=4e-6)


def _tiny(n: int) -> ComputeStep:
    """n memory kernels of 1,000 bytes: 1e3 / 1e12 = 1 ns + 4 us launch each."""
    return ComputeStep("tiny", tuple(Kernel(f"k{i}", "memory", 0.0, 1e3) for i in range(n)))


def test_host_time_and_issue_bound_arithmetic():
    """12 ops at 10 us + 5 us of fixed work = 125 us; a task lasts the slower stage."""
    costs = HostCosts(op_s=10e-6)
    assert host_time_s(12, costs, 5e-6) == pytest.approx(125e-6)
    assert issue_bound_time_s(3e-3, 125e-6) == 3e-3
    assert issue_bound_time_s(40e-6, 125e-6) == 125e-6
    with pytest.raises(ValueError):
        HostCosts(op_s=-1.0)


def test_layer_of_short_kernels_takes_n_times_issue_time():
    """10 kernels of 4.001 us on the GPU (40.01 us) issued at 10 us each: the step takes 10 x 10 us = 100 us."""
    [step] = timed([_tiny(10)], PROFILE, "bf16", 2, HostCosts(op_s=10e-6))
    assert step.duration_s == pytest.approx(100e-6)
    [no_host] = timed([_tiny(10)], PROFILE, "bf16", 2, NO_HOST)
    assert no_host.duration_s == pytest.approx(10 * (4e-6 + 1e-9))


def test_gpu_bound_layer_keeps_its_roofline_time():
    """One GEMM of 1e9 FLOPs at 0.5e12 FLOP/s = 2 ms + 4 us launch, far above one 10 us issue."""
    gemm = Kernel("g", "gemm", 1e9, 0.0, (1e3, 1e3, 5e2))
    [step] = timed([ComputeStep("big", (gemm,))], PROFILE, "bf16", 2, HostCosts(op_s=10e-6))
    assert step.duration_s == pytest.approx(2e-3 + 4e-6)


def test_host_bound_layer_stretches_its_steps_alike():
    """Two compute steps of 3 tiny kernels (12.003 us of GPU each) around a collective, 50 us of
    fixed host work: the pass's host time is 6 x 10 + 50 = 110 us against 24.006 us of GPU, so
    each step lasts 110 / 2 = 55 us; one step of the same 6 kernels lasts the same 110 us."""
    steps = [_tiny(3), CommStep("ar", "all_reduce", 1e6), _tiny(3)]
    first, comm, second = timed(steps, PROFILE, "bf16", 2, HostCosts(op_s=10e-6), 50e-6)
    assert first.duration_s == pytest.approx(55e-6)
    assert comm.duration_s == 0.0
    assert second.duration_s == pytest.approx(55e-6)
    [whole] = timed([_tiny(6)], PROFILE, "bf16", 2, HostCosts(op_s=10e-6), 50e-6)
    assert whole.duration_s == pytest.approx(110e-6)


SMALL = ["cluster.nodes=1", "cluster.gpus_per_node=1", "training.micro_batch=1", "model.layers=2",
         "model.hidden=256", "model.heads=4", "model.seq_len=128", "model.vocab=1024"]


def _step(extra: list[str]) -> simulator.Simulation:
    return simulator.run_simulation(simulator.load_scenario("scenarios/quickstart.yaml", SMALL + extra))


def test_issue_bound_run_counts_every_launched_op():
    """One GPU, 2 layers of a 256-wide model, one micro-batch, 1 ms per op (every kernel is far shorter).
    Ops: forward embedding 1 + 2 blocks x 10 + logits 3 (final norm, GEMM, loss) = 24; backward
    logits 4 (GEMM twice) + 2 blocks x 14 (4 GEMMs twice, attention, 5 memory kernels) + embedding 1
    = 33; so 57 ms before the optimizer step. A per-step host gap of 2 ms adds 2 ms; two micro-batches
    with 3 ms of per-micro-batch host work each add 57 ms (the second micro-batch) + 2 x 3 ms."""
    base = _step(["training.global_batch=1", "training.host.op_issue=1ms"])
    optimizer = next(r for r in base.rows if r.name == "optimizer")
    assert optimizer.start_s == pytest.approx(57e-3)
    gap = _step(["training.global_batch=1", "training.host.op_issue=1ms", "training.host.per_step=2ms"])
    assert gap.result.step_time_s == pytest.approx(base.result.step_time_s + 2e-3)
    two = _step(["training.global_batch=2", "training.host.op_issue=1ms", "training.host.per_microbatch=3ms"])
    assert two.result.step_time_s == pytest.approx(base.result.step_time_s + 57e-3 + 6e-3)


def test_switching_host_costs_off_restores_the_gpu_only_time():
    """enabled: false takes every host cost away (the costs are all zero), whatever the constants say."""
    on = _step(["training.global_batch=1", "training.host.op_issue=1ms"])
    off = _step(["training.global_batch=1", "training.host.op_issue=1ms", "training.host.enabled=false"])
    scenario = simulator.load_scenario("scenarios/quickstart.yaml", ["training.host.enabled=false"])
    assert scenario.training.host.costs() == NO_HOST
    assert off.result.step_time_s < 5e-3 < 57e-3 < on.result.step_time_s


def test_schema_documents_the_host_block():
    """`dtsim schema` lists training.host with its file keys (aliases) and their descriptions."""
    from simulator.scenario import scenario_json_schema

    schema = scenario_json_schema()
    host = schema["$defs"]["HostSpec"]["properties"]
    assert set(host) == {"enabled", "op_issue", "per_microbatch", "per_step"}
    assert "10 us" in host["op_issue"]["description"]
    assert "host" in schema["$defs"]["TrainingSpec"]["properties"]
