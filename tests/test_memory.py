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


LLAMA8B = dict(seq=8192, batch=2, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, mlp="swiglu", dropout=False)


def test_op_policy_saves_every_other_matmul():
    """torchtitan's op policy (parallelize_llama.py:214-264 at 9dec370) counts aten.mm per block in
    forward order wq, wk, wv, wo, w1, w3, w2 and recomputes the even ones: wq, wv, w1, w2 saved;
    GELU's wq, wk, wv, wo, fc1, fc2 keeps wq, wv, fc1."""
    from simulator.costs.memory import op_policy_saved_matmuls

    assert op_policy_saved_matmuls("swiglu") == {"wq", "wv", "w1", "w2"}
    assert op_policy_saved_matmuls("gelu") == {"wq", "wv", "fc1"}


def test_selective_op_llama_8b():
    """Llama 3.1 8B, s = 8192, b = 2, bf16, flash, tp = 1 (T = 16384 tokens). Kept per block: the
    input 2*4096, wq 2*4096, wv 2*1024, w1 2*14336, w2 2*4096, the SDPA output 2*4096 and its fp32
    log-sum-exp 4*32 bytes per token = 2*(4*4096 + 1024 + 14336) + 128 = 63616 bytes per token,
    x 16384 = 1 042 284 544 bytes: under half of Korthikanti's selective, 2*(6h + 2kv + 3F) per
    token (norms' inputs and outputs 8h, q and the attention output 4h, k and v 4kv, w1, w3 and
    their product 6F)."""
    got = layer_activation_bytes(**LLAMA8B, recompute="selective-op", flash_attention=True)
    assert got == pytest.approx(16384 * 63616, rel=1e-12)
    korthikanti = layer_activation_bytes(**LLAMA8B, recompute="selective", flash_attention=True)
    assert korthikanti == pytest.approx(16384 * 2 * (6 * 4096 + 2 * 1024 + 3 * 14336), rel=1e-12)


def test_selective_op_under_tp_and_sp():
    """tp = 8 with SP: the input 2h/8; column-parallel outputs /8 (wq 2h/8, wv 2kv/8, w1 2F/8); the
    row-parallel w2's mm output is the full-width partial sum 2h; SDPA 2h/8 + 4*a/8; the two
    reduce-scatter outputs 2*2h/8. Per token: 2*(512 + 512 + 128 + 1792 + 4096 + 512 + 1024) + 16
    = 17168 bytes, x 16384 tokens."""
    got = layer_activation_bytes(**LLAMA8B, tp=8, sequence_parallel=True, recompute="selective-op",
                                 flash_attention=True)
    assert got == pytest.approx(16384 * 17168, rel=1e-12)


def test_selective_op_compiled_keeps_only_what_the_backward_reads():
    """torch.compile's partitioner saves a MUST_SAVE output only when the backward reads it; w2's
    output feeds only the residual add. Llama 3.1 8B, T = 16384: eager 63616 bytes per token (above),
    compiled 63616 - 2*4096 = 55424 (a 134 217 728-byte, 128 MiB, difference per block). tp = 8 with
    SP: eager 17168; compiled drops w2's full-width partial sum 2*4096 and the reduce-scatter after
    it 2*512: 17168 - 8192 - 1024 = 7952 bytes per token. (Checked with torch 2.13 on CPU,
    backend aot_eager_decomp_partition over a torchtitan-shaped block under the op policy: the
    compiled graph saves x, q, v, the SDPA output and log-sum-exp and w1's output; the eager
    checkpoint's cache holds those and w2's output.)"""
    from simulator.costs.memory import op_policy_kept_matmuls

    assert op_policy_kept_matmuls("swiglu", compiled=True) == {"wq", "wv", "w1"}
    assert op_policy_kept_matmuls("swiglu", compiled=False) == {"wq", "wv", "w1", "w2"}
    assert op_policy_kept_matmuls("gelu", compiled=True) == {"wq", "wv", "fc1"}
    one = layer_activation_bytes(**LLAMA8B, recompute="selective-op", flash_attention=True, compiled=True)
    assert one == pytest.approx(16384 * 55424, rel=1e-12)
    sp = layer_activation_bytes(**LLAMA8B, tp=8, sequence_parallel=True, recompute="selective-op",
                                flash_attention=True, compiled=True)
    assert sp == pytest.approx(16384 * 7952, rel=1e-12)


def test_eager_fp32_loss_forward_holds_the_logits_and_their_fp32_copy():
    """torchtitan's loss forward: bf16 logits (2 bytes) and pred.float() (4) beside the kept fp32
    log-softmax, both gone before the backward: 6*T*V/t. T = 16384, V = 128256: 6 * 16384 * 128256 =
    12 608 077 824 bytes; t = 8: /8. fp32 logits need no copy: 4*T*V. Fused kernels: 0."""
    from simulator.costs.memory import loss_forward_transient_bytes

    assert loss_forward_transient_bytes(tokens=16384, vocab=128256, cross_entropy="eager-fp32") == 12608077824
    assert loss_forward_transient_bytes(tokens=16384, vocab=128256, tp=8, cross_entropy="eager-fp32") == (
        12608077824 / 8)
    assert loss_forward_transient_bytes(tokens=16384, vocab=128256, cross_entropy="eager-fp32",
                                        logits_bytes=4) == 4 * 16384 * 128256
    assert loss_forward_transient_bytes(tokens=16384, vocab=128256, cross_entropy="fused") == 0.0


def test_loss_transient_segment_stays_reserved_through_the_loss_backward():
    """The caching allocator at the loss, in units of TV = T*V bytes (T = 4096, V = 32768:
    TV = 128 MiB, every size a multiple of 2 MiB, so segments are the requests): the forward
    allocates the 6 TV transient, keeps 4 TV of it (the tail is split off and freed), and the
    backward's 8 TV workspace fits in no cached block: 6 + 8 = 14 TV reserved, while at most
    4 + 8 = 12 TV are allocated. Replay through simulator.results.reserved with zero-time rows."""
    from simulator.results.reserved import reserved_peak
    from simulator.results.rows import Row

    tv = 4096 * 32768.0
    rows = [Row(0, "compute", "logits.fwd", "compute", 0.0, 1.0, None, ((0.0, 6 * tv, "activations"),
                                                                        (1.0, -2 * tv, "activations"))),
            Row(0, "compute", "logits.bwd", "compute", 2.0, 3.0, None, ((2.0, 8 * tv, "activations"),
                                                                        (3.0, -12 * tv, "activations")))]
    assert reserved_peak({}, rows, 80 * 2**30) == 14 * tv


def test_eager_fp32_cross_entropy_workspace():
    """cross_entropy(pred.float()) in eager PyTorch: the backward holds nll_loss's fp32 T x V gradient
    and log_softmax_backward's fp32 result beside the kept fp32 log-softmax: 8*T*V/t bytes more.
    T = 16384, V = 128256, t = 1: 8 * 16384 * 128256 = 16 810 770 432 bytes (15.66 GiB). t = 8, torch's
    loss parallelism: (zeros + exp(x)) * grad holds three fp32 T x V/8 tensors beside the kept one,
    12 * 16384 * 128256 / 8 bytes. The fused kernel adds nothing."""
    from simulator.costs.memory import loss_workspace_bytes

    assert loss_workspace_bytes(tokens=16384, vocab=128256, cross_entropy="eager-fp32") == 8 * 16384 * 128256
    assert loss_workspace_bytes(tokens=16384, vocab=128256, tp=8, cross_entropy="eager-fp32") == (
        12 * 16384 * 128256 / 8)
    assert loss_workspace_bytes(tokens=16384, vocab=128256, cross_entropy="fused") == 0.0


def test_dtensor_sequence_parallel_keeps_gathered_norm_outputs():
    """torchtitan's TP (DTensor): each column-parallel linear keeps its all-gathered input, so the
    two norm outputs (2 bytes x s*b*h each) are kept whole rather than /8: (1 - 1/8) x 2 x 2 x s*b*h
    more. GPT-3 175B shapes, tp = 8 with SP: sbh(34)/8 + 4 x sbh x 7/8."""
    base = layer_activation_bytes(**GPT, tp=8, sequence_parallel=True, flash_attention=False)
    kept = layer_activation_bytes(**GPT, tp=8, sequence_parallel=True, flash_attention=False,
                                  sp_keeps_gathered=True)
    assert kept - base == pytest.approx(sbh(4) * 7 / 8, rel=1e-12)
    assert layer_activation_bytes(**GPT, tp=8, flash_attention=False, sp_keeps_gathered=True) == (
        layer_activation_bytes(**GPT, tp=8, flash_attention=False))  # nothing without SP


def test_wide_heads_widen_q_k_v_and_the_attention_output():
    """head_dim 256 on hidden 1024 with 8 heads (default width 128): Q and the attention output
    grow from s*b*h to s*b*a*d, K and V from kv*128 to kv*256 elements per token. With s 1024,
    b 1, 2-byte activations, 8 KV heads, no recompute, FlashAttention: Q and output
    2 x 2 x 1024 x (2048 - 1024) = 4,194,304 B, K and V 2 x 2 x 1024 x (2048 - 1024) = 4,194,304 B:
    8,388,608 B more per layer; the default head width gives the same bytes as head_dim 128."""
    from simulator.costs.memory import layer_activation_bytes

    common = dict(seq=1024, batch=1, hidden=1024, heads=8, kv_heads=8, ffn_hidden=4096, mlp="swiglu",
                  flash_attention=True, dropout=False)
    base = layer_activation_bytes(**common)
    assert layer_activation_bytes(**common, head_dim=128) == base
    assert layer_activation_bytes(**common, head_dim=256) - base == 8_388_608
