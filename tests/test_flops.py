"""FLOP and parameter counts, checked against a second derivation (Megatron's Eq. 3)."""

import pytest

import simulator
from simulator.costs.flops import (
    megatron_flops_per_iteration,
    model_flops_per_token,
    param_counts,
    recompute_flops_per_token,
)
from simulator.workload.layout import ModelLayout
from tests.conftest import small_scenario


def _counts(preset):
    sc = simulator.Scenario.model_validate(small_scenario(model=preset, cluster={"node": "dgx-a100", "nodes": 1},
                                                          training={"micro_batch": 1, "global_batch": 8}))
    return sc, ModelLayout(sc).counts


@pytest.mark.parametrize(("preset", "billions"), [("gpt3-175b", 175), ("gpt3-13b", 12.85), ("llama2-7b", 6.74),
                                                   ("llama3-8b", 8.03), ("llama3-70b", 70.6), ("llama3-405b", 405.9),
                                                   ("bert-large", 0.335)])
def test_parameter_counts_match_the_papers(preset, billions):
    """GPT-3 175B: 96 x 12 x 12288^2 + embeddings = 174.6e9; Llama 3 405B: 405.9e9 (released
    config); BERT-large 335M without the pooler/MLM head (the paper rounds to 340M)."""
    _, counts = _counts(preset)
    assert counts.total / 1e9 == pytest.approx(billions, rel=0.01)


def test_model_flops_equal_megatron_formula_without_recompute():
    """(6N + 12 L h s) * B * s == 72 B s L h^2 (1 + s/6h + V/12Lh) for GPT-3 175B; the two
    differ only by biases and norms (13h per layer against 12h^2): < 1e-3."""
    sc, counts = _counts("gpt3-175b")
    m = sc.model
    ours = model_flops_per_token(counts.matmul, m.layers, m.hidden, m.seq_len) * 1536 * m.seq_len
    theirs = megatron_flops_per_iteration(1536, m.seq_len, m.layers, m.hidden, m.vocab, recompute=False)
    assert ours == pytest.approx(theirs, rel=1e-3)


def test_full_recompute_adds_one_forward_of_the_layers():
    """Eq. 3 with recompute: 96 B s L h^2 (1 + s/6h + V/16Lh) = model + 2N_layers + 4Lhs per token."""
    sc, counts = _counts("gpt3-175b")
    m = sc.model
    per_token = model_flops_per_token(counts.matmul, m.layers, m.hidden, m.seq_len) + recompute_flops_per_token(
        "full", counts.per_layer, m.layers, m.hidden, m.seq_len)
    theirs = megatron_flops_per_iteration(1536, m.seq_len, m.layers, m.hidden, m.vocab, recompute=True)
    assert per_token * 1536 * m.seq_len == pytest.approx(theirs, rel=1e-3)


def test_gqa_and_swiglu_counts():
    """Llama 3 8B layer: attention 4096*(4096 + 2*8*128) + 4096^2 = 41.9M, SwiGLU 3*4096*14336
    = 176.2M, two RMSNorms 8192: 218.1M per layer."""
    c = param_counts(layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256, seq_len=8192,
                     mlp="swiglu", norm="rmsnorm", position_embedding="rotary", tied_embeddings=False, bias=False)
    assert c.per_layer == 4096 * (4096 + 2 * 1024) + 4096**2 + 3 * 4096 * 14336 + 2 * 4096
    assert c.position == 0 and c.output == 128256 * 4096
    assert c.matmul == c.total - c.embedding  # the input table does no matmul when untied


def test_op_policy_recomputes_every_other_matmul():
    """Llama 3.1 8B (h = 4096, q = 4096, kv = 1024, F = 14336): torchtitan's op policy re-runs wk,
    wo and w3 (w2 is saved and early stop skips it): 4096*1024 + 4096*4096 + 4096*14336 =
    79 691 776 weights, i.e. 2 * 32 * 79 691 776 = 5 100 273 664 FLOPs per token over 32 layers.
    GELU (F = 16384): wk + wo = 4096*1024 + 4096*4096 = 20 971 520."""
    from simulator.costs.flops import op_policy_recomputed_params, recompute_flops_per_token

    llama = op_policy_recomputed_params(hidden=4096, q_width=4096, kv_width=1024, ffn_hidden=14336, mlp="swiglu")
    assert llama == 79_691_776
    assert recompute_flops_per_token("selective-op", 0, 32, 4096, 8192, op_policy_params=llama) == 5_100_273_664
    assert op_policy_recomputed_params(hidden=4096, q_width=4096, kv_width=1024, ffn_hidden=16384,
                                       mlp="gelu") == 20_971_520
