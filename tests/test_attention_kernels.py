"""Attention timed from published kernel benchmarks (topologies/kernels/attention.yaml).

H100 table values used below (FlashAttention-3 paper, Fig. 5-6; TFLOP/s at 512, 1k, 2k, 4k, 8k, 16k):
FA2 forward causal hd128 191, 260, 298, 319, 333, 335; non-causal hd128 309, 350, 362, 368, 370, 370;
FA2 forward causal hd64 ..., 262 (2k); FA2 backward non-causal hd128 214, 260, 291, 310, 318, 322;
Triton forward non-causal hd128 ..., 389 (4k). H100 sustained_compute_fraction 0.8, launch 4 us.
"""

from __future__ import annotations

import pytest

import simulator
from simulator.catalog import default_catalog
from simulator.costs.attention import AttentionShape
from simulator.costs.compute import attention_time_s
from simulator.errors import ScenarioError
from simulator.scenario.model import ModelSpec
from simulator.workload.model import Shard, backward_of, block_forward
from simulator.workload.profile import compute_profile

T = 1e12


def _rates(gpu: str, kernel: str = "fa2"):
    return default_catalog().attention_kernels.rates(gpu)[kernel]


def _profile(gpu: str):
    return compute_profile(default_catalog().gpu(gpu), None)


def _model(seq: int = 4096, causal: bool = True) -> ModelSpec:
    return ModelSpec(layers=1, hidden=4096, heads=32, seq_len=seq, vocab=32000, causal=causal)


def test_causal_forward_on_h100_fa2_by_hand():
    """One causal forward, s = 4096, d = 128, h = 32, b = 1, FlashAttention-2 on H100:
    FLOPs = 4 * 32 * 4096^2 * 128 / 2 = 2^37 = 137,438,953,472; table rate 319 TFLOP/s (4k, causal,
    hd128) x 0.8 sustained = 255.2 TFLOP/s; compute 2^37 / 255.2e12 = 538.55 us. Bytes
    (q, o, k, v: 4 * 4096 * 32 * 128 * 2 B = 134 MB) take 47 us at 3.35 TB/s x 0.85, below the
    compute; + 4 us launch = 542.55 us."""
    (attn,) = [k for k in block_forward(_model(), Shard(batch=1, seq=4096)) if k.kind == "attention"]
    assert attn.flops == 2 ** 37
    assert attn.attn == AttentionShape(4096, 128, 1.0)
    profile = _profile("h100-sxm")
    expected = 2 ** 37 / (319e12 * 0.8) + 4e-6
    assert attention_time_s(profile, attn.flops, attn.nbytes, "bf16", backward=False, kernel="fa2",
                            shape=attn.attn) == pytest.approx(expected, rel=1e-12)
    (bwd,) = backward_of([attn])
    # backward: 2.5 x the FLOPs; causal backward = non-causal 310 x (causal 319 / non-causal 368) fwd
    assert bwd.flops == 2.5 * 2 ** 37 and bwd.attn == attn.attn
    rate_bwd = 310e12 * 319 / 368
    assert attention_time_s(profile, bwd.flops, bwd.nbytes, "bf16", backward=True, kernel="fa2",
                            shape=bwd.attn) == pytest.approx(bwd.flops / (rate_bwd * 0.8) + 4e-6, rel=1e-12)


def test_rate_interpolates_in_log2_and_clamps():
    """2^11.5 tokens sit halfway (in log2) between 2k and 4k: (298 + 319) / 2 = 308.5; head dim
    2^6.5 halfway between 64 and 128 at 2k: (262 + 298) / 2 = 280; outside the published points
    the ends hold: 256 tokens -> 191 (512), 64k -> 335 (16k), head dim 512 -> 256's 278 at 2k."""
    fa2 = _rates("h100-sxm")
    assert fa2.rate_flops_per_s(2 ** 11.5, 128, causal=True, backward=False) == pytest.approx(308.5 * T)
    assert fa2.rate_flops_per_s(2048, 2 ** 6.5, causal=True, backward=False) == pytest.approx(280 * T)
    assert fa2.rate_flops_per_s(256, 128, causal=True, backward=False) == pytest.approx(191 * T)
    assert fa2.rate_flops_per_s(65536, 128, causal=True, backward=False) == pytest.approx(335 * T)
    assert fa2.rate_flops_per_s(2048, 512, causal=True, backward=False) == pytest.approx(278 * T)
    # backward hd256 was not published: clamped to hd128's (non-causal 4k: 310)
    assert fa2.rate_flops_per_s(4096, 256, causal=False, backward=True) == pytest.approx(310 * T)


def test_derived_tables_follow_the_stated_rules():
    """Triton has no published backward: its forward x FA2 backward / forward, 389 x 310 / 368 at
    4k non-causal hd128. A100 (estimate): H100 FA2 x 230/370 (0.6216): 319 x 0.6216 at 4k causal;
    triton-2023 = FA2 x 0.5556. H100 NVL: H100 x 0.8444 (dense-peak ratio); H100 96GB HBM2e (500 W):
    H100 x 0.9222 (912.45 / 989.4). H200: H100's."""
    assert _rates("h100-sxm", "triton").rate_flops_per_s(4096, 128, causal=False, backward=True) == pytest.approx(
        389 * 310 / 368 * T)
    assert _rates("a100-80gb").rate_flops_per_s(4096, 128, causal=True, backward=False) == pytest.approx(
        319 * 0.6216 * T)
    assert _rates("a100-80gb", "triton-2023").rate_flops_per_s(4096, 128, causal=True, backward=False) == \
        pytest.approx(319 * 0.6216 * 0.5556 * T)
    assert _rates("h100-nvl").rate_flops_per_s(4096, 128, causal=True, backward=False) == pytest.approx(
        319 * 0.8444 * T)
    assert _rates("h100-96gb-hbm2e").rate_flops_per_s(4096, 128, causal=True, backward=False) == pytest.approx(
        319 * 0.9222 * T)
    assert _rates("h200").rate_flops_per_s(4096, 128, causal=True, backward=False) == pytest.approx(319 * T)
    assert "fa3" not in default_catalog().attention_kernels.rates("a100-80gb")
    assert default_catalog().attention_kernels.rates("v100-32gb") == {}


def test_context_parallel_block_is_seq_over_cp_with_one_masked_step():
    """cp = 2, s = 8192: each rank's block is 4096 tokens and 1/2 of its FLOPs are masked
    (the diagonal ring step): time = F/2 / 319 + F/2 / 368 TFLOP/s (x 0.8)."""
    (attn,) = [k for k in block_forward(_model(8192), Shard(batch=1, seq=8192, cp=2)) if k.kind == "attention"]
    assert attn.attn == AttentionShape(4096, 128, 0.5)
    f = attn.flops
    expected = (f / 2 / 319e12 + f / 2 / 368e12) / 0.8 + 4e-6
    got = attention_time_s(_profile("h100-sxm"), f, attn.nbytes, "bf16", backward=False, shape=attn.attn)
    assert got == pytest.approx(expected, rel=1e-12)


def test_encoder_runs_at_the_non_causal_rate():
    """BERT-style (causal: false), s = 512 hd128 on H100: all FLOPs at the non-causal 309 TFLOP/s."""
    (attn,) = [k for k in block_forward(_model(512, causal=False), Shard(batch=1, seq=512)) if k.kind == "attention"]
    assert attn.attn == AttentionShape(512, 128, 0.0)
    f = attn.flops
    assert attention_time_s(_profile("h100-sxm"), f, 0.0, "bf16", backward=False, shape=attn.attn) == \
        pytest.approx(f / (309e12 * 0.8) + 4e-6, rel=1e-12)


def test_gpu_without_table_keeps_the_curve_relations():
    """V100 has no kernel table: fa2 runs f FLOPs at the profile's curve, f / (peak * eff(f)),
    plus the 4 us launch; triton-2023 takes what fa2 takes for 1.8 f (the old relation: its work
    counted 1.8x on the same curve)."""
    v100 = _profile("v100-32gb")
    f, shape = 1e11, AttentionShape(2048, 128, 1.0)
    fa2 = attention_time_s(v100, f, 0.0, "fp16", backward=False, kernel="fa2", shape=shape) - 4e-6
    assert fa2 == pytest.approx(f / (v100.peak("fp16") * v100.attention_efficiency(f, "fp16", False)), rel=1e-12)
    fa2_at_18 = attention_time_s(v100, 1.8 * f, 0.0, "fp16", backward=False, kernel="fa2", shape=shape) - 4e-6
    triton = attention_time_s(v100, f, 0.0, "fp16", backward=False, kernel="triton-2023", shape=shape) - 4e-6
    assert triton == pytest.approx(fa2_at_18, rel=1e-12) and triton > 1.5 * fa2


QUICK = "scenarios/quickstart.yaml"  # A100 40GB
H100 = "scenarios/llama3-8b-tp-sp-cp-h100.yaml"


@pytest.mark.parametrize(("overrides", "kernel"), [
    ([], "fa2"),
    (["framework=megatron-core"], "cudnn"),
    (["framework=megatron-core", "training.flash_attention_version=triton"], "triton-2023"),
    (["framework=megatron-core", "training.flash_attention=false"], "unfused"),
    (["framework=megatron-core", "training.attention_kernel=fa2"], "fa2"),
    (["framework=megatron-lm"], "unfused"),
    (["training.flash_attention_version=1"], "fa1"),
    (["training.attention_kernel=triton-2023"], "triton-2023"),
])
def test_kernel_precedence(overrides, kernel):
    """Scenario fields win over the profile, which wins over dtsim's default (fa2)."""
    assert simulator.load_scenario(QUICK, overrides=overrides).attention_kernel == kernel


def test_unfused_stores_scores_and_is_costed_by_kernels():
    scenario = simulator.load_scenario(QUICK, overrides=["training.attention_kernel=unfused"])
    from simulator.workload.activations import shard_of
    shard = shard_of(scenario)
    assert not shard.flash
    assert {k.name for k in block_forward(scenario.model, shard)} >= {"scores", "softmax", "attn_v"}


@pytest.mark.parametrize(("path", "overrides", "field", "words"), [
    (QUICK, ["training.attention_kernel=fa3"], "training.attention_kernel", "needs a hopper GPU"),
    (QUICK, ["training.flash_attention_version=3"], "training.flash_attention_version", "needs a hopper GPU"),
    (QUICK, ["training.attention_kernel=fa2", "training.flash_attention=false"], "training.attention_kernel",
     "contradicts training.flash_attention"),
    (H100, ["training.attention_kernel=fa3", "training.flash_attention_version=2"], "training.attention_kernel",
     "contradicts training.flash_attention_version"),
    (QUICK, ["training.attention_kernel=flash"], "training.attention_kernel", ""),
])
def test_bad_kernel_names_the_field(path, overrides, field, words):
    with pytest.raises(ScenarioError) as err:
        simulator.load_scenario(path, overrides=overrides)
    assert field in str(err.value) and words in str(err.value)


def test_fa3_on_hopper_is_faster_than_fa2():
    """FA3's table is above FA2's at every published point, so the H100 step gets shorter."""
    fa2 = simulator.simulate(simulator.load_scenario(H100))
    fa3 = simulator.simulate(simulator.load_scenario(H100, overrides=["training.attention_kernel=fa3"]))
    assert fa3.step_time_s < fa2.step_time_s


def test_measured_profile_carries_no_kernel_tables(tmp_path):
    """A measured profile's attention curves describe the kernel it measured: no tables."""
    from simulator.scenario.calibration import builtin_profile_path
    src = builtin_profile_path("h100-sxm", None).read_text().replace("calibrated: false", "calibrated: true")
    path = tmp_path / "measured.yaml"
    path.write_text(src)
    assert compute_profile(default_catalog().gpu("h100-sxm"), str(path)).attention_kernels == {}
    assert compute_profile(default_catalog().gpu("h100-sxm"), None).attention_kernels
