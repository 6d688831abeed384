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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from simulator.costs.flops import megatron_flops_per_iteration
from simulator.datadirs import data_root
from simulator.yamlio import load_yaml, to_plain

__all__ = ["Record", "CommRecord", "load_records", "load_comm_records", "validation_file", "SOURCES"]

H100_BF16_PEAK = 989.4e12  # dense BF16, the peak Megatron-Core divides by (record notes)


@dataclass
class Record:
    id: str
    source: str  # megatron-sc21 | megatron-core | llm-foundry
    citation: str
    scenario: dict[str, Any]
    measured_step_s: float
    measured_metric: str  # what the source reported, e.g. "137 TFLOP/s per GPU (SC'21 Eq. 3)"
    assumptions: list[str] = field(default_factory=list)
    gpus: int = 0

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


def _megatron_sc21(r: dict[str, Any]) -> Record:
    m, hw, par, batch = r["model"], r["hardware"], r["parallelism"], r["batch"]
    gpus = hw["gpus_total"]
    v = par.get("virtual_pp") or 1
    scenario = {
        "name": f"{m['name']} (Megatron SC'21)",
        "model": _gpt_model(m),
        "cluster": {"node": "dgx-a100", "nodes": gpus // 8},
        "parallelism": {
            "tp": par["tp"], "pp": par["pp"], "dp": par["dp"],
            "pipeline_schedule": "interleaved" if v > 1 else "1f1b", "virtual_stages": v,
            "sequence_parallel": False, "sharding": "none",
            "ddp": {"overlap": False},
        },
        "training": {
            "micro_batch": batch["micro_batch"], "global_batch": batch["global_batch"], "precision": "fp16",
            "recompute": "full", "flash_attention": False, "grad_reduce_dtype": "fp32",
        },
    }
    tflops = r["measured"]["tflops_per_gpu"] * 1e12
    flops = megatron_flops_per_iteration(batch["global_batch"], m["seq_len"], m["layers"], m["hidden"], m["vocab"],
                                         recompute=True)
    return Record(
        id=r["id"], source="megatron-sc21", citation=r["source"]["citation"], scenario=scenario,
        measured_step_s=flops / (tflops * gpus),
        measured_metric=f"{r['measured']['tflops_per_gpu']} TFLOP/s per GPU (Eq. 3, recompute counted)",
        gpus=gpus,
        assumptions=[
            "Selene: DGX A100 80GB nodes, 8 x 200 Gb/s HDR InfiniBand, non-blocking fat tree",
            "Megatron-LM 2021 (NGC 20.12): no FlashAttention (fused softmax), gradients all-reduced in fp32 "
            "after the backward pass (local DDP, no --overlap-grad-reduce yet), no sequence parallelism",
        ],
    )


def _megatron_core(r: dict[str, Any]) -> Record:
    m, hw, par, batch = r["model"], r["hardware"], r["parallelism"], r["batch"]
    gpus = hw["gpus_total"]
    assumptions = [
        "Eos: DGX H100 nodes, 8 x 400 Gb/s NDR InfiniBand, non-blocking fat tree",
        "precision bf16 (MFU quoted against the BF16 peak), micro-batch 1 and no recomputation (Megatron "
        "defaults), FlashAttention, sequence parallelism when tp > 1, distributed optimizer (the runs use "
        "--overlap-param-gather, which needs it) with overlapped gradient reduce-scatter",
        "--tp-comm-overlap: TP all-gathers and reduce-scatters pipelined with their GEMMs (userbuffers)",
    ]
    tp, pp = par.get("tp"), par.get("pp")
    if tp is None or pp is None:  # strong-scaling rows: the weak-scaling layout of the same model
        tp, pp = 8, 6
        assumptions.append("layout not stated: tp 8, pp 6 as in the weak-scaling row of the 177B model")
    dp = gpus // (tp * pp)
    scenario = {
        "name": f"{m['name']} (Megatron-Core, {gpus} H100)",
        "model": {**_gpt_model(m), "dropout": False},
        "cluster": {"node": "dgx-h100", "nodes": gpus // 8},
        "parallelism": {
            "tp": tp, "pp": pp, "dp": dp, "sequence_parallel": tp > 1, "tp_comm_overlap": tp > 1, "sharding": "zero1",
            "zero": {"gradient_reduction": "reduce_scatter", "overlap_comm": True},
        },
        "training": {"micro_batch": 1, "global_batch": batch["global_batch"], "precision": "bf16",
                     "recompute": "none", "flash_attention": True},
    }
    measured = r["measured"]
    tflops = (measured.get("tflops_per_gpu") or measured["mfu"] * H100_BF16_PEAK / 1e12) * 1e12
    flops = megatron_flops_per_iteration(batch["global_batch"], m["seq_len"], m["layers"], m["hidden"], m["vocab"],
                                         recompute=False)
    metric = (f"{measured['tflops_per_gpu']} TFLOP/s per GPU" if measured.get("tflops_per_gpu")
              else f"MFU {measured['mfu']}") + " (Megatron-Core model FLOPs)"
    return Record(id=r["id"], source="megatron-core", citation=r["source"]["citation"], scenario=scenario,
                  measured_step_s=flops / (tflops * gpus), measured_metric=metric, assumptions=assumptions,
                  gpus=gpus)


def _llm_foundry(r: dict[str, Any]) -> Record:
    m, hw, batch, measured = r["model"], r["hardware"], r["batch"], r["measured"]
    gpus = hw["gpus_total"]
    full = str(r.get("recompute") or "none").startswith("full")
    model = {
        "name": m["name"], "layers": m["layers"], "hidden": m["hidden"], "heads": m["heads"],
        "ffn_hidden": m.get("ffn_hidden") or 4 * m["hidden"], "seq_len": m["seq_len"], "vocab": m["vocab"],
        "mlp": "gelu", "norm": "layernorm", "position_embedding": "learned",
        "tied_embeddings": True, "bias": False, "dropout": False,
    }
    scenario = {
        "name": f"{m['name']} seq {m['seq_len']} on {gpus} A100-80GB (LLM Foundry)",
        "model": model,
        "cluster": {"node": "dgx-a100", "nodes": max(1, gpus // 8)},
        "parallelism": {"sharding": "fsdp"},
        "training": {"micro_batch": batch["micro_batch"], "global_batch": batch["global_batch"], "precision": "bf16",
                     "recompute": "full" if full else "none", "flash_attention": True, "flash_attention_version": "triton"},
    }
    tokens = batch["global_batch"] * m["seq_len"]
    return Record(
        id=r["id"], source="llm-foundry", citation=r["source"]["citation"], scenario=scenario,
        measured_step_s=tokens / measured["tokens_per_s"], measured_metric=f"{measured['tokens_per_s']} tokens/s",
        gpus=gpus,
        assumptions=[
            "MosaicML platform: 8 x A100-80GB SXM nodes (DGX A100 layout), 8 x 200 Gb/s RoCE = 1600 Gb/s per node",
            "MPT as benchmarked: learned position embeddings (the README's NumParams grow with the sequence "
            "length by seq x d_model), no biases, no dropout, tied embeddings, GELU MLP",
            "attention: the Triton FlashAttention kernel (attn_config.attn_impl: triton in LLM Foundry's pretrain "
            "yamls of 2023, which the benchmarks are based on), 1.3-2.5x slower than FlashAttention-2 (Dao 2023 §4.1)",
            "FSDP FULL_SHARD, bf16 mixed precision, LLM Foundry defaults (limit_all_gathers, BACKWARD_PRE), "
            "gradients reduce-scattered every micro-step (no no_sync)",
        ],
    )


SOURCES = {"megatron_sc21": _megatron_sc21, "mcore_h100": _megatron_core, "llmfoundry_a100": _llm_foundry}


def load_records() -> list[Record]:
    out = []
    for r in _data()["training_records"]:
        for prefix, mapper in SOURCES.items():
            if r["id"].startswith(prefix):
                out.append(mapper(r))
    return out


def unmapped_records() -> list[str]:
    """Ids of the public set's training records that no source mapper handles yet."""
    return [r["id"] for r in _data()["training_records"] if not any(r["id"].startswith(p) for p in SOURCES)]


def unmapped_summary() -> str:
    """One sentence naming the training records that are not simulated yet, by id prefix (empty if none)."""
    ids = unmapped_records()
    if not ids:
        return ""
    groups: dict[str, int] = {}
    for record_id in ids:
        prefix = "_".join(record_id.split("_")[:2])
        groups[prefix] = groups.get(prefix, 0) + 1
    listed = ", ".join(f"{prefix}_* ({n})" for prefix, n in sorted(groups.items()))
    return f"{len(ids)} training records of the public set are not mapped to scenarios yet: {listed}."


def load_comm_records() -> list[CommRecord]:
    out = []
    for r in _data().get("comm_records", []):
        hw = r["hardware"]
        out.append(CommRecord(id=r["id"], citation=r["source"]["citation"], node=hw["instance"], nodes=hw["nodes"],
                              op=r["collective"], nbytes=float(r["message_bytes"]),
                              measured_s=r["measured"]["out_of_place"]["time_us"] * 1e-6))
    return out
