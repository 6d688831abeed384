"""``parallelism.pp_microbatch_buffers``: torch.distributed.pipelining's per-micro-batch receive
buffers and kept outputs (torch/distributed/pipelining/stage.py at
pytorch/pytorch@88fa1e7170b48d369c6b00d545a89e97fb9e2e43: ``_prepare_forward_infra``,
``_create_grad_recv_info``, ``forward_one_chunk``'s ``output_chunks``), and the context-parallel
all-gather's backward workspace (``_AllGatherRotater``, torch/distributed/tensor/experimental/
_attention.py at pytorch/pytorch@f2127dbdb01fc9319ce42b92d60344d19cbd0137)."""

from collections import defaultdict

import pytest

import simulator
from simulator.workload.model import Shard
from simulator.workload.parallel import context
from simulator.workload.steps import LayerSpec
from tests.conftest import small_scenario

# GPT-3 125M, bf16, micro-batch 4 of 2048 tokens: a stage's boundary activation is
# 4 * 2048 * 768 * 2 B = 12,582,912 B; the last stage's logits 4 * 2048 * 50257 * 2 B = 823,410,688 B
ACT = 4 * 2048 * 768 * 2
LOGITS = 4 * 2048 * 50257 * 2


def _rows(buffers: bool) -> simulator.Simulation:
    """pp 2 on 2 x p4d (16 GPUs, dp 8): 128 / (4 * 8) = 4 micro-batches."""
    return simulator.run_simulation(simulator.Scenario.model_validate(small_scenario(
        parallelism={"pp": 2, "pp_microbatch_buffers": buffers})))


def _pp_deltas(sim: simulator.Simulation) -> dict[tuple[int, str], list[float]]:
    out: dict[tuple[int, str], list[float]] = defaultdict(list)
    for r in sim.rows:
        if r.name.startswith("pp."):
            out[(r.rank, r.name)] += [d for _t, d, _c in r.mem]
    return out


def test_each_stage_holds_a_receive_buffer_per_micro_batch_from_the_start():
    """4 micro-batches: the first stage receives only output gradients (4 buffers), the last
    only input activations (4 buffers), each 12,582,912 B, allocated at t = 0."""
    sim = _rows(True)
    deltas = _pp_deltas(sim)
    first, last = sorted({r.rank for r in sim.rows})[0], sorted({r.rank for r in sim.rows})[-1]
    assert deltas[(first, "pp.recv_buffers")] == [ACT] * 4
    assert deltas[(last, "pp.recv_buffers")] == [ACT] * 4
    assert all(t == 0.0 for r in sim.rows if r.name == "pp.recv_buffers" for t, _d, _c in r.mem)


def test_outputs_are_kept_until_the_step_ends_and_received_inputs_are_not_counted_twice():
    """Every forward keeps its output: the first stage its activation (12,582,912 B), the last
    its logits (823,410,688 B), four each, all freed after the optimizer step. While a
    micro-batch is in flight on the last stage its receive buffer is its first block's saved
    input: -12,582,912 B when the forward starts, back when its backward ends, with the input
    gradient left on the buffer's ``.grad`` (12,582,912 B more, freed when the step ends)."""
    sim = _rows(True)
    deltas = _pp_deltas(sim)
    ranks = sorted({r.rank for r in sim.rows})
    first, last = ranks[0], ranks[-1]
    assert deltas[(first, "pp.output_chunk")] == [ACT] * 4
    assert deltas[(last, "pp.output_chunk")] == [LOGITS] * 4
    assert deltas[(first, "pp.output_chunks.clear")] == [-ACT] * 4
    assert sorted(deltas[(last, "pp.output_chunks.clear")]) == [-LOGITS] * 4 + [-ACT] * 4
    assert deltas[(last, "pp.recv_buffer.in_use")] == [-ACT] * 4
    assert deltas[(last, "pp.recv_buffer.idle")] == [ACT] * 8
    assert (first, "pp.recv_buffer.in_use") not in deltas
    optimizer_end = max(r.end_s for r in sim.rows if r.rank == last and r.name == "optimizer")
    clear = next(r for r in sim.rows if r.rank == last and r.name == "pp.output_chunks.clear")
    assert clear.start_s >= optimizer_end


def test_the_last_stage_merges_its_outputs_into_one_tensor_after_its_last_backward():
    """``step`` returns the 4 micro-batches' logits concatenated: one allocation of
    4 * 823,410,688 B = 3,293,642,752 B at the copy's start, freed at its end, after the last
    backward and before the optimizer, on the last stage only; while it is live the 4 kept
    logits are too (they are freed when the step ends), so the last stage's peak is at least
    4 * 2 * 823,410,688 B = 6,587,285,504 B."""
    sim = _rows(True)
    last = max(r.rank for r in sim.rows)
    merges = [r for r in sim.rows if r.name == "pp.merge_outputs"]
    assert {r.rank for r in merges} == {last}
    (merge,) = merges
    assert merge.end_s > merge.start_s
    assert merge.mem == ((merge.start_s, 4 * LOGITS, "activations"), (merge.end_s, -4 * LOGITS, "activations"))
    last_backward = max(r.end_s for r in sim.rows if r.rank == last and r.info is not None and r.info.phase == "bwd"
                        and r.category == "compute")
    optimizer_start = min(r.start_s for r in sim.rows if r.rank == last and r.name == "optimizer")
    assert last_backward <= merge.start_s and merge.end_s <= optimizer_start
    assert sim.result.memory[-1].peak_bytes >= 8 * LOGITS
    assert not any(r.name == "pp.merge_outputs" for r in _rows(False).rows)


def test_the_buffers_change_memory_and_time_only_by_the_merge():
    """The buffers are zero-time markers; the only task they add is the last stage's merge
    copy, so the step grows by at most its time; the last stage's peak grows (its logits pile
    up until the step ends)."""
    sim, off = _rows(True), _rows(False).result
    on = sim.result
    (merge,) = [r for r in sim.rows if r.name == "pp.merge_outputs"]
    assert off.step_time_s <= on.step_time_s <= off.step_time_s + (merge.end_s - merge.start_s) + 1e-12
    assert on.memory[-1].peak_bytes > off.memory[-1].peak_bytes


def _spec(cp: int, cp_comm: str) -> LayerSpec:
    sc = simulator.Scenario.model_validate(small_scenario(model="llama3-8b"))
    shard = Shard(batch=1, seq=65536, tp=1, cp=cp, sequence_parallel=False, precision="bf16",
                  attention_kernel="fa2", fp8=None, compile=True, cross_entropy="eager-fp32")
    return LayerSpec(sc.model, shard, "block", "bwd", cp_comm=cp_comm, cp_kv_heads="repeated")


def test_the_allgather_ring_backward_holds_the_gathered_kv_and_fp32_gradients():
    """Llama 3 8B (32 heads of 128), 65,536 tokens over cp 8, K/V repeated to the query heads:
    kv = 2 * 8192 * 32 * 128 = 67,108,864 elements, q = 33,554,432. The gathered K/V
    8 * 67,108,864 * 2 B = 1,073,741,824 B plus fp32 dQ, dK/dV and the dK/dV in flight
    (33,554,432 + 2 * 67,108,864) * 4 B = 671,088,640 B: 1,744,830,464 B. Nothing without
    context parallelism or with the ring-p2p exchange."""
    assert context.backward_workspace_bytes(_spec(8, "allgather")) == pytest.approx(1_744_830_464)
    assert context.backward_workspace_bytes(_spec(1, "allgather")) == 0.0
    assert context.backward_workspace_bytes(_spec(8, "ring-p2p")) == 0.0
