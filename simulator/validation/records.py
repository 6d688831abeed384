"""Published training runs (``validation/published_runs.yaml``) as scenarios.

Every record keeps its citation. Each source is mapped by one function that turns the
record's configuration into a scenario mapping, states the assumptions it makes where the
record is silent (the framework's default of that time), and converts the record's own
metric into a step time with that source's FLOP convention:

* Megatron-LM SC'21 Table 1 (Narayanan et al.): achieved TFLOP/s per GPU counted with Eq. 3,
  ``96*B*s*l*h^2*(1 + s/6h + V/16lh)``, which includes the recompute forward, so
  ``step = F / (TFLOP/s * GPUs)``.
* Megatron-Core r0.8.0 on H100 (README table): model TFLOP/s per GPU (``num_floating_point_
  operations`` of that release: ``72*B*s*l*h^2*(1 + s/6h + V/12lh)`` for MHA/GELU, no causal
  discount, no recompute); MFU = TFLOP/s / 989.
* MosaicML LLM Foundry (benchmark README): measured tokens/s of the whole job, so
  ``step = global batch * seq / tokens/s``.
* MoE runs (source ``moe``, :mod:`simulator.validation.moe_runs`): Megatron-Bridge's H100
  performance tables, tokens/s per GPU, so ``step = global batch * seq / (tps * GPUs)``.
* torchtitan (benchmark docs): tokens/s per GPU as torchtitan logs it, so ``step = local batch
  * seq / (tps * tp * pp * cp)``, and the peak memory it logs (the caching allocator's
  reserved peak); mapped through torchtitan's own config (:mod:`simulator.validation.titan_runs`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from simulator.costs.flops import megatron_flops_per_iteration
from simulator.datadirs import data_root
from simulator.validation.moe_runs import moe_run
from simulator.validation.titan_runs import titan_run
from simulator.yamlio import load_yaml, to_plain

__all__ = ["Record", "CommRecord", "load_records", "load_comm_records", "validation_file", "SOURCES"]

H100_BF16_PEAK = 989.4e12  # dense BF16, the peak Megatron-Core divides by (record notes)


@dataclass
class Record:
    id: str
    source: str  # megatron-sc21 | megatron-core | llm-foundry | torchtitan | moe
    citation: str
    scenario: dict[str, Any]
    measured_step_s: float
    measured_metric: str  # what the source reported, e.g. "137 TFLOP/s per GPU (SC'21 Eq. 3)"
    assumptions: list[str] = field(default_factory=list)
    gpus: int = 0
    stated: list[str] = field(default_factory=list)  # what the source states and the mapper sets (cited)
    measured_peak_memory_bytes: float | None = None  # where the source publishes it
    # settings the source leaves unstated that move the prediction: {scenario path: other values to simulate}
    unstated: dict[str, list[Any]] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.id


@dataclass
class CommRecord:
    id: str
    citation: str
    node: str
    nodes: int
    op: str
    nbytes: float
    measured_s: float


def validation_file() -> Path:
    return data_root() / "validation" / "published_runs.yaml"


@cache
def _data() -> dict[str, Any]:
    data: dict[str, Any] = to_plain(load_yaml(validation_file()))
    return data


def _gpt_model(model: dict[str, Any], *, vocab: int | None = None) -> dict[str, Any]:
    out = {
        "name": model.get("name"),
        "layers": model["layers"],
        "hidden": model["hidden"],
        "heads": model["heads"],
        "seq_len": model["seq_len"],
        "vocab": vocab or model["vocab"],
        "mlp": "gelu",
        "norm": "layernorm",
        "position_embedding": "learned",
        "tied_embeddings": True,
        "bias": True,
        "dropout": True,
    }
    if model.get("ffn_hidden"):
        out["ffn_hidden"] = model["ffn_hidden"]
    if model.get("kv_heads"):
        out["kv_heads"] = model["kv_heads"]
    return out


MEGATRON_2021 = "NVIDIA/Megatron-LM@6985e58938d40ad91ac07b0fddcfad8132e1447e"


def _megatron_sc21(r: dict[str, Any]) -> Record:
    """Only what Table 1 and its scripts state (examples/sc21/run_table_1.sh + CONFIG.sh at the
    record's commit): layout, batch, shape, ``--fp16``, ``--activations-checkpoint-method
    uniform`` (full recomputation) and ``--DDP-impl``; the rest is the ``megatron-lm`` profile."""
    m, hw, par, batch = r["model"], r["hardware"], r["parallelism"], r["batch"]
    gpus = hw["gpus_total"]
    v = par.get("virtual_pp") or 1
    parallelism: dict[str, Any] = {
        "tp": par["tp"], "pp": par["pp"], "dp": par["dp"],
        "pipeline_schedule": "interleaved" if v > 1 else "1f1b", "virtual_stages": v,
    }
    stated = ["tp, pp, dp, micro-batch, global batch, layers, hidden, heads, seq 2048 (run_table_1.sh, CONFIG.sh)",
              "--fp16 (CONFIG.sh); full recomputation (--activations-checkpoint-method uniform, run_table_1.sh)"]
    if par.get("ddp_impl") == "torch":
        # torch DDP: PyTorch's bucketed all-reduce overlapped with the backward, fp16 gradients
        parallelism["ddp"] = {"overlap": True, "gradient_as_bucket_view": False}
        stated.append(f"--DDP-impl torch (run_table_1.sh): PyTorch DDP, gradients all-reduced during the backward "
                      f"({MEGATRON_2021} megatron/training.py:246-251, which passes no gradient_as_bucket_view: "
                      "PyTorch's default, a separate bucket copy of the gradients)")
    else:
        stated.append("--DDP-impl local (run_table_1.sh): Megatron's local DDP, one all-reduce after the backward")
    scenario = {
        "name": f"{m['name']} (Megatron SC'21)",
        "framework": "megatron-lm",
        "model": _gpt_model(m),
        "cluster": {"node": "dgx-a100", "nodes": gpus // 8},
        "parallelism": parallelism,
        "training": {"micro_batch": batch["micro_batch"], "global_batch": batch["global_batch"], "precision": "fp16",
                     "recompute": "full"},
    }
    tflops = r["measured"]["tflops_per_gpu"] * 1e12
    flops = megatron_flops_per_iteration(batch["global_batch"], m["seq_len"], m["layers"], m["hidden"], m["vocab"],
                                         recompute=True)
    return Record(
        id=r["id"], source="megatron-sc21", citation=r["source"]["citation"], scenario=scenario,
        measured_step_s=flops / (tflops * gpus),
        measured_metric=f"{r['measured']['tflops_per_gpu']} TFLOP/s per GPU (Eq. 3, recompute counted)",
        gpus=gpus, stated=stated,
        assumptions=[
            "Selene (record: DGX A100 80GB, HDR InfiniBand 200 Gb/s fat tree): dtsim's dgx-a100 node",
            "GPT architecture of that code: GELU MLP, LayerNorm, learned positions, tied embeddings, biases, dropout",
        ],
    )


def _overlap_flags(text: str | None) -> set[str]:
    return set(re.findall(r"--[a-z0-9-]+", text or ""))


def _megatron_core(r: dict[str, Any]) -> Record | str:
    """Only what the README table states: model shape, GPU count, tp, pp, global batch and the
    overlap flags, plus what Megatron itself requires of those flags (cited); micro-batch,
    recomputation and precision are dtsim's defaults (1, none, bf16)."""
    m, hw, par, batch = r["model"], r["hardware"], r["parallelism"], r["batch"]
    gpus = hw["gpus_total"]
    tp, pp = par.get("tp"), par.get("pp")
    if tp is None or pp is None:
        return "parallel layout not stated (the README gives only the GPU count and the batch of the strong-scaling runs)"
    flags = _overlap_flags(par.get("overlap"))
    parallelism: dict[str, Any] = {"tp": tp, "pp": pp, "dp": gpus // (tp * pp)}
    stated = [f"tp {tp}, pp {pp}, {gpus} GPUs, global batch {batch['global_batch']}, model shape, seq "
              f"{m['seq_len']}, vocab {m['vocab']} (README table)", f"overlap flags: {par.get('overlap')}"]
    assumptions = ["H100 SXM (record): dtsim's dgx-h100 node (8 x H100 SXM 80GB, NVSwitch, 8 x 400 Gb/s NDR)",
                   "GPT architecture: pretrain_gpt.py's argument defaults, as the README states no other (GELU MLP, "
                   "LayerNorm, learned absolute positions, tied embeddings, biases, dropout 0.1: NVIDIA/Megatron-LM@"
                   "f2e5db402c44ae309aa6448bcb4ae87e8ae0f5f4 megatron/training/arguments.py)"]
    if "--tp-comm-overlap" in flags and tp > 1:
        parallelism.update(tp_comm_overlap=True, sequence_parallel=True)
        assumptions.append("sequence parallelism: --tp-comm-overlap requires it (NVIDIA/Megatron-LM@"
                           "d98e8a64ddf34856e74b24714e3bedb2f5a39553 megatron/training/arguments.py:1441-1442)")
    if "--overlap-param-gather" in flags:
        parallelism.update(sharding="zero1", zero={"overlap_comm": "--overlap-grad-reduce" in flags,
                                                   "overlap_param_gather": True})
        assumptions.append("distributed optimizer: --overlap-param-gather requires it (arguments.py:1024-1026 at "
                           "d98e8a64; Megatron FSDP, the other option there, came after r0.8.0)")
    elif "--overlap-grad-reduce" in flags:
        parallelism["ddp"] = {"overlap": True}
    scenario = {
        "name": f"{m['name']} (Megatron-Core, {gpus} H100)",
        "framework": "megatron-core",
        "model": _gpt_model(m),
        "cluster": {"node": "dgx-h100", "nodes": gpus // 8},
        "parallelism": parallelism,
        "training": {"global_batch": batch["global_batch"]},
    }
    measured = r["measured"]
    tflops = (measured.get("tflops_per_gpu") or measured["mfu"] * H100_BF16_PEAK / 1e12) * 1e12
    flops = megatron_flops_per_iteration(batch["global_batch"], m["seq_len"], m["layers"], m["hidden"], m["vocab"],
                                         recompute=False)
    metric = (f"{measured['tflops_per_gpu']} TFLOP/s per GPU" if measured.get("tflops_per_gpu")
              else f"MFU {measured['mfu']}") + " (Megatron-Core model FLOPs)"
    # the README states no micro-batch, and Megatron has no default (--micro-batch-size is required: NVIDIA/
    # Megatron-LM@f2e5db402c44ae309aa6448bcb4ae87e8ae0f5f4 megatron/training/arguments.py:246 and 979);
    # the other sizes that divide each data-parallel rank's share of the global batch are simulated beside
    per_rank = batch["global_batch"] // parallelism["dp"]
    return Record(id=r["id"], source="megatron-core", citation=r["source"]["citation"], scenario=scenario,
                  measured_step_s=flops / (tflops * gpus), measured_metric=metric, assumptions=assumptions,
                  gpus=gpus, stated=stated, unstated={"training.micro_batch": [b for b in (2, 4) if per_rank % b == 0]})


LLM_FOUNDRY_BENCH = "mosaicml/llm-foundry@b2a43a1477a45f40f4086a1c72f851b0ab42d0ac"


def _llm_foundry(r: dict[str, Any]) -> Record:
    """What the benchmark table row states (model, sequence, GPUs, micro and global batch,
    precision, mixed-precision mode, activation checkpointing, FSDP FULL_SHARD) and the
    benchmark script of the commit that added these rows; the rest is the ``llm-foundry``
    profile."""
    m, hw, batch, measured, par = r["model"], r["hardware"], r["batch"], r["measured"], r["parallelism"]
    gpus = hw["gpus_total"]
    full = str(r.get("recompute") or "none").startswith("full")
    model = {
        "name": m["name"], "layers": m["layers"], "hidden": m["hidden"], "heads": m["heads"],
        "ffn_hidden": m.get("ffn_hidden") or 4 * m["hidden"], "seq_len": m["seq_len"], "vocab": m["vocab"],
        "mlp": "gelu", "norm": "layernorm", "position_embedding": "learned",
        "tied_embeddings": True, "bias": False, "dropout": False,
    }
    training: dict[str, Any] = {
        "micro_batch": batch["micro_batch"], "global_batch": batch["global_batch"], "precision": "bf16",
        "recompute": "full" if full else "none", "flash_attention_version": "triton",
    }
    if par.get("mp_mode") == "DEFAULT":
        training["grad_reduce_dtype"] = "fp32"
    scenario = {
        "name": f"{m['name']} seq {m['seq_len']} on {gpus} A100-80GB (LLM Foundry)",
        "framework": "llm-foundry",
        "model": model,
        "cluster": {"node": "dgx-a100", "nodes": max(1, gpus // 8)},
        "training": training,
    }
    tokens = batch["global_batch"] * m["seq_len"]
    return Record(
        id=r["id"], source="llm-foundry", citation=r["source"]["citation"], scenario=scenario,
        measured_step_s=tokens / measured["tokens_per_s"], measured_metric=f"{measured['tokens_per_s']} tokens/s",
        gpus=gpus,
        stated=["model, sequence, GPUs, micro-batch, global batch, amp_bf16, FSDP FULL_SHARD, activation "
                "checkpointing (table row)",
                "mixed-precision mode DEFAULT: gradients reduced in fp32 (mosaicml/composer@"
                "6405188805a0054b4551ec49e4919c54c971d0e8 composer/utils/parallelism.py: DEFAULT = bf16 parameters, "
                "fp32 reduction)" if par.get("mp_mode") == "DEFAULT" else "mixed-precision mode PURE",
                f"attention: the Triton FlashAttention kernel: {LLM_FOUNDRY_BENCH} (the commit that added these "
                "A100 rows) scripts/train/benchmarking/submit_benchmarks.py:144 (--attn_impl default 'triton')"],
        assumptions=[
            "MosaicML platform (record: A100-80GB, 1600 Gb/s RoCE between nodes): dtsim's dgx-a100 node "
            "(8 x 200 Gb/s)",
            "MPT architecture (llmfoundry/models/mpt/configuration_mpt.py defaults): learned positions (the table's "
            "NumParams grow with seq x d_model), no biases, no dropout, tied embeddings, GELU MLP",
        ],
    )


def _torchtitan(r: dict[str, Any]) -> Record:
    """The benchmark doc's tables (layout, local batch, sequence where stated, AC mode,
    torch.compile, Float8, AsyncTP, schedule) over torchtitan's shipped config of the runs'
    commit; see :mod:`simulator.validation.titan_runs`."""
    run = titan_run(r)
    return Record(id=r["id"], source="torchtitan", citation=r["source"]["citation"], scenario=run.scenario,
                  measured_step_s=run.step_s, measured_metric=run.metric, assumptions=run.assumptions,
                  gpus=r["hardware"]["gpus_total"], stated=run.stated, measured_peak_memory_bytes=run.peak_bytes)


def _moe(r: dict[str, Any]) -> Record | str:
    """Published MoE runs; see :mod:`simulator.validation.moe_runs` (listed as not simulated,
    with the reason, while the model has no MoE fields)."""
    run = moe_run(r)
    if isinstance(run, str):
        return run
    return Record(id=r["id"], source="moe", citation=r["source"]["citation"], scenario=run.scenario,
                  measured_step_s=run.step_s, measured_metric=run.metric, assumptions=run.assumptions,
                  gpus=r["hardware"]["gpus_total"], stated=run.stated)


SOURCES: dict[str, Callable[[dict[str, Any]], Record | str]] = {
    "megatron_sc21": _megatron_sc21, "mcore_h100": _megatron_core, "llmfoundry_a100": _llm_foundry,
    "torchtitan": _torchtitan, "moe_": _moe,
}


def _mapped() -> tuple[list[Record], dict[str, str]]:
    """The records every source mapper can simulate, and {id: why not} for the others."""
    records: list[Record] = []
    skipped: dict[str, str] = {}
    for r in _data()["training_records"]:
        mapper = next((f for prefix, f in SOURCES.items() if r["id"].startswith(prefix)), None)
        out = mapper(r) if mapper else "no mapper for this source yet"
        if isinstance(out, str):
            skipped[r["id"]] = out
        else:
            records.append(out)
    return records, skipped


def load_records() -> list[Record]:
    return _mapped()[0]


def unmapped_records() -> dict[str, str]:
    """The public set's training records that are not simulated: {id: the reason}."""
    return _mapped()[1]


def unmapped_summary() -> str:
    """One sentence naming the training records that are not simulated yet, by id prefix (empty if none)."""
    ids = unmapped_records()
    if not ids:
        return ""
    groups: dict[tuple[str, str], int] = {}
    for record_id, reason in ids.items():
        key = ("_".join(record_id.split("_")[:2]), reason)
        groups[key] = groups.get(key, 0) + 1
    listed = "; ".join(f"{prefix}_* ({n}): {reason}" for (prefix, reason), n in sorted(groups.items()))
    return f"{len(ids)} training records of the public set are not simulated: {listed}."


def load_comm_records() -> list[CommRecord]:
    out = []
    for r in _data().get("comm_records", []):
        hw = r["hardware"]
        out.append(CommRecord(id=r["id"], citation=r["source"]["citation"], node=hw["instance"], nodes=hw["nodes"],
                              op=r["collective"], nbytes=float(r["message_bytes"]),
                              measured_s=r["measured"]["out_of_place"]["time_us"] * 1e-6))
    return out
