"""Published mixture-of-experts training runs (source ``moe``) as scenarios.

* NVIDIA Megatron-Bridge performance summary (NVIDIA-NeMo/Megatron-Bridge@0a25f911
  docs/performance-summary-archive.md, DGX-H100 rows of the 25.09, 25.11 and 26.02 NeMo
  containers): layout (TP, PP, CP, VP, EP), GBS, MBS, sequence, precision and tokens/s per
  GPU; every MoE benchmark there is token-dropless with the token distribution force-balanced
  among experts (the tables' footnote). ``step = GBS * seq / (tokens/s/GPU * GPUs)``.
* The performance recipe of each row (:mod:`simulator.validation.moe_recipes`): the settings
  dtsim models written into the scenario, the others listed as not modelled, all cited.
* A per-model setting of the performance recipe that produced a row, where the row's layout
  needs it (DeepSeek-V3's uneven pipeline layout over PP 8 x VP 4, with its multi-token
  prediction layer), comes from that recipe at the container's release commit, cited in the
  row's assumptions (:data:`RECIPE_LAYOUTS`).
* Runs whose layout, hardware or framework dtsim cannot state (Megatron-Core's one-line
  Mixtral figure, DeepSeek-V3's run average on its in-house framework) stay in the set and
  are listed as not simulated, with the reason.

Nothing here is fitted: settings a row does not state are the ``megatron-core`` profile's
(Megatron-Bridge trains through Megatron-Core).
"""

from __future__ import annotations

import re
from typing import Any

from simulator.errors import ScenarioError
from simulator.scenario import Scenario
from simulator.validation import moe_recipes

__all__ = ["MoeRun", "moe_run"]

MCORE_MOE_README = "NVIDIA/Megatron-LM@0b981f9c53059a21f868aa71ecc2868251aea5d0 megatron/core/transformer/moe/README.md"
FP8_CS = ("FP8-CS: per-tensor FP8 with scaling factors computed in the current step (NeMo performance summary "
          "25.04/25.07, docs.nvidia.com/nemo-framework/user-guide/latest/performance/performance-summary.html: 'We "
          "apply per-tensor FP8 quantization, leveraging scaling factors computed in the current step'): "
          "training.fp8.recipe tensorwise")

GPUS_PER_DGX = 8  # DGX-H100: 8 H100 (topologies/nodes/dgx-h100.yaml)

# the network model of every row (a simulation-speed choice, the same for the whole source): measured on
# the four rows the flow model finishes (gpt-oss 120B and Qwen3-30B-A3B, 25.11 and 26.02), the
# analytical model's step is 0.001-0.08% below the flow model's (their EP groups sit inside one DGX
# under Megatron-Core's rank order; 0.82-1.58% with dtsim's earlier strided placement)
NETWORK_METHOD = ("sim.network analytical (a simulation-speed choice, the same for every row of this source): the "
                  "flow model's max-min fair share over EP x (EP-1) flows per all-to-all had not finished a "
                  "Qwen3-235B-A22B row (EP 32: 992 flows, four all-to-alls per MoE layer and micro-batch) after 28 "
                  "minutes; on the four rows it finishes (gpt-oss 120B, Qwen3-30B-A3B) the analytical step is "
                  "0.001-0.08% shorter than the flow model's")

# per-model pipeline layouts of the performance recipes that produced a table (a per-model recipe setting of
# the framework, stated in the record's assumptions, not a profile default), keyed by the table's NeMo container,
# the model preset, pp and vp
MBRIDGE_PERF_2509 = ("NVIDIA-NeMo/Megatron-Bridge@a2884419541f9969b6fc34517cb3e94190c13ae4 (branch r0.1.0, 'Cherry "
                     "pick perf 2509')")
RECIPE_LAYOUTS = {
    ("25.09", "deepseek-v3", 8, 4): (
        "Et|(tt|)*30mL",
        f"{MBRIDGE_PERF_2509} scripts/performance/run_script.py:64-66 (H100: pp, vp = 8, 4 and "
        "layout 'Et|(tt|)*30mL'), read as Megatron-Core does (NVIDIA/Megatron-LM@d98e8a64ddf34856e74b24714e3bedb2f5a39553 "
        "megatron/core/transformer/pipeline_parallel_layer_layout.py:49-55 and 283-321): 32 virtual stages, the "
        "embedding and 1 layer, 30 stages of 2 layers, then the multi-token-prediction layer and the loss; rank p "
        "holds stages p, p+8, p+16, p+24, so ranks 1-6 hold 8 layers, rank 0 7 and the embedding, rank 7 6, the "
        "MTP layer and the loss",
        1,
        f"model.mtp_layers 1: the recipe keeps pretrain_config's mtp_num_layers=1 ({MBRIDGE_PERF_2509} "
        "src/megatron/bridge/recipes/deepseek/deepseek_v3.py:174, the layout's m); the 25.09 row does not say "
        "w/o MTP as the 25.11 DeepSeek-V3 rows do"),
}

class MoeRun:
    """One mapped record: scenario, measured step time and metric, stated / assumed notes."""

    def __init__(self, scenario: dict[str, Any], step_s: float, metric: str, stated: list[str],
                 assumptions: list[str]) -> None:
        self.scenario, self.step_s, self.metric = scenario, step_s, metric
        self.stated, self.assumptions = stated, assumptions


def moe_run(r: dict[str, Any]) -> MoeRun | str:
    """The record as a scenario, or why it is not simulated."""
    if r["id"].startswith("moe_mcore_v08"):
        return "GPU type, GPU count, layout, batch and sequence not stated next to the figure"
    if r["id"].startswith("moe_deepseek_v3_report"):
        return ("a run average on DeepSeek's in-house HAI-LLM (no dtsim profile) with the DualPipe schedule and the "
                "multi-token prediction module, not a measured step")
    run = _megatron_bridge(r)
    try:  # a layout this build cannot simulate yet is listed with the simulator's own reason
        Scenario.model_validate(run.scenario)
    except ScenarioError as exc:
        return f"not simulable in this build: {exc}"
    return run


def _megatron_bridge(r: dict[str, Any]) -> MoeRun:
    m, hw, par, batch, measured = r["model"], r["hardware"], r["parallelism"], r["batch"], r["measured"]
    gpus, seq = hw["gpus_total"], m["seq_len"]
    tp, pp, cp, ep = par["tp"], par["pp"], par.get("cp") or 1, par["ep"]
    vp = par.get("virtual_pp") or 1
    parallelism: dict[str, Any] = {"tp": tp, "pp": pp, "cp": cp, "dp": gpus // (tp * pp * cp), "ep": ep}
    stated = [f"{gpus} H100 (DGX-H100), TP {tp}, PP {pp}, CP {cp}, VP {par.get('virtual_pp') or 'n/a'}, EP {ep}, "
              f"FSDP 0, GBS {batch['global_batch']}, MBS {batch['micro_batch']}, sequence {seq} ({r['source']['location']})",
              "token-dropless (capacity_factor null, as the preset) with the token distribution force-balanced among "
              "experts: training.moe_routing.skew 0 (table footnote)"]
    assumptions = ["DGX-H100 (record): dtsim's dgx-h100 node",
                   f"model: dtsim preset {m['preset']} (its citation) for the table's {m['name']}",
                   "settings neither the table nor its performance recipe (below, where listed) states (optimizer "
                   "sharding, overlap flags): the nemo profile: the runs are NeMo containers' Megatron-Bridge recipes, which train through "
                   "Megatron-Core with NeMo's recipe defaults (distributed optimizer with both overlaps: the profile's "
                   "citations)"]
    if vp > 1:
        parallelism.update(pipeline_schedule="interleaved", virtual_stages=vp)
    container = re.search(r"'(\d+\.\d+) NeMo Container'", r["source"]["citation"])
    mtp_layers = 0
    recipe_layout = RECIPE_LAYOUTS.get((container.group(1) if container else "", m["preset"], pp, vp))
    if recipe_layout is not None:
        layout, layout_source, mtp_layers, mtp_note = recipe_layout
        parallelism["pipeline_layout"] = layout
        assumptions += [f"parallelism.pipeline_layout {layout} (the performance recipe's for this model and "
                        f"layout): {layout_source}", mtp_note]
    sim: dict[str, Any] = {"network": "analytical"}
    assumptions.append(NETWORK_METHOD)
    if tp > 1:
        parallelism["sequence_parallel"] = True
        assumptions.append(f"sequence parallelism: Megatron-Core requires it with expert and tensor parallelism "
                           f"({MCORE_MOE_README}, Parallelism: 'sequence parallelism must be enabled')")
    training: dict[str, Any] = {"micro_batch": batch["micro_batch"], "global_batch": batch["global_batch"],
                                "moe_routing": {"skew": 0.0}}
    precision = str(r.get("precision") or "")
    if precision.upper().startswith("BF16"):
        training["precision"] = "bf16"
        stated.append("BF16 (table)")
    else:
        training["precision"] = "fp8"
        training["fp8"] = {"recipe": "tensorwise"}
        if precision.upper() == "FP8-CS":
            stated.append(FP8_CS)
            recipe_fp8 = moe_recipes.FP8_CS_RECIPE.get(container.group(1) if container else "")
            if recipe_fp8:
                assumptions.append(f"the performance recipe's FP8 is FP8-CS too: {recipe_fp8}")
        elif precision.upper() == "FP8":
            recipe_fp8 = moe_recipes.FP8_CS_RECIPE.get(container.group(1) if container else "")
            assumptions.append(f"FP8 granularity not stated in this table; the same rows of the 25.11 table say "
                               f"FP8-CS, and the performance recipe is FP8-CS: {recipe_fp8}. {FP8_CS}")
        else:
            assumptions.append("precision: the 25.09 table has no precision column; its footnote gives the "
                               "parenthesised numbers a different FP8 granularity (H100: 128x128 weights, 1x128 "
                               f"activations), so the main number is an FP8 run, read as the later tables' FP8-CS. {FP8_CS}")
    scenario = {
        "name": f"{m['name']} on {gpus} H100 ({r['source']['citation'].split(', ')[1]})",
        "framework": "nemo",
        "model": {"preset": m["preset"], "seq_len": seq, **({"mtp_layers": mtp_layers} if mtp_layers else {})},
        "cluster": {"node": "dgx-h100", "nodes": gpus // GPUS_PER_DGX},
        "parallelism": parallelism,
        "training": training,
        **({"sim": sim} if sim else {}),
    }
    recipe = moe_recipes.recipe_for(container.group(1) if container else "", m["preset"])
    if recipe is not None:
        assumptions += moe_recipes.apply(scenario, recipe)
    tps = measured["tokens_per_s_per_gpu"]
    step = batch["global_batch"] * seq / (tps * gpus)
    return MoeRun(scenario, step, f"{tps} tokens/s per GPU (Megatron-Bridge table)", stated, assumptions)
