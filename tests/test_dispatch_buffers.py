"""MoE dispatch memory (issue 15 item 5): the transient tensors of an MoE layer's token dispatch
and combine in the memory timeline, and DeepEP's buffers in the runtime reserve outside the
caching allocator.

Sources: Megatron-Core token_dispatcher.py / moe_utils.py / fused_a2a.py at d98e8a6; DeepEP
deep_ep/buffer.py and csrc/config.hpp at 0aaa674 (:mod:`simulator.costs.dispatch_buffers`).
"""

from __future__ import annotations

import pytest

import simulator
from simulator.costs.dispatch_buffers import (
    deepep_buffer_bytes,
    deepep_nvl_hint,
    deepep_rdma_hint,
    dispatch_transient_bytes,
    dispatch_transient_rows,
)
from simulator.errors import InfeasibleError
from simulator.scenario.spec import Scenario
from simulator.units import GiB
from simulator.workload import activations, builder
from simulator.workload.activations import ActivationSizes, moe_dispatch_bytes
from tests.test_moe import MIXTRAL, mixtral

T, K, H = 4096, 2, 4096  # Mixtral 8x7B at micro-batch 1, sequence 4096, tp 1


def test_mixtral_ep8_dispatch_transients_by_hand() -> None:
    """One local expert (8 experts on ep 8), etp 1, balanced: the combine's input (R = T x k =
    8192 rows received) and output (T x k = 8192 rows): 16,384 x 4096 x 2 B = 134,217,728 B; the
    router's logits, scores and probs in fp32 and its bool map, 4096 x 8 x 13 = 425,984 B."""
    got = dispatch_transient_bytes(tokens=T, hidden=H, top_k=K, experts=8, ep=8, etp=1, factor=1.0,
                                   dispatcher="alltoall", act_bytes=2)
    assert got == 134_217_728 + 425_984


def test_rows_by_dispatcher_and_layout() -> None:
    """T = 4096, k = 2, f = 1.5: R = 1.5 x 8192 = 12,288. 16 experts on ep 8 (two local: the
    sorted copy and the fc2 output's copy back) 2R = 24,576; one local expert with etp 2, G = 24,576:
    G + R = 36,864; with etp 1: R + T k = 20,480; allgather ep 8: G + ep x T = 12,288 + 32,768 =
    45,056; deepep 2G = 24,576 (one local expert or not)."""
    rows = dict(tokens=T, top_k=K, factor=1.5)
    assert dispatch_transient_rows(**rows, experts=16, ep=8, etp=1, dispatcher="alltoall") == 24_576
    assert dispatch_transient_rows(**rows, experts=8, ep=8, etp=2, dispatcher="alltoall") == 36_864
    assert dispatch_transient_rows(**rows, experts=8, ep=8, etp=1, dispatcher="alltoall") == 20_480
    assert dispatch_transient_rows(**rows, experts=8, ep=8, etp=1, dispatcher="allgather") == 45_056
    assert dispatch_transient_rows(**rows, experts=8, ep=8, etp=1, dispatcher="deepep") == 24_576


def test_deepep_hints_deepseek_v3_ep64() -> None:
    """h 7168 bf16 (hidden_bytes 14,336), 64 ranks, 20 SMs: 10 channels, 8 NVLink peers, 8 RDMA
    ranks. NVL: 10*8*(2*8+3)*4 = 6,080 + 10*8*288*(14336 + 8 + 128*8 + 128*4 + 128*4) = 23,040 x
    16,392 = 377,671,680 -> 377,677,760, aligned to 128: 377,677,824. RDMA: 10*8*(8*2+2)*2*4 =
    11,520 + 2*10*8*128*(16,392 + 16) = 336,035,840 -> 336,047,360 (a multiple of 128), mapped as one
    512 MiB NVSHMEM granule; + the 32 MiB workspace: 377,677,824 + 536,870,912 + 33,554,432 =
    948,103,168 B."""
    assert deepep_nvl_hint(14_336, 64, 20, 288) == 377_677_824
    assert deepep_rdma_hint(14_336, 64, 20, 128) == 336_047_360
    got = deepep_buffer_bytes(7168, 2, 64, 20)
    assert tuple(got) == (377_677_824, 536_870_912, 33_554_432)
    assert got.total == 948_103_168


def test_deepep_within_one_node_has_no_rdma_buffer_and_fp8_tokens_size_as_bf16() -> None:
    """8 ranks (one node): NVL 10*8*(2+3)*4 = 1,600 + 10*8*256*16,392 = 335,708,160 -> 335,709,760,
    aligned 335,709,824; no RDMA buffer. An fp8 token (1-byte elements) is sized as 2 bytes an element
    (get_hidden_bytes: h x max(element size, 2)), the same buffer."""
    assert tuple(deepep_buffer_bytes(7168, 2, 8, 20)) == (335_709_824, 0, 33_554_432)
    assert deepep_buffer_bytes(7168, 1, 8, 20) == deepep_buffer_bytes(7168, 2, 8, 20)


def test_deepep_group_without_config_is_refused() -> None:
    """DeepEP's get_dispatch_config has configs for 2 .. 160 ranks only (deep_ep/buffer.py:242-256):
    ep 12 (24 experts over 3 DGX H800, its group across two nodes over InfiniBand) is refused naming
    the field, and the pure function refuses 256 ranks."""
    sc = Scenario.model_validate({
        "model": dict(MIXTRAL, layers=2, experts=24), "cluster": {"node": "dgx-h800", "nodes": 3},
        "parallelism": {"ep": 12, "sharding": "zero1", "moe": {"dispatcher": "deepep"}},
        "training": {"micro_batch": 1, "global_batch": 24}})
    with pytest.raises(InfeasibleError) as err:
        simulator.simulate(sc)
    assert err.value.field == "parallelism.ep"
    assert "12 ranks" in str(err.value)
    with pytest.raises(ValueError):
        deepep_buffer_bytes(7168, 2, 256, 20)


def _small(**over: object) -> Scenario:
    """Mixtral's shapes, 2 layers and a vocabulary of 8,000 (its logits, 4 x 4096 x 8000 = 131 MB, below
    a block's backward workspace), ep 8 on one p5.48xlarge, no pipeline, no recomputation."""
    data: dict = {"model": dict(MIXTRAL, layers=2, vocab=8000), "cluster": {"node": "p5.48xlarge", "nodes": 1},
                  "parallelism": {"ep": 8, "sharding": "zero1"},
                  "training": {"micro_batch": 1, "global_batch": 16, "precision": "bf16"}}
    for key, value in over.items():
        section, field = key.split("__")
        data[section][field] = value
    return Scenario.model_validate(data)


def test_peak_rises_by_exactly_the_transients_when_an_moe_block_owns_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both blocks are MoE blocks; the peak is at the last block's backward, whose workspace now
    carries the dispatch transients (moe_dispatch_bytes: R + T k rows and the router's tensors,
    134,643,712 B, f = 1 at skew 0). With them set to 0 the same run peaks exactly that much lower;
    the runtime reserve (other) is the CUDA context alone with the alltoall dispatcher."""
    sc = _small()
    assert moe_dispatch_bytes(sc) == 134_643_712
    with_buffers = simulator.simulate(sc)
    monkeypatch.setattr(activations, "moe_dispatch_bytes", lambda scenario: 0.0)
    assert ActivationSizes.of(sc).moe_dispatch == 0.0
    without = simulator.simulate(sc)
    assert with_buffers.peak_memory_bytes - without.peak_memory_bytes == pytest.approx(134_643_712, abs=1.0)
    assert with_buffers.memory[0].other_bytes == 1.0 * GiB


def test_deepep_buffers_count_for_oom_not_for_the_allocator(monkeypatch: pytest.MonkeyPatch) -> None:
    """deepep over the 8 GPUs of one node (h 4096, bf16): NVL 10*8*5*4 = 1,600 + 10*8*256*(8192 +
    8 + 1024 + 512 + 512) = 20,480 x 10,248 = 209,879,040 -> 209,880,640, aligned 209,880,704; no RDMA;
    + 32 MiB workspace = 243,435,136 B in the runtime reserve beside the 1 GiB context. The peak
    counts them; the allocator's peaks (allocated, reserved) are those of the same run without them."""
    sc = _small(parallelism__moe={"dispatcher": "deepep"})
    assert deepep_buffer_bytes(4096, 2, 8, 20).total == 243_435_136
    r = simulator.simulate(sc)
    assert r.memory[0].other_bytes == 1.0 * GiB + 243_435_136
    monkeypatch.setattr(builder, "deepep_static_bytes", lambda scenario, layout, stage: 0.0)
    base = simulator.simulate(sc)
    assert r.peak_memory_bytes - base.peak_memory_bytes == pytest.approx(243_435_136, abs=1.0)
    assert r.peak_allocated_bytes == base.peak_allocated_bytes
    assert r.peak_reserved_bytes == base.peak_reserved_bytes


def test_memory_estimate_counts_deepep_buffers() -> None:
    """`dtsim fit`'s estimate adds the same buffers to its runtime reserve (other)."""
    from simulator.workload.memory_estimate import estimate_stage_memory

    plain = estimate_stage_memory(_small())[0]
    deepep = estimate_stage_memory(_small(parallelism__moe={"dispatcher": "deepep"}))[0]
    assert deepep.context_bytes - plain.context_bytes == 243_435_136


def test_moe_block_workspace_is_as_wide_as_its_experts_rows() -> None:
    """An MoE block's backward workspace takes its MLP as wide as a token's share of the experts'
    rows, W = k x F_e = 2 x 14,336 = 28,672, not the dense F = 14,336 (Mixtral, tp 1, T = 4096,
    bf16, full recomputation). The gradients of gate, up and product, T x 3 x (W - F) x 2 B =
    352,321,536 B more; the rebuilt layer's MLP tensors (gate, up, product: 2e + e = 6 B per
    element) 6 x 4096 x 14,336 = 352,321,536 B more, and its dispatched tokens kept for fc1's weight
    gradient, T x k x h x 2 = 67,108,864 B: 771,751,936 B over the dense block's in all. The
    dispatch transients come on top of the MoE block's workspace only."""
    sizes = ActivationSizes.of(mixtral(training__recompute="full"))
    assert sizes.moe_workspace - sizes.backward_workspace == 771_751_936
    assert sizes.workspace("block", moe=True) == sizes.moe_workspace + sizes.moe_dispatch
    assert sizes.workspace("block") == sizes.backward_workspace
    assert sizes.rebuilt_bytes("block", moe=True) - sizes.rebuilt_bytes("block") == 352_321_536 + 67_108_864
