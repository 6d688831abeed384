"""Megatron-LM / Megatron-Core ``pretrain_gpt.py`` arguments -> a dtsim scenario.

The meaning of each argument mapped here was read from NVIDIA/Megatron-LM at commit
d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22):

- ``megatron/training/arguments.py`` defines the flags on the command line; many are
  generated from config dataclasses by ``megatron/training/argument_utils.py``
  (``ArgumentGroupFactory``: field ``foo_bar`` -> ``--foo-bar``; a bool defaulting to True
  gets ``--no-``/``--disable-`` forms, e.g. ``add_bias_linear`` -> ``--disable-bias-linear``,
  transformer_config.py:212).
- Model shape: ``--num-layers``, ``--hidden-size``, ``--num-attention-heads`` (TransformerConfig,
  megatron/core/transformer/transformer_config.py:65, 145, 148); ``--num-query-groups`` (:175,
  default 1 on the command line, used with ``--group-query-attention``, arguments.py:2382);
  ``--ffn-hidden-size`` (:180; when absent 4*hidden, or int(8*hidden/3/64)*64 with
  ``--swiglu``, arguments.py:1320-1329); ``--normalization`` LayerNorm | RMSNorm (:256);
  ``--position-embedding-type`` (arguments.py:2397, default learned_absolute) and the
  deprecated ``--use-rotary-position-embeddings`` (:2415); ``--swiglu`` (:2450);
  ``--untie-embeddings-and-output-weights`` (:2460); ``--max-position-embeddings`` (:2394,
  required, arguments.py:1314); ``--seq-length`` (:3305).
- Vocabulary: the tokenizer's vocabulary padded up to a multiple of
  ``--make-vocab-size-divisible-by`` (default 128, arguments.py:2441) times the tensor-parallel
  size (``vocab_size_with_padding``, megatron/core/tokenizers/utils/build_tokenizer.py:133-140).
  Without ``--vocab-size`` the GPT-2 BPE vocabulary (50,257 tokens) is assumed.
- Parallelism: ``--tensor-model-parallel-size``, ``--pipeline-model-parallel-size``,
  ``--sequence-parallel``, ``--context-parallel-size`` (ModelParallelConfig,
  megatron/core/model_parallel_config.py:55, 83, 94, 100); ``--tp-comm-overlap`` (:265);
  ``--num-layers-per-virtual-pipeline-stage`` / ``--num-virtual-stages-per-pipeline-rank``
  (arguments.py:3114-3117, the interleaved schedule).
- Data parallelism: ``--use-distributed-optimizer`` (reduce-scatter of gradients, sharded
  optimizer states: megatron/core/distributed/distributed_data_parallel_config.py:29);
  ``--overlap-grad-reduce`` (arguments.py:3121); ``--overlap-param-gather`` (:3148).
- Batch: ``--micro-batch-size``, ``--global-batch-size`` (default micro-batch * dp,
  arguments.py:702-703). ``--recompute-activations`` means selective recomputation
  (arguments.py:606-607); ``--recompute-granularity`` full | selective (transformer_config.py:532);
  ``--recompute-modules`` (nargs ``*``, default ``core_attn``: megatron/training/arguments.py:2113-2117
  at NVIDIA/Megatron-LM@67f3515c8a0539d38c23f59dd8b85efdcbb3af3d, since generated from
  TransformerConfig.recompute_modules, transformer_config.py:560) becomes
  ``training.recompute_modules`` under selective granularity; Megatron-Core reads it only then,
  so without it the flag is listed as ignored.
- Precision: ``--fp16`` / ``--bf16`` (model_parallel_config.py:177, 180), ``--fp8-format``
  e4m3 | hybrid (transformer_config.py:587); none of them: fp32. An fp8 run's ``training.fp8``:
  ``--fp8-recipe`` (transformer_config.py:594, default delayed; ``custom`` is refused),
  ``--fp8-param-gather`` (arguments.py:2016: ``all_gather: fp8``), TE linears
  (``gemms: transformer-engine``), the LM head bf16.
- Mixture of experts, multi-latent attention, multi-token prediction, ``--pipeline-model-parallel-layout``:
  simulator/importers/megatron_moe.py.
- Legacy Megatron-LM: ``--use-legacy-models`` selected the pre-Megatron-Core GPT model until
  it was removed (commit 39ec5ebeb4 "remove legacy GPT code"); ``--checkpoint-activations``,
  ``--model-parallel-size`` and ``--batch-size`` are the 2020-2021 names arguments.py:592-605
  still rejects. Any of them selects ``framework: megatron-lm``.
"""

from __future__ import annotations

import argparse
import math
import shlex
from typing import Any

from simulator.errors import ScenarioError
from simulator.importers.common import Imported, Layout, check_layout
from simulator.importers.megatron_moe import add_moe_args, moe_model, moe_parallelism

__all__ = ["import_megatron", "GPT2_VOCAB"]

GPT2_VOCAB = 50257  # GPT-2 BPE vocabulary (gpt2-vocab.json), what the published GPT recipes train with

_LEGACY_FLAGS = ("use_legacy_models", "checkpoint_activations", "model_parallel_size", "batch_size")
# mapped flags that are read but whose effect dtsim does not model (listed as ignored when given)
_NOT_MODELLED = {
    "max_position_embeddings": "--max-position-embeddings (dtsim's learned position table is seq_len x hidden)",
    "recompute_method": "--recompute-method (dtsim's full recomputation covers every layer)",
    "recompute_num_layers": "--recompute-num-layers (dtsim's full recomputation covers every layer)",
    "make_vocab_size_divisible_by": None,
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would print usage and exit
        raise ScenarioError(f"Megatron arguments: {message}")


def _parser() -> _Parser:
    p = _Parser(prog="pretrain_gpt.py", add_help=False, allow_abbrev=False)
    for name in ("num-layers", "hidden-size", "num-attention-heads", "num-query-groups", "ffn-hidden-size",
                 "seq-length", "max-position-embeddings", "vocab-size", "tensor-model-parallel-size",
                 "pipeline-model-parallel-size", "context-parallel-size", "num-layers-per-virtual-pipeline-stage",
                 "num-virtual-stages-per-pipeline-rank", "micro-batch-size", "global-batch-size",
                 "recompute-num-layers", "model-parallel-size", "batch-size"):
        p.add_argument(f"--{name}", type=int, default=None)
    p.add_argument("--make-vocab-size-divisible-by", type=int, default=128)
    for name in ("hidden-dropout", "attention-dropout"):
        p.add_argument(f"--{name}", type=float, default=0.1)
    for name in ("group-query-attention", "swiglu", "use-rotary-position-embeddings",
                 "untie-embeddings-and-output-weights", "disable-bias-linear", "sequence-parallel",
                 "use-distributed-optimizer", "overlap-grad-reduce", "overlap-param-gather", "tp-comm-overlap",
                 "bf16", "fp16", "recompute-activations", "checkpoint-activations", "use-legacy-models",
                 "use-mcore-models", "use-flash-attn"):
        p.add_argument(f"--{name}", action="store_true")
    p.add_argument("--normalization", choices=["LayerNorm", "RMSNorm"], default="LayerNorm")
    p.add_argument("--position-embedding-type", default="learned_absolute",
                   choices=["learned_absolute", "rope", "yarn", "mrope", "relative", "none"])
    p.add_argument("--fp8-format", choices=["e4m3", "hybrid"], default=None)
    p.add_argument("--fp8-recipe", choices=["tensorwise", "delayed", "mxfp8", "blockwise", "custom"], default="delayed")
    p.add_argument("--fp8-param-gather", action="store_true")
    p.add_argument("--recompute-granularity", choices=["full", "selective"], default=None)
    p.add_argument("--recompute-method", choices=["uniform", "block"], default=None)
    p.add_argument("--recompute-modules", nargs="*", default=None)
    add_moe_args(p)
    return p


def _unknown_flags(rest: list[str]) -> list[str]:
    """Unknown arguments grouped as ``--flag value...`` strings."""
    out: list[str] = []
    for token in rest:
        if (token.startswith("-") and not _is_number(token)) or not out:
            out.append(token)
        else:
            out[-1] += " " + shlex.quote(token)
    return out


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def _required(value: int | None, flag: str) -> int:
    if value is None:
        raise ScenarioError(f"{flag} is required (pretrain_gpt.py needs it)")
    return value


def _model(a: argparse.Namespace, notes: list[str]) -> dict[str, Any]:
    layers = _required(a.num_layers, "--num-layers")
    hidden = _required(a.hidden_size, "--hidden-size")
    heads = _required(a.num_attention_heads, "--num-attention-heads")
    if hidden % heads:
        raise ScenarioError(f"--hidden-size {hidden} is not divisible by --num-attention-heads {heads}")
    kv = heads
    if a.group_query_attention:
        kv = a.num_query_groups or 1
        if heads % kv:
            raise ScenarioError(f"--num-query-groups {kv} does not divide --num-attention-heads {heads}")
    elif a.num_query_groups is not None:
        notes.append("--num-query-groups has no effect without --group-query-attention: multi-head attention")
    if a.ffn_hidden_size is not None:
        ffn = a.ffn_hidden_size
    else:
        ffn = int((4 * hidden * 2 / 3) / 64) * 64 if a.swiglu else 4 * hidden
    seq = a.seq_length
    if seq is None:
        seq = _required(a.max_position_embeddings, "--seq-length")
        notes.append(f"no --seq-length: the sequence length is --max-position-embeddings {seq}")
    tp = a.tensor_model_parallel_size or 1
    if a.vocab_size is not None:
        vocab = a.vocab_size
    else:
        multiple = a.make_vocab_size_divisible_by * tp
        vocab = math.ceil(GPT2_VOCAB / multiple) * multiple
        notes.append(f"no --vocab-size: the tokenizer's vocabulary is needed; assumed the GPT-2 BPE vocabulary "
                     f"({GPT2_VOCAB}) padded to a multiple of --make-vocab-size-divisible-by * tp = {multiple} as "
                     f"Megatron does (build_tokenizer.py:133-140): {vocab}")
    rotary = a.use_rotary_position_embeddings or a.position_embedding_type in ("rope", "yarn", "mrope")
    if a.position_embedding_type in ("relative", "none"):
        notes.append(f"--position-embedding-type {a.position_embedding_type} is not modelled: learned positions")
    return {
        "layers": layers, "hidden": hidden, "heads": heads, "kv_heads": kv, "ffn_hidden": ffn, "seq_len": seq,
        "vocab": vocab, "mlp": "swiglu" if a.swiglu else "gelu",
        "norm": "rmsnorm" if a.normalization == "RMSNorm" else "layernorm",
        "position_embedding": "rotary" if rotary else "learned",
        "tied_embeddings": not a.untie_embeddings_and_output_weights,
        "bias": not a.disable_bias_linear,
        "dropout": not (a.hidden_dropout == 0 and a.attention_dropout == 0),
    }


def _virtual_stages(a: argparse.Namespace, layers: int, pp: int) -> int:
    if a.num_virtual_stages_per_pipeline_rank is not None:
        return int(a.num_virtual_stages_per_pipeline_rank)
    per = a.num_layers_per_virtual_pipeline_stage
    if per is None:
        return 1
    if layers % (pp * per):
        raise ScenarioError(f"--num-layers-per-virtual-pipeline-stage {per} * --pipeline-model-parallel-size {pp} "
                            f"does not divide --num-layers {layers}")
    return layers // (pp * per)


def _parallelism(a: argparse.Namespace, layers: int) -> dict[str, Any]:
    tp, pp, cp = a.tensor_model_parallel_size or 1, a.pipeline_model_parallel_size or 1, a.context_parallel_size or 1
    par: dict[str, Any] = {"tp": tp, "pp": pp, "cp": cp}
    if a.sequence_parallel:
        par["sequence_parallel"] = True
    v = _virtual_stages(a, layers, pp)
    if v > 1:
        par.update(pipeline_schedule="interleaved", virtual_stages=v)
    if a.tp_comm_overlap:
        par["tp_comm_overlap"] = True
    if a.use_distributed_optimizer:
        zero: dict[str, Any] = {"gradient_reduction": "reduce_scatter", "overlap_comm": bool(a.overlap_grad_reduce)}
        if a.overlap_param_gather:
            zero["overlap_param_gather"] = True
        par.update(sharding="zero1", zero=zero)
    else:
        if a.overlap_param_gather:
            raise ScenarioError("--overlap-param-gather needs --use-distributed-optimizer")
        par.update(sharding="none", ddp={"overlap": bool(a.overlap_grad_reduce)})
    return par


def _training(a: argparse.Namespace) -> dict[str, Any]:
    precision = "fp8" if a.fp8_format else "bf16" if a.bf16 else "fp16" if a.fp16 else "fp32"
    recompute = a.recompute_granularity or ("selective" if a.recompute_activations or a.checkpoint_activations
                                            else "none")
    if a.checkpoint_activations and not a.recompute_granularity:
        recompute = "full"  # the 2020-2021 flag checkpointed every layer's input
    out: dict[str, Any] = {"precision": precision, "recompute": recompute}
    if a.recompute_modules is not None and recompute == "selective":
        out["recompute_modules"] = list(a.recompute_modules)
    if precision == "fp8":
        if a.fp8_recipe == "custom":
            raise ScenarioError("--fp8-recipe custom: a custom quantizer factory cannot be costed; use one of "
                                "tensorwise, delayed, mxfp8, blockwise")
        out["fp8"] = {"recipe": a.fp8_recipe, "gemms": "transformer-engine",
                      "all_gather": "fp8" if a.fp8_param_gather else "bf16", "output_head": False}
    return out


def import_megatron(argv: list[str], *, cluster: dict[str, Any], world: int, where: str) -> Imported:
    """A scenario from ``pretrain_gpt.py`` arguments on ``cluster`` (``world`` GPUs, described by ``where``)."""
    a, rest = _parser().parse_known_args(argv)
    notes: list[str] = []
    ignored = _unknown_flags(rest)
    given = {tok.split("=", 1)[0].lstrip("-").replace("-", "_") for tok in argv if tok.startswith("--")}
    for key, text in _NOT_MODELLED.items():
        if key in given and text:
            ignored.append(text)
    if a.recompute_modules is not None and a.recompute_granularity != "selective" and not a.recompute_activations:
        ignored.append("--recompute-modules (Megatron-Core reads it only with --recompute-granularity selective)")
    legacy = [f"--{k.replace('_', '-')}" for k in _LEGACY_FLAGS if k in given]
    framework = "megatron-lm" if legacy else "megatron-core"
    if legacy:
        notes.append(f"{', '.join(legacy)}: the Megatron-LM of 2020-2022 (framework megatron-lm)")
    if a.model_parallel_size and not a.tensor_model_parallel_size:
        a.tensor_model_parallel_size = a.model_parallel_size
    model = _model(a, notes)
    model.update(moe_model(a, model, ignored))
    par = _parallelism(a, model["layers"])
    par.update(moe_parallelism(a, model.get("experts", 0)))
    train = _training(a)
    micro = a.micro_batch_size or a.batch_size
    if micro is None:
        micro = 1
        notes.append("no --micro-batch-size: 1")
    gb = a.global_batch_size
    lay = Layout(world=world, where=where, tp=(par["tp"], "--tensor-model-parallel-size"),
                 pp=(par["pp"], "--pipeline-model-parallel-size"), cp=(par["cp"], "--context-parallel-size"),
                 micro=(micro, "--micro-batch-size"), global_batch=(gb, "--global-batch-size") if gb else None,
                 heads=(model["heads"], "--num-attention-heads"),
                 kv_heads=(model["kv_heads"], "--num-query-groups"))
    _, global_batch = check_layout(lay)
    if gb is None:
        notes.append(f"no --global-batch-size: micro-batch * dp = {global_batch} (arguments.py:702-703)")
    train.update(micro_batch=micro, global_batch=global_batch)
    scenario = {
        "name": f"Megatron {model['layers']}L-{model['hidden']}h, tp {par['tp']} pp {par['pp']} cp {par['cp']}",
        "framework": framework, "model": model, "cluster": cluster, "parallelism": par, "training": train,
    }
    return Imported(scenario=scenario, source="Megatron pretrain_gpt.py arguments", ignored=ignored, notes=notes)
