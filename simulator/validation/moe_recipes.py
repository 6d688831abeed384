"""The Megatron-Bridge performance recipes behind the ``moe`` source's table rows.

The tables say their numbers "were obtained using performance recipes available [in]
scripts/performance" (NVIDIA-NeMo/Megatron-Bridge@0a25f911 docs/performance-summary-archive.md:32).
Each NeMo container ships one Megatron-Bridge release (25.09: branch r0.1.0; 25.11: tag v0.2.0,
"25.11 release notes"; 26.02: tag v0.3.0, whose branch holds "cp: 26.02 perf summary (2492)"),
and at that commit scripts/performance holds the per-model, per-GPU settings the rows ran with.
This module lists them for the DGX-H100 rows: the settings dtsim models are written into the
scenario (:data:`RECIPES` ``settings``), the others are named with their source as not modelled,
so every row of a container states the same recipe facts. Nothing here is fitted.

Where the recipe's layout differs from the row's (the 25.11 Qwen3-30B-A3B and GPT-OSS rows state
MBS 2 / VP 24 and MBS 4, the v0.2.0 configs MBS 1 / VP 12 and MBS 1), the row's own statement wins
and the difference is noted: the row is the measurement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Recipe", "RECIPES", "FP8_CS_RECIPE", "recipe_for", "apply"]

R010 = "NVIDIA-NeMo/Megatron-Bridge@a2884419541f9969b6fc34517cb3e94190c13ae4 (branch r0.1.0, 'Cherry pick perf 2509')"
V020 = "NVIDIA-NeMo/Megatron-Bridge@7af9601c9da746d21481194356295bfe23df3737 (tag v0.2.0, 25.11)"
V030 = "NVIDIA-NeMo/Megatron-Bridge@21b02e0cfb2f8ff907e0d8baee0c5205876c6812 (tag v0.3.0, 26.02)"

# scripts/performance files per release
_Q2, _Q3 = "scripts/performance/configs/qwen3/", "scripts/performance/configs/qwen/"
_G2, _G3 = "scripts/performance/configs/gpt_oss/", "scripts/performance/configs/gpt_oss/"


@dataclass(frozen=True)
class Recipe:
    """One row's recipe: scenario settings dtsim models (dotted path, value, why) and the
    recipe's settings it does not model."""

    settings: tuple[tuple[str, Any, str], ...]
    not_modelled: tuple[str, ...]
    differs: str = ""  # where the recipe's layout is not the row's (the row's is kept)


def _grad_reduce(source: str) -> tuple[str, Any, str]:
    return ("training.grad_reduce_dtype", "bf16",
            f"grad_reduce_in_fp32 False (mixed_precision and ddp): {source}; gradients reduced in the parameters' bf16 "
            "instead of the nemo profile's fp32")


def _moe_provider(release: str, qwen: bool) -> tuple[str, Any, str]:
    where = ("src/megatron/bridge/models/qwen/qwen_provider.py:" + ("394-396" if release == V020 else "395-397")
             if qwen else "src/megatron/bridge/models/gpt_oss/gpt_oss_provider.py:71-73")
    return ("parallelism.moe.dispatcher", "alltoall",
            f"moe_token_dispatcher_type 'alltoall' with moe_grouped_gemm and moe_permute_fusion True: {release} {where} "
            "(dtsim's routed experts are one grouped GEMM per pass)")


def _a2a_overlap(release: str, where: str) -> tuple[tuple[str, Any, str], ...]:
    helper = ("scripts/performance/utils/helpers.py:182-186" if release == V020
              else "scripts/performance/utils/overrides.py:148-155")
    return (("parallelism.moe.overlap_ep_comm", False,
             f"moe_shared_expert_overlap False: moe_a2a_overlap True ({release} {where}) sets it in {helper}"),
            ("parallelism.moe.overlap_a2a_1f1b", True,
             f"overlap_moe_expert_parallel_comm True: moe_a2a_overlap True ({release} {where}) sets it in {helper}; "
             "Megatron-Core's combined 1F1B schedule, one micro-batch's dispatch/combine beside another's compute"),
            ("parallelism.moe.delay_wgrad_compute", True,
             f"delay_wgrad_compute True: moe_a2a_overlap True ({release} {where}) sets it in {helper}"))


def _qwen3(release: str, preset: str) -> Recipe:
    pre, common = (_Q2 + "qwen3_llm_pretrain.py", "33-47") if release == V020 else (_Q3 + "qwen3_llm_pretrain.py", "30-44")
    base = _Q2 + "workload_base_configs.py" if release == V020 else _Q3 + "qwen3_workload_base_configs.py"
    big = preset == "qwen3-235b-a22b"
    if release == V020:
        fn, cfg = ("141-159", "135-144") if big else ("231-249", "233-239")
    else:
        fn, cfg = ("167-190", "171-180 and 268-271") if big else ("297-320", "421-429")
    overlap = _a2a_overlap(release, f"{base}:{cfg}")
    deepep = not big and release == V030
    dispatcher = _moe_provider(release, True)
    if deepep:  # the flex dispatcher with its DeepEP backend replaces the provider's alltoall
        dispatcher = ("parallelism.moe.dispatcher", "deepep",
                      f"moe_flex_dispatcher_backend 'deepep' ({release} {base}:{cfg}) with moe_token_dispatcher_type "
                      f"'flex' ({release} src/megatron/bridge/training/flex_dispatcher_backend.py:67-69)")
    settings = [
        ("training.recompute", "none",
         f"recompute_granularity, recompute_method and recompute_num_layers None: {release} {pre}:{common}"),
        _grad_reduce(f"{release} {pre}:{common}"),
        dispatcher,
        *overlap,
    ]
    if big:
        settings.append(("parallelism.tp_comm_overlap", False,
                         f"CommOverlapConfig(tp_comm_overlap=False): {release} {pre}:{fn}"))
    unmodelled = [f"moe_router_fusion True ({release} {pre}:{common}): dtsim times the router as its GEMM only"]
    differs = ""
    if release == V020 and not big:
        differs = (f"the recipe's layout ({release} {base}:27-31 and 233-239: MBS 1 by default, VP 12, GBS 512) is not "
                   "the row's MBS 2, VP 24; the row's is kept")
    return Recipe(tuple(settings), tuple(unmodelled), differs)


def _gpt_oss(release: str) -> Recipe:
    pre, common, fn = ((_G2 + "gpt_oss_llm_pretrain.py", "31-37", "97-113") if release == V020
                       else (_G3 + "gpt_oss_llm_pretrain.py", "28-34", "134-155"))
    cfg = (_G2 + "workload_base_configs.py:22-28 and 58-62" if release == V020
           else _G3 + "gpt_oss_workload_base_configs.py:79-83 and 114-117")
    if release == V020:  # the modules are set, the granularity is not: Megatron-Core reads them only under selective
        recompute: tuple[tuple[str, Any, str], ...] = ((
            "training.recompute", "none",
            f"recompute_modules ['layernorm', 'moe_act'] ({release} {cfg}) without recompute_granularity: "
            f"{release} scripts/performance/utils/helpers.py:163-182 sets only recipe.model.recompute_modules, the "
            "gpt_oss recipe and provider set no granularity, so it stays Megatron-Core's default None "
            "(megatron/core/transformer/transformer_config.py:532 at NVIDIA/Megatron-LM@d98e8a64), which recomputes "
            "nothing; Megatron-Bridge@c9dd0586 'selective granularity recompute (#1653)', 2025-12-10, after v0.2.0, "
            "adds recompute_granularity = 'selective' there"),)
    else:
        why = (f"recompute_modules ['layernorm', 'moe_act'] ({release} {cfg}) with recompute_granularity "
               f"'selective': {release} scripts/performance/utils/overrides.py:141-143")
        recompute = (("training.recompute", "selective", why), ("training.recompute_modules", ["layernorm", "moe_act"], why))
    return Recipe(
        (_grad_reduce(f"{release} {pre}:{common}, applied by the H100 config :{fn}"), _moe_provider(release, False),
         *recompute),
        (f"moe_router_fusion True ({release} {pre}:{common}): dtsim times the router as its GEMM only",),
        f"the recipe's layout ({release} {cfg}: MBS 1, GBS 512) is not the row's MBS 4; the row's is kept"
        if release == V020 else "")


def _deepseek_v3_2509() -> Recipe:
    run = "scripts/performance/run_script.py"
    return Recipe(
        (("parallelism.zero.overlap_comm", False, f"overlap_grad_reduce False on H100: {R010} {run}:101-102"),
         ("parallelism.moe.overlap_ep_comm", False, f"moe_shared_expert_overlap False on H100: {R010} {run}:82-85"),
         ("parallelism.moe.dispatcher", "deepep", f"DeepEP dispatcher (enable_deepep on H100, {R010} {run}:56 and 73)"),
         ("parallelism.moe.overlap_a2a_1f1b", True,
          f"overlap_moe_expert_parallel_comm True on H100 ({R010} {run}:62 and 82-85): Megatron-Core's combined 1F1B "
          "schedule"),
         ("parallelism.moe.delay_wgrad_compute", True, f"delay_wgrad_compute True on H100 ({R010} {run}:62 and 82-85)"),
         ("training.recompute", "selective", f"recompute_granularity 'selective': {R010} "
          "src/megatron/bridge/recipes/deepseek/deepseek_v3.py:189, the default of pretrain_config, which "
          f"{run}:23 imports as deepseek_v3_pretrain_config and calls without it (:67-75)"),
         ("training.recompute_modules", ["mla_up_proj", "mlp"], f"recompute_modules on H100: {R010} {run}:90-91")),
        ())


# (container, preset) -> the recipe of that container's DGX-H100 row
RECIPES: dict[tuple[str, str], Recipe] = {
    ("25.09", "deepseek-v3"): _deepseek_v3_2509(),
    ("25.11", "qwen3-30b-a3b"): _qwen3(V020, "qwen3-30b-a3b"),
    ("25.11", "qwen3-235b-a22b"): _qwen3(V020, "qwen3-235b-a22b"),
    ("25.11", "gpt-oss-120b"): _gpt_oss(V020),
    ("26.02", "qwen3-30b-a3b"): _qwen3(V030, "qwen3-30b-a3b"),
    ("26.02", "qwen3-235b-a22b"): _qwen3(V030, "qwen3-235b-a22b"),
    ("26.02", "gpt-oss-120b"): _gpt_oss(V030),
}

# the FP8 rows' precision recipe: the H100 Qwen3 configs exist as BF16 and FP8_CS only
FP8_CS_RECIPE = {
    "25.11": f"{V020} scripts/performance/utils/helpers.py:37-41 (fp8_cs: bf16_with_fp8_current_scaling_mixed with "
             "first_last_layers_bf16 False) and src/megatron/bridge/training/mixed_precision.py:283-290 (fp8_recipe "
             "'tensorwise', fp8_param_gather True)",
    "26.02": f"{V030} scripts/performance/utils/precision.py:28-32 (fp8_cs: bf16_with_fp8_current_scaling_mixed with "
             "first_last_layers_bf16 False), src/megatron/bridge/training/mixed_precision.py:283-290 (fp8_recipe "
             "'tensorwise', fp8_param_gather True) and scripts/performance/configs/qwen/qwen3_workload_base_configs.py"
             ":171-180 and 421-429 (the H100 FP8 configs are FP8_CS)",
}


def recipe_for(container: str, preset: str) -> Recipe | None:
    """The recipe of a container's row for a model preset, or None when not listed."""
    return RECIPES.get((container, preset))


def apply(scenario: dict[str, Any], recipe: Recipe) -> list[str]:
    """Write the recipe's modelled settings into ``scenario``; the assumptions to record."""
    notes = []
    for path, value, why in recipe.settings:
        *parents, leaf = path.split(".")
        node = scenario
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
        kept = why.startswith("not the recipe")
        notes.append(f"{path} {value}: {why}" if kept else f"{path} {value} (the performance recipe's): {why}")
    notes += [f"not modelled, set by the performance recipe: {what}" for what in recipe.not_modelled]
    return notes + ([recipe.differs] if recipe.differs else [])
