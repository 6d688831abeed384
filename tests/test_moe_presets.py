"""Mixture-of-experts model presets (issue 15): their contract fields and parameter counts."""

import pytest

import simulator
from simulator.scenario import preset_names
from tests.conftest import small_scenario

MOE_PRESETS = {"mixtral-8x7b", "mixtral-8x22b", "deepseek-v3", "qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-120b"}


def _model(name: str, **over):
    return simulator.Scenario.model_validate(small_scenario(model={"preset": name, **over})).model


def test_moe_presets_are_shipped():
    assert set(preset_names()) >= MOE_PRESETS


@pytest.mark.parametrize("name", sorted(MOE_PRESETS))
def test_moe_preset_loads_and_cites(name):
    m = _model(name)
    assert m.source and ("arXiv" in m.source or "huggingface.co" in m.source), name
    assert m.experts_per_token <= m.experts and m.expert_ffn_hidden > 0


def test_contract_fields_of_the_published_shapes():
    """Values as the cited tables state them: Mixtral 8x7B 8 experts top-2 of width 14336
    (Jiang et al. Table 1); DeepSeek-V3 1 shared + 256 routed, top-8, width 2048, first 3
    blocks dense, sigmoid router, MLA ranks 1536/512 (arXiv:2412.19437 §4.2); Qwen3-235B-A22B
    128 experts, top-8, width 1536, no shared expert (arXiv:2505.09388 Table 2)."""
    mix = _model("mixtral-8x7b")
    assert (mix.experts, mix.experts_per_token, mix.shared_experts, mix.expert_ffn_hidden) == (8, 2, 0, 14336)
    assert mix.router == "softmax-topk" and mix.capacity_factor is None
    ds = _model("deepseek-v3")
    assert (ds.experts, ds.experts_per_token, ds.shared_experts, ds.expert_ffn_hidden) == (256, 8, 1, 2048)
    assert ds.router == "sigmoid-topk" and ds.attention == "mla"
    assert (ds.mla.q_lora_rank, ds.mla.kv_lora_rank, ds.mla.qk_nope_head_dim, ds.mla.qk_rope_head_dim,
            ds.mla.v_head_dim) == (1536, 512, 128, 64, 128)
    qw = _model("qwen3-235b-a22b")
    assert (qw.layers, qw.experts, qw.experts_per_token, qw.shared_experts, qw.expert_ffn_hidden) == (94, 128, 8, 0,
                                                                                                        1536)


def test_mixtral_8x7b_total_parameters():
    """Mixtral 8x7B holds 46.7 B parameters (the 47B of Jiang et al. §2.1). By hand:
    attention per block q,o 2 x 4096^2 + k,v 2 x 4096 x (8 x 128) = 41,943,040; one SwiGLU
    expert 3 x 4096 x 14336 = 176,160,768, eight of them 1,409,286,144; router 4096 x 8 =
    32,768; two RMSNorms 8,192; a block 1,451,270,144; x 32 blocks = 46,440,644,608; plus
    untied embedding and output 2 x 32000 x 4096 = 262,144,000 and the final norm 4,096:
    46,702,792,704."""
    result = simulator.simulate(simulator.Scenario.model_validate(small_scenario(
        model={"preset": "mixtral-8x7b", "seq_len": 1024}, training={"micro_batch": 1, "global_batch": 16})))
    assert result.params == pytest.approx(46_702_792_704, rel=1e-6)


def test_deepseek_v3_total_parameters():
    """DeepSeek-V3 holds 671 B parameters (arXiv:2412.19437 §1, without the MTP module). By hand,
    h = 7168: MLA per block q_a 7168 x 1536 + its norm 1536 + q_b 1536 x 128 x (128+64) + kv_a
    7168 x (512+64) + its norm 512 + kv_b 512 x 128 x (128+128) + o 128 x 128 x 7168 =
    187,107,328, two RMSNorms 14,336; 3 dense SwiGLU FFNs 3 x 7168 x 18432 = 396,361,728 each;
    58 MoE blocks of 257 experts x 3 x 7168 x 2048 (44,040,192 each) + router 256 x 7168;
    untied embedding and head 2 x 129280 x 7168 and the final norm:
    61 x 187,121,664 + 3 x 396,361,728 + 58 x 11,320,164,352 + 1,853,358,080 + 7,168
    = 671,026,404,352 (the router's 256 bias terms per block, if counted, add 14,848)."""
    result = simulator.simulate(simulator.Scenario.model_validate(small_scenario(
        model={"preset": "deepseek-v3", "seq_len": 1024}, training={"micro_batch": 1, "global_batch": 16})))
    assert result.params == pytest.approx(671_026_404_352, rel=1e-6)


def test_qwen3_30b_a3b_counts_its_wide_heads():
    """Qwen3-30B-A3B's 32 query heads are head_dim 128 wide (4,096 > hidden 2,048), 4 KV heads:
    attention 2048 x (4096 + 2 x 512) + 4096 x 2048 = 18,874,368; two RMSNorms 4,096; router
    2048 x 128 = 262,144; 128 SwiGLU experts of 3 x 2048 x 768 = 4,718,592 each = 603,979,776.
    48 layers x 623,120,384 = 29,909,778,432, plus untied embedding and head 2 x 151,936 x 2,048
    = 622,329,856 and the final norm 2,048: 30,532,110,336 (the report's 30.5B). Active: 8 experts
    (37,748,736) instead of 128: 48 x 56,889,344 + 622,331,904 = 3,353,020,416 (3.3B). With the
    head width taken as hidden / heads = 64 the attention would be 2048 x 2560 + 2048^2 smaller."""
    from simulator.workload.layout import ModelLayout

    sc = simulator.Scenario.model_validate({
        "model": {"preset": "qwen3-30b-a3b"}, "cluster": {"node": "dgx-h100", "nodes": 1},
        "parallelism": {"ep": 8}, "training": {"micro_batch": 1, "global_batch": 8}})
    assert sc.model.head_dim == 128 and sc.model.heads * sc.model.head_dim == 2 * sc.model.hidden
    counts = ModelLayout(sc).counts
    assert (counts.total, counts.active) == (30_532_110_336, 3_353_020_416)
