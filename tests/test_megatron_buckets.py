"""Megatron-Core's gradient / parameter buckets for the distributed optimizer
(``parallelism.zero.bucketing: megatron-core``, ``zero.bucket_size_per_dp_rank``).

GPT-3 125M (tp 1) per layer: ln1 1,536 + qkv 1,771,776 + proj 590,592 + ln2 1,536
+ fc1 2,362,368 + fc2 2,360,064 = 7,087,872 elements; embedding 50257*768 + 2048*768 =
40,170,240 (word + learned positions); final norm 1,536; output = the word embedding
50257*768 = 38,597,376 (tied). Gradients are reduced in fp32 (4 bytes), parameters gathered
in bf16 (2 bytes).
"""

import pytest

import simulator
from simulator.workload.data_parallel.buckets import Param, megatron_buckets
from tests.conftest import small_scenario

LAYER = 7_087_872
ZERO = {"gradient_reduction": "reduce_scatter", "overlap_comm": True, "bucketing": "megatron-core",
        "reduce_bucket_size": 40_000_000, "allgather_bucket_size": 40_000_000, "overlap_param_gather": True}


def _sim(pp: int = 1, per_rank: int = 0) -> simulator.Simulation:
    """2 x p4d (16 GPUs): dp 16 at pp 1, dp 8 at pp 2; micro-batch 4, global batch 128."""
    par = {"pp": pp, "sharding": "zero1", "zero": {**ZERO, "bucket_size_per_dp_rank": per_rank}}
    training = {"micro_batch": 4, "global_batch": 128, "grad_reduce_dtype": "fp32"}
    return simulator.run_simulation(simulator.Scenario.model_validate(
        small_scenario(parallelism=par, training=training)))


def _dp(sim: simulator.Simulation, rank: int, name: str) -> list:
    return sorted((r for r in sim.rows if r.rank == rank and r.name == name), key=lambda r: r.start_s)


def test_buckets_close_at_the_cap_walking_backwards_and_the_shared_embedding_goes_alone():
    """Definition order e(100) a(30) b(30) c(50) d(10), cap 60: walking back d + c = 60 closes
    the first bucket, b + a = 60 the second, e the third. With e in a bucket of its own and cap
    100: d + c + b = 90 < 100, + a = 120 closes one, e alone; with b alone: d + c, b, a + e."""
    params = [Param("e", 100, 0), Param("a", 30, 1), Param("b", 30, 1), Param("c", 50, 2), Param("d", 10, 2)]
    names = [[p.name for p in b.params] for b in megatron_buckets(params, 60)]
    assert names == [["d", "c"], ["b", "a"], ["e"]]
    assert [b.elements for b in megatron_buckets(params, 60)] == [60, 60, 100]
    assert [[p.name for p in b.params] for b in megatron_buckets(params, 100, frozenset({"e"}))] == \
        [["d", "c", "b", "a"], ["e"]]
    assert [[p.name for p in b.params] for b in megatron_buckets(params, 100, frozenset({"b"}))] == \
        [["d", "c"], ["b"], ["a", "e"]]
    assert [[p.name for p in b.params] for b in megatron_buckets(params, None)] == [["d", "c", "b", "a", "e"]]


def test_bucket_size_grows_with_data_parallel_size():
    """max(40M, per_rank * dp) at dp 16: 40M with 1M per rank, 48M with 3M per rank.

    40M (the existing overlap_param_gather test): norm + layers 11..7 + l6.fc2 + l6.fc1 =
    40,163,328; the rest of l6 + layers 5..1 + l0.fc2 = 40,164,864; the rest 44,898,048.
    48M: norm + layers 11..6 (42,528,768) + l5 fc2, fc1, ln2, proj, qkv = 49,615,104 >= 48M;
    the rest, l5.ln1 + layers 4..0 + the embedding, = 75,611,136."""
    small = _sim(per_rank=1_000_000)
    assert [r.comm.nbytes for r in _dp(small, 0, "zero.reduce_scatter")] == \
        [40_163_328 * 4, 40_164_864 * 4, 44_898_048 * 4]
    big = _sim(per_rank=3_000_000)
    assert [r.comm.nbytes for r in _dp(big, 0, "zero.reduce_scatter")] == [49_615_104 * 4, 75_611_136 * 4]
    assert [r.comm.nbytes for r in _dp(big, 0, "zero.param_allgather")] == [75_611_136 * 2, 49_615_104 * 2]


def test_first_stage_reduces_each_bucket_when_ready_in_the_last_backward_only():
    """dp 16, 2 micro-batches: nothing is reduced during micro-batch 0's backward (no_sync);
    in micro-batch 1's, the first bucket (down to l6.fc1) starts when layer 6's backward ends,
    the second (down to l0.fc2) when layer 0's does, the third (the embedding) after it."""
    sim = _sim(per_rank=1_000_000)
    reduces = _dp(sim, 0, "zero.reduce_scatter")
    bwd = [r for r in sim.rows if r.rank == 0 and r.category == "compute" and r.info and r.info.phase == "bwd"]
    last_start = min(r.start_s for r in bwd if r.info.mb == 1)
    assert all(r.start_s >= last_start for r in reduces)

    def end_of(layer: int) -> float:  # the fused backward task holding this layer, last micro-batch
        return next(r.end_s for r in bwd if r.info.mb == 1 and r.info.layer is not None
                    and r.info.layer >= layer and layer >= _first_layer(r))
    assert reduces[0].start_s == pytest.approx(end_of(6))
    assert reduces[1].start_s == pytest.approx(max(end_of(0), reduces[0].end_s))
    assert reduces[2].start_s >= reduces[1].end_s - 1e-12


def _first_layer(row) -> int:
    """The lowest block a fused backward task runs ('bwd.block5..block0' -> 0)."""
    last = row.name.split("..")[-1]
    return int(last.removeprefix("block")) if last.startswith("block") else -1


def test_later_pipeline_stages_use_one_bucket_gathered_at_the_start_and_reduced_after_the_backward():
    """pp 2, dp 8. Stage 1 (layers 6..11, final norm, output): the tied output weight alone
    (1,536 + 38,597,376 = 38,598,912, the final norm shares its Param here) and everything else
    in one bucket (6 x 7,087,872 = 42,527,232). Its all-gather of the layers starts at t = 0,
    before its input arrives, the output weight's after it; both reduce-scatters start when the
    stage's last backward ends. Stage 0 (cap max(40M, 8M)): l5..l1 + l0.fc2 + l0.fc1 =
    40,161,792; the rest of l0 = 2,365,440; the embedding alone = 40,170,240."""
    sim = _sim(pp=2, per_rank=1_000_000)
    first_rank, last_rank = sorted({r.rank for r in sim.rows})  # one simulated rank per stage
    gathers = _dp(sim, last_rank, "zero.param_allgather")
    assert [g.comm.nbytes for g in gathers] == [42_527_232 * 2, 38_598_912 * 2]
    assert gathers[0].start_s == 0.0 and all(g.comm.ranks == 8 for g in gathers)
    reduces = _dp(sim, last_rank, "zero.reduce_scatter")
    assert [r.comm.nbytes for r in reduces] == [38_598_912 * 4, 42_527_232 * 4]
    last_bwd = max(r.end_s for r in sim.rows if r.rank == last_rank and r.category == "compute" and r.info
                   and r.info.phase == "bwd")
    assert reduces[0].start_s == pytest.approx(last_bwd)
    first = _dp(sim, first_rank, "zero.reduce_scatter")
    assert [r.comm.nbytes for r in first] == [40_161_792 * 4, 2_365_440 * 4, 40_170_240 * 4]
    assert [g.comm.nbytes for g in _dp(sim, first_rank, "zero.param_allgather")] == \
        [40_170_240 * 2, 2_365_440 * 2, 40_161_792 * 2]


def _sim_checks(nan_check: bool, prescale: bool) -> simulator.Simulation:
    """As _sim (dp 16, 40M buckets) with Megatron's per-bucket passes switched."""
    par = {"sharding": "zero1", "zero": {**ZERO, "bucket_size_per_dp_rank": 1_000_000,
                                         "grad_nan_check": nan_check, "grad_prescale": prescale}}
    training = {"micro_batch": 4, "global_batch": 128, "grad_reduce_dtype": "fp32"}
    return simulator.run_simulation(simulator.Scenario.model_validate(
        small_scenario(parallelism=par, training=training)))


def test_gradient_buffer_is_zeroed_once_per_step_before_the_first_forward():
    """zero_grad_buffer writes the whole fp32 buffer once: 125,226,240 elements x 4 B =
    500,904,960 B, at A100-40GB's 1,555 GB/s x 0.85 plus the 4 us launch = 382.97 us, and
    the step's first forward starts after it."""
    sim = _sim_checks(False, False)
    zeroing = _dp(sim, 0, "zero_grad_buffer")
    assert len(zeroing) == 1
    kernel = zeroing[0].info.kernels[0]
    assert kernel.nbytes == 125_226_240 * 4
    assert kernel.time_s == pytest.approx(500_904_960 / (1555e9 * 0.85) + 4e-6)
    fwd = [r for r in sim.rows if r.rank == 0 and r.info and r.info.phase == "fwd"]
    assert min(r.start_s for r in fwd) >= zeroing[0].end_s - 1e-12
    assert not _dp(sim, 0, "bucket.grad_checks")


@pytest.mark.parametrize(("nan_check", "prescale", "passes"), [(True, False, 1), (False, True, 2), (True, True, 3)])
def test_bucket_norm_and_prescale_passes_run_before_each_reduce_scatter(nan_check: bool, prescale: bool,
                                                                          passes: int) -> None:
    """Megatron's start_grad_sync reads each fp32 bucket once for the NaN norm and reads and
    writes it for the 1/dp scaling: 1, 2 or 3 x the bucket's bytes (buckets 40,163,328,
    40,164,864 and 44,898,048 elements x 4 B), each before that bucket's reduce-scatter."""
    sim = _sim_checks(nan_check, prescale)
    checks = _dp(sim, 0, "bucket.grad_checks")
    reduces = _dp(sim, 0, "zero.reduce_scatter")
    assert [c.info.kernels[0].nbytes for c in checks] == \
        [passes * 4 * n for n in (40_163_328, 40_164_864, 44_898_048)]
    assert all(r.start_s >= c.end_s - 1e-12 for c, r in zip(checks, reduces, strict=True))
