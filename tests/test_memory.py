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


def test_forward_workspace_is_the_mlp_working_set_under_recomputation():
    """A block forward that keeps too little to hold its temporaries (full recomputation,
    torchtitan's op policy) holds the MLP's working set while it runs: tokens * (3F/t + 2h) * e
    with SwiGLU. Llama 3.1 70B, 16 x 8192 = 131 072 tokens, F = 28 672, h = 8192, t = 8, bf16:
    131072 * (10752 + 16384) * 2 = 7 113 539 584 bytes. GELU, F = 4h = 16 384 at h = 4096, t = 1,
    4096 tokens: 4096 * (2*16384 + 2*4096) * 2 = 335 544 320. Without recomputation, and under
    Megatron's selective recomputation (the MLP's tensors kept), none: 0."""
    from simulator.costs.memory import forward_workspace_bytes

    llama70 = dict(tokens=131072, hidden=8192, ffn_hidden=28672, mlp="swiglu", tp=8, act_bytes=2)
    assert forward_workspace_bytes(**llama70, recompute="full") == 7113539584
    assert forward_workspace_bytes(**llama70, recompute="selective-op") == 7113539584
    assert forward_workspace_bytes(**llama70, recompute="none") == 0.0
    assert forward_workspace_bytes(**llama70, recompute="selective") == 0.0
    assert forward_workspace_bytes(tokens=4096, hidden=4096, ffn_hidden=16384, mlp="gelu", tp=1, act_bytes=2,
                                   recompute="full") == 335544320


def test_forward_working_set_stays_cached_beside_what_the_forwards_keep():
    """Two block forwards, each holding an 8 U working set (U = 128 MiB, a multiple of 2 MiB, so
    a segment is its request) and keeping 1 U made while the set is live, then a 9 U loss
    request. The second forward reuses the first's freed set whole; each kept 1 U takes its own
    segment (no free block while the set is live): 8 + 1 + 1 = 10 U. The 9 U request fits in no
    cached block (the 8 U set is one segment): a new segment, 19 U reserved while at most
    1 + 1 + 9 = 11 U are allocated. Kept made after the set is freed instead would be carved
    from it, and the next forward's 8 U would need a new segment each time."""
    from simulator.results.reserved import reserved_peak
    from simulator.results.rows import Row

    u = 128 * 2.0**20
    rows = [Row(0, "compute", f"fwd.block{i}", "compute", i, i + 1.0, None,
                ((i, 8 * u, "activations"), (i + 0.5, u, "activations"), (i + 1.0, -8 * u, "activations")))
            for i in (0.0, 1.0)]
    rows.append(Row(0, "compute", "fwd.logits", "compute", 2.0, 3.0, None,
                    ((2.0, 9 * u, "activations"), (3.0, -9 * u, "activations"))))
    assert reserved_peak({}, rows[:2], 80 * 2**30) == 10 * u
    assert reserved_peak({}, rows, 80 * 2**30) == 19 * u


def test_fused_forward_keeps_its_bytes_while_its_working_set_is_live():
    """fuse() lays a job with a working set out as: the set allocated at the job's start, what
    it keeps halfway through its last compute step, the set freed at its end. Two compute steps
    of 1 s and 3 s: +W at 0, kept at 1 + 3/2 = 2.5 s, -W at 4 s."""
    from simulator.ir import MemDelta
    from simulator.workload.fusion import Job, fuse
    from simulator.workload.steps import ComputeStep, TimedStep

    steps = [TimedStep(ComputeStep("a", ()), 1.0), TimedStep(ComputeStep("b", ()), 3.0)]
    macro = fuse([Job("block", "fwd", 0, steps, 0.0, 5.0, 7.0)], lambda *a: None, {}, 0.0)  # type: ignore[arg-type,return-value]
    assert macro.mem == (MemDelta(False, 7.0, "activations", 0.0), MemDelta(False, 5.0, "activations", 2.5),
                         MemDelta(False, -7.0, "activations", 4.0))
