"""Routed-expert gradients are reduced, and their ZeRO shards gathered, over the expert
data-parallel group, the dense ones over dp (Megatron-Core: ``expert_parallel_buffers`` on
``intra_expt_dp_group``, megatron/core/distributed/distributed_data_parallel.py:191-330 at
NVIDIA/Megatron-LM@d98e8a64).

Mixtral 8x7B on 2 p5.48xlarge (16 H100), ep 8, pp 1 (tests/test_moe.py): dp = 16,
edp = 16 / 8 = 2, rank 0's edp group {0, 8} (etp x ep = 8 consecutive ranks per expert replica).
Rank 0 holds 1 expert per layer: 32 * 176,160,768 = 5,637,144,576 expert parameters; dense
parameters = total 46,702,792,704 less all 32 * 8 experts (45,097,156,608) = 1,605,636,096.
Gradients in fp32 (4 B): dense 6,422,544,384 B, experts 22,548,578,304 B."""

from __future__ import annotations

import simulator
from tests.test_moe import mixtral

DENSE, EXPERT = 1_605_636_096, 5_637_144_576
GROUP16, EDP = tuple(range(16)), (0, 8)


def _rows(sim: simulator.Simulation, prefix: str) -> list:
    return [r for r in sim.rows if r.rank == 0 and r.name.startswith(prefix) and r.comm is not None]


def test_distributed_optimizer_reduces_and_gathers_experts_over_expert_dp() -> None:
    """zero1, Megatron-Core bucketing, no overlap: one bucket per buffer. Reduce-scatter dense
    6,422,544,384 B over the 16 dp ranks, experts 22,548,578,304 B over edp {0, 8}; the optimizer
    steps on 1,605,636,096 / 16 + 5,637,144,576 / 2 = 100,352,256 + 2,818,572,288 = 2,918,924,544
    parameters (was 7,242,780,672 / 16 = 452,673,792 over dp); the bf16 all-gather moves dense
    3,211,272,192 B over dp and experts 11,274,289,152 B over edp. The expert ring on 2 ranks sends
    1/2 of its bytes, 11.27 GB over EFA, against 15/16 of 6.4 GB on the 16-rank group."""
    sim = simulator.run_simulation(mixtral(parallelism__zero={"bucketing": "megatron-core",
                                                              "gradient_reduction": "reduce_scatter"},
                                           training__grad_reduce_dtype="fp32"))
    assert [(r.comm.group, r.comm.nbytes) for r in _rows(sim, "zero.reduce_scatter")] == \
        [(GROUP16, DENSE * 4), (EDP, EXPERT * 4)]
    assert [(r.comm.group, r.comm.nbytes) for r in _rows(sim, "zero.param_allgather")] == \
        [(GROUP16, DENSE * 2), (EDP, EXPERT * 2)]
    optimizer = [r for r in sim.rows if r.rank == 0 and r.name == "optimizer"]
    assert len(optimizer) == 1 and optimizer[0].info.params == DENSE / 16 + EXPERT / 2 == 2_918_924_544


def test_ddp_all_reduces_expert_buckets_over_expert_dp() -> None:
    """sharding none (25 MiB buckets): every byte of the dense gradients is all-reduced over the 16
    ranks, every byte of the experts' over edp {0, 8}, none of them both."""
    sim = simulator.run_simulation(mixtral(parallelism__sharding="none", training__grad_reduce_dtype="fp32"))
    rows = _rows(sim, "dp.allreduce")
    assert {r.comm.group for r in rows} == {GROUP16, EDP}
    assert sum(r.comm.nbytes * r.comm.count for r in rows if r.comm.group == GROUP16) == DENSE * 4
    assert sum(r.comm.nbytes * r.comm.count for r in rows if r.comm.group == EDP) == EXPERT * 4


def test_expert_dp_larger_than_dp_with_tensor_parallelism() -> None:
    """tp 4, ep 2, etp 1 on 16 GPUs: dp = 16 / 4 = 4 (rank 0's group {0, 4, 8, 12}), edp = 16 / 2 = 8
    (etp x ep = 2 consecutive ranks per expert replica: {0, 2, ..., 14}). Rank 0 holds 8 / 2 = 4 experts
    per layer, 32 * 4 * 176,160,768 = 22,548,578,304 expert parameters (90,194,313,216 B in fp32),
    reduce-scattered over the 8 edp ranks although dp is 4; the optimizer steps on the dense shard
    (its reduce-scatter bytes / 4 B / 4 ranks) + 22,548,578,304 / 8 = 2,818,572,288 expert parameters."""
    sim = simulator.run_simulation(mixtral(parallelism__tp=4, parallelism__ep=2, parallelism__etp=1,
                                           parallelism__sequence_parallel=True,
                                           parallelism__zero={"bucketing": "megatron-core",
                                                              "gradient_reduction": "reduce_scatter"},
                                           training__grad_reduce_dtype="fp32"))
    dense, expert = _rows(sim, "zero.reduce_scatter")
    assert dense.comm.group == (0, 4, 8, 12)
    assert expert.comm.group == tuple(range(0, 16, 2)) and expert.comm.nbytes == 4 * 22_548_578_304
    optimizer = [r for r in sim.rows if r.rank == 0 and r.name == "optimizer"]
    assert optimizer[0].info.params == dense.comm.nbytes / 4 / 4 + 22_548_578_304 / 8
