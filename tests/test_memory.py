"""Memory formulas: ZeRO model states and Korthikanti et al. Table 2 activations."""

import pytest

from simulator.costs.memory import layer_activation_bytes, model_state_bytes_per_param, sharded_model_state_bytes

S, B, H, A = 2048, 1, 12288, 96  # GPT-3 175B shapes, micro-batch 1
GPT = dict(seq=S, batch=B, hidden=H, heads=A, kv_heads=A, ffn_hidden=4 * H, mlp="gelu")


def sbh(x):
    return S * B * H * x


@pytest.mark.parametrize(
    ("tp", "sp", "recompute", "expected"),
    [
        (1, False, "none", sbh(34 + 5 * A * S / H)),
        (8, False, "none", sbh(10 + 24 / 8 + 5 * A * S / (H * 8))),
        (8, True, "none", sbh(34 + 5 * A * S / H) / 8),
        (8, False, "selective", sbh(10 + 24 / 8)),
        (8, True, "selective", sbh(34) / 8),
        (1, False, "full", sbh(2)),
        (8, True, "full", sbh(2) / 8),
    ],
)
def test_korthikanti_table_2(tp, sp, recompute, expected):
    got = layer_activation_bytes(**GPT, tp=tp, sequence_parallel=sp, recompute=recompute, flash_attention=False)
    assert got == pytest.approx(expected, rel=1e-12)


def test_flash_attention_drops_the_score_matrices():
    """FlashAttention keeps 4*b*a*s bytes of fp32 log-sum-exp instead of 5*a*s^2*b."""
    got = layer_activation_bytes(**GPT, tp=1, flash_attention=True)
    assert got == pytest.approx(sbh(34) + 4 * B * A * S, rel=1e-12)


@pytest.mark.parametrize("nd", [64])
def test_zero_model_states(nd):
    """ZeRO §5, mixed-precision Adam (K = 12), N_d = 64: 16, 4 + 12/N_d, 2 + 14/N_d, 16/N_d."""
    psi = 7.5e9
    per = model_state_bytes_per_param("bf16", "adam")
    totals = [sharded_model_state_bytes(psi, per, stage=s, shard_ranks=nd).total for s in range(4)]
    assert totals == pytest.approx([16 * psi, (4 + 12 / nd) * psi, (2 + 14 / nd) * psi, 16 * psi / nd])
    # the paper's Figure 1: 120 GB -> 31.4 -> 16.6 -> 1.9 GB for 7.5B parameters on 64 GPUs
    assert [round(t / 1e9, 1) for t in totals] == [120.0, 31.4, 16.6, 1.9]
