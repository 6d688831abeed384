"""torch.compile's kernel model and the torchtitan validation mapping, pinned by hand."""

import pytest

import simulator
from simulator.costs.elementwise import rmsnorm_bytes_per_element, rotary_bytes_per_element, swiglu_bytes_per_element
from simulator.validation.records import load_records
from simulator.workload.activations import eager_saved_bytes
from simulator.workload.model import Shard, block_forward

GiB = 2**30


def test_eager_op_by_op_bytes_per_element():
    """bf16 (e = 2): RMSNorm eager 28 + 4*2 = 36 vs fused 2*2 = 4; SwiGLU 5*2 = 10 vs 3*2 = 6;
    rotary 16 + 2*2 = 20 vs 2*2 = 4 (op sequences in simulator/costs/elementwise.py)."""
    assert rmsnorm_bytes_per_element(2, eager=True) == 36 and rmsnorm_bytes_per_element(2, eager=False) == 4
    assert swiglu_bytes_per_element(2, eager=True) == 10 and swiglu_bytes_per_element(2, eager=False) == 6
    assert rotary_bytes_per_element(2, eager=True) == 20 and rotary_bytes_per_element(2, eager=False) == 4


def _llama(compile_: bool | None, recompute: str = "none") -> simulator.Scenario:
    return simulator.Scenario.model_validate({
        "model": {"preset": "llama3-8b", "seq_len": 1024}, "cluster": {"node": "dgx-h100", "nodes": 1},
        "parallelism": {"sharding": "fsdp"},
        "training": {"micro_batch": 1, "global_batch": 8, "compile": compile_, "recompute": recompute}})


def test_block_kernels_follow_compile():
    """Llama 3 8B, T = 1024 tokens, h = 4096, F = 14336, heads 32 + kv 8 of d = 128:
    ln1 = T*h*36 eager, T*h*4 compiled; act = T*F*10 vs T*F*6; rotary = T*(32+8)*128*20 vs *4;
    compile null (framework-fused kernels) has no separate rotary kernel."""
    model = _llama(None).model
    T, h, F, qk = 1024, 4096, 14336, 40 * 128
    by_name = {c: {k.name: k.nbytes for k in block_forward(model, Shard(batch=1, seq=1024, compile=c))}
               for c in (None, True, False)}
    assert by_name[False]["ln1"] == T * h * 36 and by_name[True]["ln1"] == T * h * 4 == by_name[None]["ln1"]
    assert by_name[False]["act"] == T * F * 10 and by_name[True]["act"] == T * F * 6
    assert by_name[False]["rotary"] == T * qk * 20 and by_name[True]["rotary"] == T * qk * 4
    assert "rotary" not in by_name[None]


def test_eager_keeps_fp32_copies_only_without_recompute():
    """Eager, no recompute: 4 bytes x 2 norms x T*h = 4 * 2*1024*4096 (the fp32 norm inputs; rotary's
    complex multiply keeps only the frequency table, simulator/costs/elementwise.py)."""
    assert eager_saved_bytes(_llama(False)) == 4 * 2 * 1024 * 4096
    assert eager_saved_bytes(_llama(True)) == 0.0
    eager, compiled = simulator.simulate(_llama(False)), simulator.simulate(_llama(True))
    assert eager.step_time_s > compiled.step_time_s  # more HBM passes
    assert eager.peak_memory_bytes > compiled.peak_memory_bytes


def test_torchtitan_profile_defaults_to_eager():
    s = simulator.Scenario.model_validate({"framework": "torchtitan", **_llama(None).model_dump(
        include={"model", "cluster", "training"}, exclude={"training": {"compile"}})})
    assert s.training.compile is False and s.source_of("training.compile") == "torchtitan"


def test_torchtitan_records_step_time_and_memory():
    """step = local batch * seq / (tps * tp*pp*cp): Table 1 FSDP 2*8192/5762 = 2.8435 s; Table 6
    CP 8 at 262144 tokens: 8*262144/(16 * 8*8*8) = 256 s; memory 82.4 GiB and 84.9 GiB."""
    records = {r.id: r for r in load_records() if r.source == "torchtitan"}
    assert len(records) == 20
    t1, t6 = records["torchtitan_h100_202412_t1_0"], records["torchtitan_h100_202412_t6_17"]
    assert t1.measured_step_s == pytest.approx(2 * 8192 / 5762)
    assert t6.measured_step_s == pytest.approx(256.0)
    assert t1.measured_peak_memory_bytes == pytest.approx(82.4 * GiB)
    assert t6.measured_peak_memory_bytes == pytest.approx(84.9 * GiB)
    assert t1.scenario["training"]["compile"] is False and records["torchtitan_h100_202412_t1_1"].scenario[
        "training"]["compile"] is True
    # pp > 1: no reshard after forward, no gradient sync until the last micro-batch
    assert t6.scenario["parallelism"]["fsdp"] == {"reshard_after_forward": False, "reduce_every_microbatch": False}
    # selective_ac_option = 'op' (llama3_8b.toml); the December 2024 loss is eager, the June 2025 one compiled
    assert t1.scenario["training"]["recompute"] == "selective-op" and t6.scenario["training"]["recompute"] == "full"
    assert t1.scenario["training"]["cross_entropy"] == "eager-fp32"
    assert records["torchtitan_h200_llama31_8b_32gpu"].scenario["training"]["cross_entropy"] == "fused"
    assert t6.scenario["parallelism"]["tp_comm_overlap"] and t6.scenario["training"]["precision"] == "fp8"
    assert records["torchtitan_h100_202412_t5_13"].scenario["parallelism"]["virtual_stages"] == 2
    assert t1.scenario["cluster"]["node"] == "grand-teton"
    assert records["torchtitan_h200_llama31_8b_32gpu"].scenario["cluster"]["node"] == "dgx-h200"


def test_op_policy_recomputes_every_other_matmul_before_w2():
    """torchtitan's op policy on Llama 3 8B, T = 1024: the backward first re-runs wk (1024 of the
    QKV GEMM's 4096 + 2*1024 = 6144 outputs), wo, and w3 (half of the 2*14336-wide gate/up GEMM),
    2*T*(4096*1024 + 4096*4096 + 4096*14336) = 163 208 757 248 FLOPs, plus the norms, rotary and
    the SwiGLU product; neither the attention (saved) nor w2 (saved; early stop) runs again."""
    from simulator.workload.steps import op_policy_recompute

    model = _llama(True).model
    fwd = block_forward(model, Shard(batch=1, seq=1024, compile=True))
    again = op_policy_recompute(fwd, model)
    gemm_flops = sum(k.flops for k in again if k.kind == "gemm")
    assert gemm_flops == pytest.approx(2 * 1024 * (4096 * 1024 + 4096 * 4096 + 4096 * 14336), rel=1e-12)
    names = [k.name for k in again]
    assert names == ["ln1", "qkv", "rotary", "proj", "residual1", "ln2", "fc1", "act"]


def test_op_policy_step_costs_its_recompute():
    """A selective-op step is slower than no recompute (the recomputed matmuls) and faster than
    full recomputation (a whole forward again)."""
    times = {r: simulator.simulate(_llama(True, r)).step_time_s for r in ("none", "selective-op", "full")}
    assert times["none"] < times["selective-op"] < times["full"]


def test_op_policy_backward_rebuilds_what_it_did_not_keep():
    """Llama 3 8B, T = 1024, flash, tp = 1, bf16, per token. Whole block (compiled): norms' inputs and
    outputs 8h, q and the attention output 4h, k and v 4kv, w1, w3 and their product 6F, the fp32
    log-sum-exp 4*32: 32768 + 16384 + 4096 + 86016 + 128 = 139392; eager adds the norms' fp32 inputs
    4*2h = 32768: 172160. Kept by the op policy: 55424 compiled, 63616 eager (tests/test_memory.py).
    The backward workspace is the gradients' (3F + 2h) * 2 = 102400 plus what is rebuilt:
    102400 + 139392 - 55424 = 186368 compiled, 102400 + 172160 - 63616 = 210944 eager."""
    from simulator.workload.activations import ActivationSizes

    for compile_, per_token in ((True, 186368), (False, 210944)):
        sizes = ActivationSizes.of(_llama(compile_, recompute="selective-op"))
        assert sizes.per_layer == 1024 * (55424 if compile_ else 63616)
        assert sizes.backward_workspace == 1024 * per_token


def test_block_forward_holds_the_mlp_working_set_under_recomputation():
    """Llama 3 8B, T = 1024, tp = 1, bf16: a block forward under the op policy or full
    recomputation holds (3F + 2h) * 2 = (43008 + 8192) * 2 = 102400 bytes per token, the MLP's
    gate, up, product, input and output; the embedding and logits hold none; without
    recomputation every one of those tensors is kept (0)."""
    from simulator.workload.activations import ActivationSizes

    for recompute in ("selective-op", "full"):
        sizes = ActivationSizes.of(_llama(True, recompute=recompute))
        assert sizes.forward_working_set("block") == 1024 * 102400
        assert sizes.forward_working_set("logits") == sizes.forward_working_set("embedding") == 0.0
    assert ActivationSizes.of(_llama(True)).forward_working_set("block") == 0.0
