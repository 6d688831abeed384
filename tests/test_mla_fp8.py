"""Multi-head latent attention under fp8 (issue 15): MLA's five projections run as fp8 linears
with their casts, the attention core stays bf16. Every number is derived by hand in the test's
docstring; no test asserts on wall time."""

from __future__ import annotations

import pytest

import simulator
from simulator.costs.fp8 import Fp8Casting
from simulator.errors import InfeasibleError
from simulator.scenario.spec import Scenario
from simulator.workload.model import Kernel, Shard, backward_of
from simulator.workload.steps import LayerSpec, block_kernels
from tests.test_moe import DEEPSEEK_V3

# a small dense MLA model: h 1024, 8 heads, r_q 256, r_kv 128, nope 64, rope 32, v 64 (d_qk 96)
SMALL_MLA = {"name": "small-mla", "layers": 2, "hidden": 1024, "heads": 8, "ffn_hidden": 2048, "seq_len": 1024,
             "vocab": 32000, "mlp": "swiglu", "norm": "rmsnorm", "position_embedding": "rotary", "bias": False,
             "dropout": False, "attention": "mla",
             "mla": {"q_lora_rank": 256, "kv_lora_rank": 128, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32,
                     "v_head_dim": 64}}
MLA_LINEARS = ("q_down", "q_up", "kv_down", "kv_up", "proj")


def _attn_block(casting: Fp8Casting | None) -> list[Kernel]:
    sc = Scenario.model_validate({"model": SMALL_MLA, "cluster": {"node": "dgx-h100", "nodes": 1},
                                  "training": {"global_batch": 8, "precision": "fp8"}})
    shard = Shard(batch=1, seq=1024, precision="fp8" if casting else "bf16", fp8=casting)
    return [k for k in block_kernels(LayerSpec(sc.model, shard, "block", "fwd")) if k.section == "attn"]


def _cast_bytes(kernels: list[Kernel]) -> float:
    return sum(k.nbytes for k in kernels if k.kind == "cast")


def test_mla_projections_are_fp8_gemms_with_torchao_tensorwise_casts() -> None:
    """T = 1024 tokens. GEMMs [M, K] x [K, N]: q_down [T, 1024] x [1024, 256], q_up [T, 256] x
    [256, 8*96 = 768], kv_down [T, 1024] x [1024, 128+32 = 160], kv_up [T, 128] x [128, 8*(64+64)
    = 1024], proj [T, 8*64 = 512] x [512, 1024]. FLOPs 2*T*(1024*256 + 256*768 + 1024*160 +
    128*1024 + 512*1024) = 2*1024*1,277,952 = 2,617,245,696, as in bf16.
    Tensorwise (torchao, each linear casting its own input): forward input 2 (amax) + 4 (cast to
    both layouts) = 6 bytes per element of M*K = T*(1024 + 256 + 1024 + 128 + 512) = 3,014,656:
    18,087,936; weight 2 + 3 = 5 per element of K*N = 1,277,952: 6,389,760; forward 24,477,696.
    Backward: output gradient 6 per element of M*N = T*(256 + 768 + 160 + 1024 + 1024) = 3,309,568:
    19,857,408; weight cast 3 per element: 3,833,856; 23,691,264. kv_up's fp8 GEMM reads 1-byte
    operands and writes bf16: (T*128 + 128*1024)*1 + T*1024*2 = 2,359,296 bytes. The attention
    stays bf16; the MHA block's qkv casts are gone."""
    fwd = _attn_block(Fp8Casting("tensorwise"))
    gemms = {k.name: k for k in fwd if k.kind == "gemm"}
    assert {n: gemms[n].precision for n in MLA_LINEARS} == dict.fromkeys(MLA_LINEARS, "fp8")
    assert sum(gemms[n].flops for n in MLA_LINEARS) == 2_617_245_696
    bf16 = {k.name: k.flops for k in _attn_block(None) if k.kind == "gemm"}
    assert sum(bf16[n] for n in MLA_LINEARS) == 2_617_245_696
    assert {k.of for k in fwd if k.kind == "cast"} == set(MLA_LINEARS)
    assert _cast_bytes(fwd) == 24_477_696
    assert _cast_bytes(backward_of(fwd)) == 23_691_264
    assert gemms["kv_up"].nbytes == 2_359_296
    attention = [k for k in fwd if k.kind == "attention"]
    assert len(attention) == 1 and attention[0].precision != "fp8"


def test_transformer_engine_fuses_the_latent_norms_into_the_up_projections() -> None:
    """TE delayed scaling, one micro-batch: every cast writes both layouts, 2 + 1 + 1 = 4 bytes
    per element, no amax pass; q_up and kv_up are LayerNormLinear (the latent norm writes fp8:
    1 + 1 = 2 per element of T*(256 + 128) = 393,216: 786,432); q_down, kv_down and proj read the
    bf16 input: 4 * T*(1024 + 1024 + 512) = 10,485,760; weights 4 * 1,277,952 = 5,111,808.
    Forward 16,384,000 bytes."""
    te = Fp8Casting("delayed", cached_weights=True, micro_batches=1, fused_norm_input=True)
    fwd = _attn_block(te)
    assert _cast_bytes(fwd) == 16_384_000
    up_inputs = sum(k.nbytes for k in fwd if k.kind == "cast" and k.of in ("q_up", "kv_up") and "input" in k.name)
    assert up_inputs == 786_432


def _deepseek_v3(precision: str) -> Scenario:
    return Scenario.model_validate({"framework": "nemo", "model": DEEPSEEK_V3,
                                    "cluster": {"node": "dgx-h100", "nodes": 32},
                                    "parallelism": {"pp": 16, "ep": 16, "stage_layers": [3] + [4] * 14 + [2]},
                                    "training": {"global_batch": 256, "precision": precision,
                                                 "fp8": {"recipe": "tensorwise", "gemms": "transformer-engine"}}})


def test_deepseek_v3_with_fp8_runs_and_beats_bf16() -> None:
    """DeepSeek-V3 on 256 H100 (tp 1, pp 16, ep 16, NeMo's Megatron-Core profile): with fp8 the MLA
    projections, dense MLPs and experts run in fp8 under TE's current scaling; the step is faster
    than bf16's and the MLA linears' casts are in the program."""
    bf16 = simulator.simulate(_deepseek_v3("bf16"))
    fp8 = simulator.simulate(_deepseek_v3("fp8"))
    assert fp8.step_time_s < bf16.step_time_s
    assert fp8.model_flops_per_step == pytest.approx(bf16.model_flops_per_step)


def test_mla_still_refuses_selective_op() -> None:
    with pytest.raises(InfeasibleError) as err:
        Scenario.model_validate({"model": SMALL_MLA, "cluster": {"node": "dgx-h100", "nodes": 1},
                                 "training": {"global_batch": 8, "recompute": "selective-op"}})
    assert err.value.field == "training.recompute" and "latent attention" in str(err.value)
