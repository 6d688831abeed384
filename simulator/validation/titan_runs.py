"""torchtitan's published runs as scenarios, through torchtitan's own job config.

Each record is mapped the way a user would run it: torchtitan's shipped train config for the
model at the commit of the runs (the settings it reads, with their values there, under ``validation/torchtitan/``), with
the settings the benchmark doc states applied on top as command-line overrides, imported by
:func:`simulator.importers.torchtitan.import_torchtitan_doc` (what ``dtsim import
torchtitan`` does). What the config supplies where the doc is silent (sequence length,
activation-checkpoint mode of the H200 runs) is named in the assumptions.

* December 2024 H100 tables: pytorch/torchtitan@820504e20d1149fbf0b98c567af24c4b0433b22d
  benchmarks/llama3_h100_202412_torchtitan.md; runs on torchtitan 9dec370 (the doc's
  Versions table), whose llama3 configs are those of the last change to ``train_configs/``
  before 2024-12-23 (b0a80df20, 2024-12-17; only debug_model.toml changed until 9dec370).
* June 2025 H200 runs: pytorch/torchtitan@4a61bd87d3c7e92bcfeb5d5464d9e6bd13ef440a
  benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md: ``llama3_8b.toml`` of torchtitan
  e7c0cae with ``--training.local_batch_size=2 --training.compile --model.converters=float8``.

Throughput: torchtitan logs ``tps = tokens this rank loaded / (time * tp*pp*cp)``
(pytorch/torchtitan@9dec370 train.py:261,358-361), each rank loading ``local batch * seq``
tokens per step, so ``step = local_batch * seq / (tps * tp * pp * cp)`` (= global tokens /
(tps * GPUs)). Memory: the logged figure is ``max_reserved`` of the CUDA caching allocator
(``reserved_bytes.all.peak``, torchtitan/metrics.py:55-64 and train.py:393 at 9dec370).
"""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

from simulator.datadirs import data_root
from simulator.importers.torchtitan import import_torchtitan_doc, parse_toml

__all__ = ["TorchtitanRun", "titan_run"]

TT_RUNS = "pytorch/torchtitan@9dec370ad26b5f8e9a7333a0e36165018262644b"
TT_H200 = "pytorch/torchtitan@e7c0cae934df78d6e9c2835f42ff1f757dc3fddc"
CONFIGS = {"8B": "llama3_8b_9dec370.toml", "70B": "llama3_70b_9dec370.toml", "405B": "llama3_405b_9dec370.toml"}
H200_CONFIG = "llama3_8b_e7c0cae.toml"
GIB = 2.0**30


@cache
def _config(name: str) -> dict[str, Any]:
    path = data_root() / "validation" / "torchtitan" / name
    return parse_toml(path.read_text(), str(path))


class TorchtitanRun:
    """What one record maps to: the scenario, the step time and memory it measured, and the
    stated / assumed notes."""

    def __init__(self, scenario: dict[str, Any], step_s: float, metric: str, peak_bytes: float,
                 stated: list[str], assumptions: list[str]) -> None:
        self.scenario, self.step_s, self.metric, self.peak_bytes = scenario, step_s, metric, peak_bytes
        self.stated, self.assumptions = stated, assumptions


def titan_run(r: dict[str, Any]) -> TorchtitanRun:
    m, hw, par, batch, measured = r["model"], r["hardware"], r["parallelism"], r["batch"], r["measured"]
    gpus = hw["gpus_total"]
    h200 = r["id"].startswith("torchtitan_h200")
    flavor = m["name"].split()[-1]
    techniques = str(measured.get("techniques") or r.get("framework") or "")
    tp, pp, cp = par.get("tp") or 1, par.get("pp") or 1, par.get("cp") or 1
    local = batch["micro_batch"]
    config = H200_CONFIG if h200 else CONFIGS[flavor]
    doc = copy.deepcopy(_config(config))
    training, parallel = doc.setdefault("training", {}), doc.setdefault("parallelism", {})
    # the run's local batch under the key of its config's era (batch_size until June 2025)
    key = "local_batch_size" if "local_batch_size" in training else "batch_size"
    training[key] = local
    stated = [f"{gpus} GPUs, local batch {local}" + (f", global batch {batch['global_batch']}" if batch.get(
        "global_batch") else "") + f", Llama 3.1 {flavor} ({r['source']['location']})"]
    assumptions = [f"torchtitan's shipped config {config} ({TT_H200 if h200 else TT_RUNS}; the settings "
                   "dtsim reads, in validation/torchtitan/) for what the record does not state"]
    if m.get("seq_len"):
        training["seq_len"] = m["seq_len"]
        stated.append(f"sequence length {m['seq_len']} (table)")
    else:
        assumptions.append(f"sequence length {training['seq_len']}: the config's seq_len (the doc states none)")
    if not h200:
        parallel.update(data_parallel_shard_degree=par["dp"], tensor_parallel_degree=tp,
                        pipeline_parallel_degree=pp, context_parallel_degree=cp)
        stated.append(f"FSDP {par['dp']}, TP {tp}, PP {pp}, CP {cp} (table)")
        mode = "full" if r["recompute"] == "full" else "selective"
        doc.setdefault("activation_checkpoint", {})["mode"] = mode
        stated.append(f"{mode} activation checkpointing (table caption)")
    else:
        parallel.update(data_parallel_shard_degree=-1, tensor_parallel_degree=1, pipeline_parallel_degree=1,
                        context_parallel_degree=1)
        assumptions.append("FSDP over all GPUs: the config's default layout (the benchmark's command line changes "
                           "none)")
        assumptions.append("activation checkpointing: the config's mode (selective), the doc states none")
    compiled = "torch.compile" in techniques or "compile" in str(r.get("framework"))
    training["compile"] = compiled
    doc.pop("compile", None)
    stated.append("torch.compile on (technique stated)" if compiled else
                  "torch.compile off (technique not listed; torchtitan's default, the config's compile = false)")
    async_tp = "AsyncTP" in techniques
    doc.setdefault("experimental", {})["enable_async_tensor_parallel"] = async_tp
    parallel["enable_async_tensor_parallel"] = async_tp
    if async_tp:
        stated.append("AsyncTP (table): parallelism.tp_comm_overlap, the micro-pipelined TP collectives "
                      f"({TT_RUNS} torchtitan/parallelisms/parallelize_llama.py:201-205, symmetric-memory "
                      "all-gather/reduce-scatter matmuls)")
    fp8 = "float8" in str(r["precision"]).lower()
    doc.setdefault("model", {})["converters"] = ["float8"] if fp8 else []
    float8 = doc.setdefault("float8", {})
    float8.pop("enable_float8_linear", None)  # the converters above say it
    if fp8:
        stated.append("Float8 linears (table): training.precision fp8, torchao's dynamic tensorwise scaling (the "
                      "config names no other recipe)")
        if "float8 all-gather enabled" in str(r["precision"]):
            float8["enable_fsdp_float8_all_gather"] = True
            stated.append("float8 all-gather enabled (record): training.fp8.all_gather fp8")
        else:
            on = bool(float8.get("enable_fsdp_float8_all_gather"))
            assumptions.append(f"float8 all-gather {'on' if on else 'off'}: the config's enable_fsdp_float8_all_gather "
                               "(the doc does not state it)")
    schedule: dict[str, Any] = {}
    if pp > 1:
        # the local batch is split into pipeline_parallel_microbatches (default: the pp degree)
        parallel["pipeline_parallel_microbatch_size"] = local // pp
        assumptions.append(f"pipeline micro-batches: {pp} of {local // pp} sequences (pipeline_parallel_microbatches "
                           f"defaults to the pp degree: {TT_RUNS} torchtitan/parallelisms/pipelining_utils.py:79-81)")
        if "Interleaved" in str(par.get("pp_schedule")):
            schedule = {"pipeline_schedule": "interleaved", "virtual_stages": 2}
            stated.append("Interleaved 1F1B (table): 2 stages per rank (pipelining_utils.py:18-32 at 9dec370)")
        else:
            stated.append("1F1B (table)")
    node = "dgx-h200" if h200 else "grand-teton"
    imported = import_torchtitan_doc(doc, source=config, cluster={"node": node, "nodes": gpus // 8}, world=gpus,
                                     where=r["id"])
    scenario = imported.scenario
    scenario["name"] = f"{r['id']} ({r['source']['location']})"
    scenario["parallelism"].update(schedule)
    if cp > 1:
        # llama's Attention.forward repeats the kv heads before F.scaled_dot_product_attention, so the
        # context-parallel ring exchanges K/V (and dK/dV) with the query heads
        scenario["parallelism"]["cp_kv_heads"] = "repeated"
        stated.append(f"context-parallel K/V with the query heads: {TT_RUNS} torchtitan/models/llama/model.py:201-209 "
                      "(repeat_kv before scaled_dot_product_attention)")
    if fp8 and not h200:
        # torchtitan of December 2024 never converts the output projection (module_filter_fn, not a config key)
        scenario["training"]["fp8"]["output_head"] = False
        assumptions.append(f"output head in bf16: {TT_RUNS} torchtitan/float8.py:99 (module_filter_fn excludes "
                           "'output')")
    if h200 and compiled:
        scenario["training"]["cross_entropy"] = "fused"
        stated.append(f"the loss is compiled with the model ({TT_H200} torchtitan/components/loss.py:20-29): "
                      "a fused cross entropy (training.cross_entropy: fused)")
    assumptions += [f"import: {note}" for note in imported.notes
                    if not (schedule and "pipeline schedule (1F1B) is assumed" in note)]
    assumptions.append("H200 hosts (record: 8 H200 on NVLink, 400 Gb/s CX-7 per GPU): dtsim's dgx-h200 node" if h200
                       else "Grand Teton (record): dtsim's grand-teton node (topologies/nodes/grand-teton.yaml)")
    model = scenario["model"]
    preset_dims = (m["layers"], m["hidden"], m["heads"], m["kv_heads"], m["ffn_hidden"], m["vocab"])
    stated.append(f"model dims {preset_dims} (record: public Llama 3.1 config) = dtsim preset "
                  f"{model['preset'] if isinstance(model, dict) else model}")
    seq = training["seq_len"]
    tps = measured["tokens_per_s_per_gpu"]
    step = local * seq / (tps * tp * pp * cp)
    return TorchtitanRun(scenario, step, f"{tps} tokens/s per GPU (torchtitan tps)",
                         measured["peak_memory_gib"] * GIB, stated, assumptions)
