"""Stored activations of multi-head latent attention (issue 15): what Megatron-Core's
MLASelfAttention with Transformer Engine linears keeps, tensor by tensor
(:mod:`simulator.costs.mla_memory`), on DeepSeek-V3's shape: h 7168, 128 heads, r_q 1536,
r_kv 512, rope 64, nope 128, v 128 (query/key heads 192 wide), bf16 (e = 2), fused attention."""

from __future__ import annotations

import pytest

from simulator.costs.mla_memory import MlaWidths, mla_attention_activation_bytes
from simulator.scenario.spec import Scenario
from simulator.workload.activations import ActivationSizes
from tests.test_moe import DEEPSEEK_V3

V3 = MlaWidths(q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)
T = 4096  # tokens of one micro-batch (b 1, s 4096, cp 1)
UP = frozenset({"qkv"})  # recompute_modules: mla_up_proj


def v3(tp: int = 1, sp: bool = False, recomputed: frozenset[str] = frozenset(), **kw: bool) -> float:
    """DeepSeek-V3's attention bytes for one 4096-token micro-batch, per token."""
    return mla_attention_activation_bytes(V3, tokens=T, seq=T, batch=1, hidden=7168, heads=128, tp=tp,
                                          sequence_parallel=sp, recomputed=recomputed, **kw) / T


def test_deepseek_v3_tp1_keeps_the_latents_and_the_decompressed_heads() -> None:
    """Per token, tp 1: input norm output 2 x 7168 = 14,336 (one tensor for both down-projections);
    query latent and q_up's norm output 2 x 1536 + 2 x 1536 = 6,144; kv_down's output (latent and
    rotary key) 2 x 576 = 1,152 and kv_up's norm output 2 x 512 = 1,024; query, key (128 x 192) and
    value (128 x 128) 2 x 128 x 512 = 131,072; attention output 2 x 128 x 128 = 32,768; fp32
    log-sum-exp 4 x 128 = 512. Sum 187,008 bytes (2.6x the 72,192 the standard-attention formula
    gave with h/a = 56-wide heads: 5 x 14,336 + 512)."""
    assert v3() == 14_336 + 6_144 + 1_152 + 1_024 + 131_072 + 32_768 + 512 == 187_008


def test_mla_up_proj_keeps_only_the_checkpoints_inputs() -> None:
    """mla_up_proj, tp 1: the query latent 2 x 1536 = 3,072 and kv_down's output 2 x 576 = 1,152
    stay (the checkpoint's inputs); the two norm outputs (2 x 2048 = 4,096) and query, key, value
    (131,072) go: 14,336 + 3,072 + 1,152 + 32,768 + 512 = 51,840."""
    assert v3(recomputed=UP) == 14_336 + 3_072 + 1_152 + 32_768 + 512 == 51_840
    assert v3() - v3(recomputed=UP) == 4_096 + 131_072


def test_tp2_with_sequence_parallelism_splits_latents_by_tokens_and_heads_by_heads() -> None:
    """tp 2 with sequence parallelism: the replicated part (norm output, latents and their norm
    outputs, 14,336 + 6,144 + 2,176 = 22,656) is kept for half the tokens, the heads' part
    (131,072 + 32,768 + 512 = 164,352) for half the heads: 11,328 + 82,176 = 93,504 a token of
    the micro-batch. With mla_up_proj: (14,336 + 3,072 + 1,152) / 2 = 9,280, plus the rotary key
    the checkpoint keeps all-gathered over all tokens, 2 x 64 = 128, plus (32,768 + 512) / 2 =
    16,640: 26,048."""
    assert v3(tp=2, sp=True) == 22_656 / 2 + 164_352 / 2 == 93_504
    assert v3(tp=2, sp=True, recomputed=UP) == 18_560 / 2 + 128 + 33_280 / 2 == 26_048


def test_tp2_without_sequence_parallelism_keeps_the_latents_whole() -> None:
    """tp 2, no sequence parallelism: 22,656 + 82,176 = 104,832; mla_up_proj: 18,560 + 16,640 =
    35,200 (the rotary key is a view of kv_down's output, nothing gathered)."""
    assert v3(tp=2) == 104_832
    assert v3(tp=2, recomputed=UP) == 35_200


def test_fp8_keeps_one_byte_copies_of_the_linears_inputs() -> None:
    """fp8 (TE): each down-projection keeps its own 1-byte copy of the norm output (2 x 7168 =
    14,336, as bf16's one shared copy), the up-projections' norm outputs are 1 byte (1536 + 512 =
    2,048 instead of 4,096): 187,008 - 2,048 = 184,960. The delayed-scaling recipe adds
    linear_proj's 1-byte input copy, 128 x 128 = 16,384: 201,344. The layernorm module drops the
    norm output (the down-projections then keep the original input): 184,960 - 14,336 = 170,624."""
    assert v3(fp8_inputs=True) == 184_960
    assert v3(fp8_inputs=True, fp8_proj_copy=True) == 201_344
    assert v3(fp8_inputs=True, recomputed=frozenset({"input_norm"})) == 170_624


def test_without_query_compression_the_fused_q_proj_keeps_the_hidden_norm() -> None:
    """DeepSeek-V2-Lite's shape (h 2048, 16 heads, no query compression, r_kv 512): q_proj is a
    fused norm-linear on the input norm's output: it keeps that output 2 x 2048 = 4,096 and its
    norm's output 4,096; kv 2,176; query, key, value 2 x 16 x 512 = 16,384; output 4,096;
    log-sum-exp 64: 30,912. mla_up_proj: 4,096 + 1,152 + 4,096 + 64 = 9,408."""
    lite = MlaWidths(None, 512, 128, 64, 128)

    def per_token(recomputed: frozenset[str]) -> float:
        return mla_attention_activation_bytes(lite, tokens=1, seq=T, batch=1, hidden=2048, heads=16,
                                              recomputed=recomputed)

    assert per_token(frozenset()) == 30_912
    assert per_token(UP) == 9_408


def test_unfused_attention_keeps_the_softmax_per_local_head() -> None:
    """Without a fused kernel and without dropout the softmax output, 2 bytes x 64 local heads
    (tp 2) x 4096 keys = 524,288 a token, replaces the log-sum-exp (4 x 64 = 256)."""
    assert v3(tp=2, flash_attention=False) - v3(tp=2) == 2 * 64 * T - 4 * 64 == 524_032


def deepseek(training: dict, tp: int = 1) -> Scenario:
    return Scenario.model_validate({"model": DEEPSEEK_V3, "cluster": {"node": "dgx-h800", "nodes": 32},
                                    "parallelism": {"tp": tp, "pp": 16, "ep": 16 // tp, "sharding": "zero1",
                                                    "sequence_parallel": tp > 1,
                                                    "stage_layers": [3] + [4] * 14 + [2]},
                                    "training": {"global_batch": 256, **training}})


@pytest.mark.parametrize(("tp", "modules", "attention"), [(1, [], 187_008), (1, ["mla_up_proj"], 51_840),
                                                           (2, [], 93_504), (2, ["mla_up_proj"], 26_048)])
def test_the_dense_block_adds_its_own_tensors_around_mlas(tp: int, modules: list[str], attention: int) -> None:
    """A DeepSeek-V3 dense block (selective, no module but those listed): the block input, the
    second norm's input and output (3 x 2 x 7168 = 43,008) and the SwiGLU MLP's gate, up and
    product ((2 + 2 + 2) x 18432 = 110,592), all / tp (sequence parallelism), beside MLA's bytes."""
    sizes = ActivationSizes.of(deepseek({"recompute": "selective", "recompute_modules": modules}, tp))
    assert sizes.per_layer == (43_008 + 110_592) / tp * T + attention * T
