"""Megatron-Core's selective ``recompute_modules`` (``training.recompute_modules``): what each
module stops keeping, what it re-runs in the backward, and the messages of bad combinations."""

from __future__ import annotations

import pytest

from simulator.costs.flops import recompute_flops_per_token, selective_recomputed_params
from simulator.errors import InfeasibleError
from simulator.scenario.spec import Scenario
from simulator.workload.activations import ActivationSizes, recomputed_matmul_params, shard_of
from simulator.workload.moe import moe_shape
from simulator.workload.parallel import layer_steps
from simulator.workload.steps import CommStep, ComputeStep, LayerSpec
from tests.test_moe import DEEPSEEK_V3, MIXTRAL

T = 4096  # one 4096-token sequence per micro-batch, tp 1: every rank keeps all of them


def mixtral(training: dict, **model: object) -> Scenario:
    """Mixtral 8x7B (h 4096, F_e 14336, top-2, SwiGLU, bf16) on 16 H100, ep 8."""
    return Scenario.model_validate({
        "model": {**MIXTRAL, **model}, "cluster": {"node": "p5.48xlarge", "nodes": 2},
        "parallelism": {"ep": 8, "sharding": "zero1"},
        "training": {"global_batch": 32, "micro_batch": 1, "recompute": "selective", **training}})


def dense(training: dict) -> Scenario:
    """Mixtral's shape without experts: a dense SwiGLU block, F = 14336."""
    model = {k: v for k, v in MIXTRAL.items() if k not in ("experts", "experts_per_token")}
    return Scenario.model_validate({"model": model, "cluster": {"node": "p5.48xlarge", "nodes": 2},
                                    "training": {"global_batch": 32, "recompute": "selective", **training}})


def deepseek(training: dict) -> Scenario:
    return Scenario.model_validate({"model": DEEPSEEK_V3, "cluster": {"node": "dgx-h800", "nodes": 32},
                                    "parallelism": {"pp": 16, "ep": 16, "sharding": "zero1",
                                                    "stage_layers": [3] + [4] * 14 + [2]},
                                    "training": {"global_batch": 256, "recompute": "selective", **training}})


def test_default_modules_are_korthikantis_selective() -> None:
    """No recompute_modules under selective is Megatron-Core's default [core_attn]: the same bytes."""
    assert ActivationSizes.of(mixtral({})) == ActivationSizes.of(mixtral({"recompute_modules": ["core_attn"]}))


def test_moe_act_drops_the_routed_activation_output() -> None:
    """moe_act: the routed experts' activation output (fc2's input) is not kept:
    top_k x F_e x T x e = 2 x 14336 x 4096 x 2 = 234,881,024 bytes per MoE layer (balanced routing, tp 1)."""
    base = ActivationSizes.of(mixtral({"recompute_modules": ["core_attn"]}))
    act = ActivationSizes.of(mixtral({"recompute_modules": ["core_attn", "moe_act"]}))
    assert base.moe_layer - act.moe_layer == 2 * 14336 * T * 2 == 234_881_024
    assert act.per_layer == base.per_layer  # a dense block has no routed experts


def test_layernorm_drops_the_moe_layers_pre_mlp_norm_output_only() -> None:
    """layernorm: an MoE layer's pre-MLP norm is a module of its own, its output (h x T x e =
    4096 x 4096 x 2 = 33,554,432 bytes) not kept; the input norm and a dense layer's pre-MLP norm
    are fused into their linears (Transformer Engine spec) and stay."""
    base = ActivationSizes.of(mixtral({"recompute_modules": ["core_attn"]}))
    norm = ActivationSizes.of(mixtral({"recompute_modules": ["core_attn", "layernorm"]}))
    assert base.moe_layer - norm.moe_layer == 4096 * T * 2 == 33_554_432
    assert norm.per_layer == base.per_layer


def test_mlp_drops_a_dense_mlp_and_its_fused_norm_output() -> None:
    """mlp: the dense MLP runs in a checkpoint keeping only its input: gate+up (2F), their product
    (F) and the fused norm's output (h) go, (3 x 14336 + 4096) x 4096 x 2 = 385,875,968 bytes."""
    base = ActivationSizes.of(dense({"recompute_modules": ["core_attn"]}))
    mlp = ActivationSizes.of(dense({"recompute_modules": ["core_attn", "mlp"]}))
    assert base.per_layer - mlp.per_layer == (3 * 14336 + 4096) * T * 2 == 385_875_968


def test_core_attn_off_keeps_the_log_sum_exp() -> None:
    """Without core_attn the fused attention's fp32 log-sum-exp is kept: 4 x heads x T = 4 x 32 x 4096
    = 524,288 bytes per layer (its Q, K, V and output are kept either way)."""
    core = ActivationSizes.of(dense({"recompute_modules": ["core_attn"]}))
    none = ActivationSizes.of(dense({"recompute_modules": []}))
    assert none.per_layer - core.per_layer == 4 * 32 * T == 524_288
    assert none.per_layer == ActivationSizes.of(dense({"recompute": "none"})).per_layer


def test_shared_experts_and_mla_up_proj_on_deepseek_v3() -> None:
    """DeepSeek-V3 (h 7168, 128 heads, F_e 2048, one shared expert), 4096 tokens, tp 1.
    shared_experts: gate+up, product of the shared expert, (2e + e) x F_e x T = 6 x 2048 x 4096 =
    50,331,648 bytes per MoE layer. mla_up_proj: the up-projections' norm outputs, 2 x (1536 + 512)
    = 4,096, and the attention's query, key (128 x 192) and value (128 x 128), 2 x 128 x 512 =
    131,072 a token (:mod:`simulator.costs.mla_memory`): 135,168 x 4096 = 553,648,128 bytes in
    every layer."""
    base = ActivationSizes.of(deepseek({"recompute_modules": ["core_attn"]}))
    shared = ActivationSizes.of(deepseek({"recompute_modules": ["core_attn", "shared_experts"]}))
    up = ActivationSizes.of(deepseek({"recompute_modules": ["core_attn", "mla_up_proj"]}))
    assert base.moe_layer - shared.moe_layer == 6 * 2048 * T == 50_331_648
    assert base.per_layer - up.per_layer == base.moe_layer - up.moe_layer == (4096 + 131_072) * T == 553_648_128


def _bwd_kernels(sc: Scenario) -> list:
    spec = LayerSpec(sc.model, shard_of(sc), "block", "bwd", recompute="selective",
                     recompute_modules=frozenset(sc.training.recompute_modules or ["core_attn"]),
                     moe=moe_shape(sc) if sc.model.moe else None)
    return [k for s in layer_steps(spec) if isinstance(s, ComputeStep) for k in s.kernels]


def test_moe_act_reruns_the_activation_before_fc2s_backward() -> None:
    """The backward of an MoE block with moe_act holds one more kernel, the routed activation's
    forward, right before experts.fc2's dgrad: it sweeps the rank's routed rows, f x T x k = 1 x
    4096 x 2 = 8192 (balanced), by F_e = 14336."""
    base = _bwd_kernels(mixtral({"recompute_modules": ["core_attn"]}))
    act = _bwd_kernels(mixtral({"recompute_modules": ["core_attn", "moe_act"]}))
    assert len(act) == len(base) + 1
    i = next(n for n, k in enumerate(act) if k.name == "experts.act")
    assert act[i + 1].name == "experts.fc2.dgrad" and act[i].kind == "memory"
    assert act[i].elements == (8192, 14336)
    assert [k for k in act if k is not act[i]] == base


def test_mlp_reruns_norm_fc1_act_fc2_before_fc2s_backward() -> None:
    """mlp re-runs the dense MLP's forward (ln2, fc1, act, fc2) before fc2's dgrad: extra FLOPs
    2 x T x h x 2F + 2 x T x F x h = 6 x 4096 x 4096 x 14336 = 1,443,109,011,456."""
    base = _bwd_kernels(dense({"recompute_modules": ["core_attn"]}))
    mlp = _bwd_kernels(dense({"recompute_modules": ["core_attn", "mlp"]}))
    extra = [k for k in mlp if k not in base]
    assert [k.name for k in extra] == ["ln2", "fc1", "act", "fc2"]
    assert sum(k.flops for k in extra) == 6 * T * 4096 * 14336 == 1_443_109_011_456
    assert mlp[mlp.index(extra[-1]) + 1].name == "fc2.dgrad"


def test_recompute_flops_count_the_modules_matmuls() -> None:
    """Reported recompute FLOPs per token: DeepSeek-V3 with [mla_up_proj, mlp], no attention core:
    2 x (3 dense layers x 3 x 7168 x 18432 + 61 layers x (1536 x 128 x 192 + 512 x 128 x 256))
    = 2 x (1,189,085,184 + 61 x (37,748,736 + 16,777,216)) = 2 x 4,515,168,256 = 9,030,336,512."""
    sc = deepseek({"recompute_modules": ["mla_up_proj", "mlp"]})
    params = recomputed_matmul_params(sc)
    assert params == 3 * 3 * 7168 * 18432 + 61 * (1536 * 128 * 192 + 512 * 128 * 256) == 4_515_168_256
    assert recompute_flops_per_token("selective", 0, 61, 7168, 4096, core_attn=False,
                                     selective_params=params) == 9_030_336_512
    assert selective_recomputed_params(frozenset({"moe_act", "layernorm"}), dense_mlp=1.0, dense_layers=3, shared=1.0,
                                       moe_layers=58, mla_up=1.0, layers=61) == 0.0


@pytest.mark.parametrize(("make", "training", "words"), [
    (mixtral, {"recompute": "full", "recompute_modules": ["moe_act"]}, "only with recompute: selective"),
    (mixtral, {"recompute_modules": ["moe_act", "moe_act"]}, "moe_act more than once"),
    (mixtral, {"recompute_modules": ["mla_up_proj"]}, "needs multi-head latent attention"),
    (mixtral, {"recompute_modules": ["shared_experts"]}, "needs an MoE model with shared experts"),
    (dense, {"recompute_modules": ["moe_act"]}, "moe_act needs an MoE model"),
])
def test_bad_recompute_modules_name_the_field(make, training: dict, words: str) -> None:
    with pytest.raises(InfeasibleError) as err:
        make(training)
    assert err.value.field == "training.recompute_modules" and words in str(err.value)


def test_unknown_module_is_a_schema_error() -> None:
    with pytest.raises(ValueError, match="recompute_modules"):
        mixtral({"recompute_modules": ["attention"]})


def test_moe_act_lengthens_the_backward_by_the_activations_forward_time() -> None:
    """The timed backward of an MoE block with moe_act lasts the block's backward plus exactly the
    roofline time of the re-run activation kernel (no host bound: one pass, the default host costs 0)."""
    from simulator.workload.model import kernel_time_s
    from simulator.workload.profile import compute_profile
    from simulator.workload.steps import timed

    def bwd_s(sc: Scenario) -> tuple[float, list]:
        spec = LayerSpec(sc.model, shard_of(sc), "block", "bwd", recompute="selective",
                         recompute_modules=frozenset(sc.training.recompute_modules or ()), moe=moe_shape(sc))
        steps = timed(layer_steps(spec), profile, "bf16", "fa2")
        return sum(s.duration_s for s in steps), [k for s in steps if isinstance(s.step, ComputeStep)
                                                  for k in s.step.kernels]

    base_sc = mixtral({"recompute_modules": ["core_attn"]})
    profile = compute_profile(base_sc.cluster.gpu_spec, None)
    base, _ = bwd_s(base_sc)
    act, kernels = bwd_s(mixtral({"recompute_modules": ["core_attn", "moe_act"]}))
    again = next(k for k in kernels if k.name == "experts.act")
    assert act - base == pytest.approx(kernel_time_s(profile, again, "bf16", "fa2"), rel=1e-12)
    assert act > base


def test_search_layouts_keep_the_modules_for_selective_only() -> None:
    """A search over a base with recompute_modules tries the other policies without them (they are
    read only under selective) and keeps them with selective."""
    from simulator.search.space import Layout, layout_scenario, scenario_json

    base = scenario_json(mixtral({"recompute_modules": ["core_attn", "moe_act"]}))
    layout = Layout(nodes=2, tp=1, pp=1, cp=1, dp=16, micro_batch=1, schedule="1f1b", virtual_stages=1,
                    sharding="zero1", shard_group_size=None, ep=8)
    assert layout_scenario(base, layout, "full").training.recompute_modules is None
    assert layout_scenario(base, layout, "selective").training.recompute_modules == ["core_attn", "moe_act"]


def test_moe_keeps_only_the_checkpoints_input() -> None:
    """moe: the MoE layer's MLP runs in a checkpoint that keeps only its input (the pre-MLP norm
    output, kept anyway): Mixtral (h 4096, F_e 14336, top-2, balanced, tp 1, 4096 tokens) drops the
    routed rows' gate+up and product, (2e + e) x T x k x F_e = 6 x 4096 x 2 x 14336 = 704,643,072,
    and the dispatched tokens fc1 keeps, T x k x h x e = 4096 x 2 x 4096 x 2 = 67,108,864:
    771,751,936 bytes per MoE layer; nothing in a dense block."""
    base = ActivationSizes.of(mixtral({"recompute_modules": ["core_attn"]}))
    moe = ActivationSizes.of(mixtral({"recompute_modules": ["core_attn", "moe"]}))
    assert base.moe_layer - moe.moe_layer == 6 * T * 2 * 14336 + T * 2 * 4096 * 2 == 771_751_936
    assert moe.per_layer == base.per_layer
    both = ActivationSizes.of(mixtral({"recompute_modules": ["core_attn", "moe", "moe_act"]}))
    assert both.moe_layer == moe.moe_layer  # moe_act has nothing left to drop


def _bwd_steps(sc: Scenario) -> list:
    spec = LayerSpec(sc.model, shard_of(sc), "block", "bwd", recompute="selective",
                     recompute_modules=frozenset(sc.training.recompute_modules or ["core_attn"]),
                     moe=moe_shape(sc) if sc.model.moe else None)
    return layer_steps(spec)


def test_moe_reruns_the_layers_forward_with_its_all_to_alls() -> None:
    """moe re-runs the MoE layer's forward (router, permute, experts, unpermute) before its backward,
    its dispatch and combine included: Mixtral on ep 8 then runs 4 all-to-alls in a block's backward
    instead of 2, each T x k x h x e = 4096 x 2 x 4096 x 2 = 67,108,864 bytes, the re-run ones
    before the first backward kernel of the MLP (unpermute.bwd); with layernorm the pre-MLP norm's
    re-run, which rebuilds the checkpoint's input, comes first."""
    base = _bwd_steps(mixtral({"recompute_modules": ["core_attn"]}))
    moe = _bwd_steps(mixtral({"recompute_modules": ["core_attn", "moe", "layernorm"]}))
    a2a = [s for s in moe if isinstance(s, CommStep)]
    assert len([s for s in base if isinstance(s, CommStep)]) == 2
    assert [(s.name, s.op, s.nbytes) for s in a2a] == [
        ("recompute.dispatch", "all_to_all", 67_108_864), ("recompute.combine", "all_to_all", 67_108_864),
        ("combine.bwd", "all_to_all", 67_108_864), ("dispatch.bwd", "all_to_all", 67_108_864)]
    kernels = [k.name for s in moe if isinstance(s, ComputeStep) for k in s.kernels]
    again = kernels[kernels.index("ln2"):kernels.index("unpermute.bwd")]
    assert again == ["ln2", "router", "permute", "experts.fc1", "experts.act", "experts.fc2", "unpermute"]
    assert [s.name for s in moe].index("recompute.combine") < [s.name for s in moe].index("combine.bwd")


def test_moe_recompute_flops_count_the_layers_matmuls() -> None:
    """Recompute FLOPs' matmul weights with moe on Mixtral (32 MoE layers, 8 experts, top-2, h 4096,
    F_e 14336, SwiGLU): 32 x (4096 x 8 + 3 x 4096 x 2 x 14336) = 32 x (32,768 + 352,321,536) =
    11,275,337,728."""
    assert recomputed_matmul_params(mixtral({"recompute_modules": ["moe"]})) == \
        32 * (4096 * 8 + 3 * 4096 * 2 * 14336) == 11_275_337_728


def _tp2(model: dict, parallelism: dict, modules: list[str]) -> list:
    sc = Scenario.model_validate({"model": model, "cluster": {"node": "p5.48xlarge", "nodes": 2},
                                  "parallelism": {"tp": 2, **parallelism},
                                  "training": {"global_batch": 32, "recompute": "selective",
                                               "recompute_modules": modules}})
    return [(s.name, s.op, s.nbytes) for s in _bwd_steps(sc) if isinstance(s, CommStep)]


@pytest.mark.parametrize(("sp", "again"), [
    (True, [("recompute.tp.ag.mlp", "all_gather"), ("recompute.tp.rs.mlp", "reduce_scatter")]),
    (False, [("recompute.tp.ar.mlp", "all_reduce")])])
def test_mlp_reruns_its_tensor_parallel_collectives(sp: bool, again: list) -> None:
    """mlp's checkpoint re-runs the whole MLP, its TP collectives included: at tp 2 a dense block's
    backward gains the forward's all-gather and reduce-scatter under sequence parallelism (its
    all-reduce without), each of the gathered T x h x e = 4096 x 4096 x 2 = 33,554,432 bytes,
    before the MLP's own backward collectives."""
    model = {k: v for k, v in MIXTRAL.items() if k not in ("experts", "experts_per_token")}
    base = _tp2(model, {"sequence_parallel": sp}, ["core_attn"])
    mlp = _tp2(model, {"sequence_parallel": sp}, ["core_attn", "mlp"])
    assert [c for c in mlp if c[0].startswith("recompute.")] == [(n, op, 33_554_432) for n, op in again]
    assert [c for c in mlp if not c[0].startswith("recompute.")] == base
    assert mlp[:len(again)] == [(n, op, 33_554_432) for n, op in again]


def test_shared_experts_rerun_their_tensor_parallel_collectives() -> None:
    """shared_experts at tp 2 (sequence parallel, as MoE needs): the shared experts' re-run forward
    gathers its input and reduce-scatters its output again, 4096 x 4096 x 2 = 33,554,432 bytes each,
    right before their backward's gradient all-gather."""
    model = {**MIXTRAL, "shared_experts": 1}
    par = {"ep": 4, "sequence_parallel": True, "sharding": "zero1"}
    base = _tp2(model, par, ["core_attn"])
    shared = _tp2(model, par, ["core_attn", "shared_experts"])
    i = [c[0] for c in shared].index("tp.ag.shared.grad")
    assert shared[i - 2:i] == [("recompute.tp.ag.shared", "all_gather", 33_554_432),
                               ("recompute.tp.rs.shared", "reduce_scatter", 33_554_432)]
    assert shared[:i - 2] + shared[i:] == base


def test_selective_modules_count_what_the_backward_rebuilds() -> None:
    """The backward holds what a selective module re-makes, the larger of the MLP's and the
    attention's rebuilds (the MLP's backward ends before the attention's begins), 4096 tokens, tp 1:

    * Mixtral, core_attn: the fused attention's fp32 log-sum-exp, 4 x 32 x 4096 = 524,288;
    * with moe_act, in an MoE block: fc2's input, 2 x 14336 x 4096 x 2 = 234,881,024 (> 524,288);
    * layernorm + moe_act (gpt-oss's pair): with the pre-MLP norm output, 234,881,024 + 4096 x 4096
      x 2 = 268,435,456; a dense block rebuilds nothing then (its norms are fused into linears);
    * moe: the whole MoE MLP, 771,751,936 (test_moe_keeps_only_the_checkpoints_input);
    * DeepSeek-V3 with [mla_up_proj, mlp]: a dense block's MLP, (3 x 18432 + 7168) x 4096 x 2 =
      511,705,088, or MLA's up-projections' tensors, 135,168 x 4096 = 553,648,128: the larger."""
    def rebuilt(sc: Scenario) -> tuple[float, float]:
        a = ActivationSizes.of(sc)
        return a.rebuilt, a.moe_rebuilt

    assert rebuilt(mixtral({"recompute_modules": ["core_attn"]})) == (4 * 32 * T, 4 * 32 * T) == (524_288, 524_288)
    assert rebuilt(mixtral({"recompute_modules": ["core_attn", "moe_act"]}))[1] == 2 * 14336 * T * 2 == 234_881_024
    assert rebuilt(mixtral({"recompute_modules": ["layernorm", "moe_act"]})) == (0, 268_435_456)
    assert rebuilt(mixtral({"recompute_modules": ["moe"]}))[1] == 771_751_936
    assert (3 * 18432 + 7168) * T * 2 == 511_705_088 < 553_648_128
    assert rebuilt(deepseek({"recompute_modules": ["mla_up_proj", "mlp"]})) == (553_648_128, 553_648_128)


def test_rebuilt_bytes_sit_in_the_backward_workspace() -> None:
    """The rebuilt bytes are part of the block's backward workspace: moe_act adds fc2's input,
    234,881,024 bytes, to an MoE block's workspace over core_attn's 524,288 (the rest unchanged)."""
    base = ActivationSizes.of(mixtral({"recompute_modules": ["core_attn"]}))
    act = ActivationSizes.of(mixtral({"recompute_modules": ["core_attn", "moe_act"]}))
    assert act.moe_workspace - base.moe_workspace == 234_881_024 - 524_288
    assert act.backward_workspace == base.backward_workspace


def test_moe_is_read_in_moe_layers_only() -> None:
    """Megatron-Core reads moe in MoELayer alone (moe_layer.py:247-251 at d98e8a6) and accepts it with
    a dense model: dtsim takes it too and a dense block keeps, re-runs and rebuilds the same."""
    assert ActivationSizes.of(dense({"recompute_modules": ["core_attn", "moe"]})) == \
        ActivationSizes.of(dense({"recompute_modules": ["core_attn"]}))
    assert _bwd_kernels(dense({"recompute_modules": ["core_attn", "moe"]})) == \
        _bwd_kernels(dense({"recompute_modules": ["core_attn"]}))
