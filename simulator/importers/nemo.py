"""NeMo Megatron GPT training config (Hydra YAML) -> a dtsim scenario.

The format is the one ``megatron_gpt_pretraining.py`` reads: NeMo's
``examples/nlp/language_modeling/conf/megatron_gpt_config.yaml`` and
``megatron_llama_config.yaml``, and the NeMo-Framework-Launcher's ``conf/training/<model>/*.yaml``
(sections ``trainer`` and ``model``). Keys and defaults read from NVIDIA/NeMo at commit
8cfedd7203462cb251a914e700e5605444277561 (2025-09-20):

- Shape: ``model.num_layers``, ``hidden_size``, ``ffn_hidden_size``, ``num_attention_heads``,
  ``num_query_groups`` (null = multi-head), ``encoder_seq_length``, ``normalization``
  (layernorm | rmsnorm), ``activation`` (gelu, swiglu and their ``fast-`` forms; geglu/reglu are
  gated like swiglu), ``bias``, ``position_embedding_type`` (learned_absolute | rope),
  ``share_embeddings_and_output_weights``, ``hidden_dropout`` / ``attention_dropout``.
- Vocabulary: the tokenizer's size padded to a multiple of ``make_vocab_size_divisible_by`` x tp
  (megatron_base_model.py:634-646 ``_vocab_size_with_padding``). The YAML names the tokenizer,
  not its size: the GPT-2 BPE tokenizer (``library: megatron``, ``type: GPT2BPETokenizer``) has
  50,257 tokens; Llama 3's Hugging Face tokenizer 128,256 (its config.json ``vocab_size``);
  anything else needs ``--vocab-size``.
- Parallelism: ``tensor_model_parallel_size``, ``pipeline_model_parallel_size``,
  ``virtual_pipeline_model_parallel_size``, ``context_parallel_size``, ``sequence_parallel``,
  ``ub_tp_comm_overlap`` (userbuffers TP-communication overlap).
- Optimizer (``model.optim.name``): ``mcore_distributed_optim`` is Megatron-Core's distributed
  optimizer with ``overlap_grad_sync`` and ``overlap_param_sync`` off unless set
  (megatron_gpt_model.py:600-612); ``distributed_fused_adam`` is Apex's, whose gradient
  overlap is on and parameter overlap off by default (NVIDIA/apex@6424da3b4faa6c8f062da4a48c424fff3f02d42d
  apex/contrib/optimizers/distributed_fused_adam.py:558-559). Both shard the optimizer states
  (zero1 with reduce-scattered gradients); ``grad_sync_dtype`` defaults to fp32 in both
  (megatron_gpt_model.py:601; distributed_fused_adam.py:606-607). Other optimizers keep whole
  states on every rank.
- Batch and precision: ``micro_batch_size``, ``global_batch_size``; ``trainer.precision`` (bf16,
  bf16-mixed, 16, 16-mixed, 32) and ``model.fp8``; ``activations_checkpoint_granularity``
  (selective | full).
"""

from __future__ import annotations

import math
import re
from typing import Any

from simulator.errors import ScenarioError
from simulator.importers.common import Imported, Layout, check_layout, positive_int

__all__ = ["import_nemo", "TOKENIZER_VOCAB"]

# tokenizer -> vocabulary size before padding
TOKENIZER_VOCAB = {
    "GPT2BPETokenizer": 50257,  # gpt2-vocab.json, as in the Megatron importer
    "meta-llama/Meta-Llama-3-8B": 128256,  # config.json vocab_size of the Llama 3 models
    "meta-llama/Meta-Llama-3-70B": 128256,
    "meta-llama/Meta-Llama-3.1-8B": 128256,
    "meta-llama/Meta-Llama-3.1-70B": 128256,
    "meta-llama/Meta-Llama-3.1-405B": 128256,
}

# model.* keys the importer reads (anything else under model/trainer is listed as ignored)
_READ = {
    "micro_batch_size", "global_batch_size", "tensor_model_parallel_size", "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size", "context_parallel_size", "sequence_parallel", "encoder_seq_length",
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups", "normalization",
    "activation", "bias", "position_embedding_type", "share_embeddings_and_output_weights", "hidden_dropout",
    "attention_dropout", "make_vocab_size_divisible_by", "tokenizer", "vocab_size", "fp8",
    "activations_checkpoint_granularity", "ub_tp_comm_overlap", "optim", "max_position_embeddings",
    "megatron_amp_O2", "gradient_accumulation_fusion", "async_grad_allreduce", "grad_allreduce_chunk_size_mb",
    "fp8_params",
}
_GATED = {"swiglu", "fast-swiglu", "geglu", "fast-geglu", "reglu", "fast-reglu"}
_PLAIN = {"gelu", "fast-gelu", "squared-relu", "relu"}


_REF = re.compile(r"^\$\{(?:\.|model\.)([A-Za-z_][A-Za-z0-9_]*)\}$")
_MULTIPLY = re.compile(r"^\$\{multiply:\s*(.+?)\s*,\s*(.+?)\s*\}$")


def _resolve(model: dict[str, Any], key: str, value: Any, depth: int = 0) -> Any:
    """Follow Hydra interpolations inside ``model``: a reference to another model key
    (``${.encoder_seq_length}``, ``${model.hidden_size}``) and NeMo's ``multiply`` resolver
    (``${multiply:4, ${.hidden_size}}``; registered as x * y in NVIDIA/NeMo@8cfedd72
    nemo/core/config/hydra_runner.py:48)."""
    if not (isinstance(value, str) and value.startswith("${")):
        return value
    if depth > 8:
        raise ScenarioError(f"model.{key}: interpolation nested too deeply")
    if ref := _REF.match(value):
        target = ref.group(1)
        if target not in model or target == key:
            raise ScenarioError(f"model.{key} = {value!r}: model.{target} is not in the file")
        return _resolve(model, target, model[target], depth + 1)
    if mul := _MULTIPLY.match(value):
        left, right = (_resolve(model, key, _number(model, key, arg), depth + 1) for arg in mul.groups())
        if isinstance(left, (int, float)) and isinstance(right, (int, float)):
            return left * right
    raise ScenarioError(f"model.{key} = {value!r}: only ${{.key}}, ${{model.key}} and ${{multiply:a, b}} "
                        "interpolations are resolved; give the value")


def _number(model: dict[str, Any], key: str, text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text  # an interpolation, resolved by the caller


def _get(model: dict[str, Any], key: str, default: Any = None) -> Any:
    return _resolve(model, key, model.get(key, default))


def _int(model: dict[str, Any], key: str, default: int | None = None) -> int:
    value = _get(model, key, default)
    if value is None:
        raise ScenarioError(f"model.{key} is required")
    return positive_int(value, f"model.{key}")


def _precision(trainer: dict[str, Any], model: dict[str, Any]) -> str:
    if _get(model, "fp8", False):
        return "fp8"
    value = str(trainer.get("precision", 32))
    table = {"bf16": "bf16", "bf16-mixed": "bf16", "bf16-true": "bf16", "16": "fp16", "16-mixed": "fp16",
             "16-true": "fp16", "32": "fp32", "32-true": "fp32"}
    if value not in table:
        raise ScenarioError(f"trainer.precision = {value!r}: expected one of {', '.join(table)}")
    return table[value]


def _vocab(model: dict[str, Any], tp: int, notes: list[str], vocab_size: int | None) -> int:
    given = vocab_size if vocab_size is not None else model.get("vocab_size")
    tok = model.get("tokenizer") or {}
    name = str(tok.get("type") or "") if isinstance(tok, dict) else ""
    if given is not None:
        raw = positive_int(given, "model.vocab_size")
    elif name in TOKENIZER_VOCAB:
        raw = TOKENIZER_VOCAB[name]
    else:
        raise ScenarioError(f"model.tokenizer.type = {name or None!r}: its vocabulary size is not known to dtsim; "
                            "give --vocab-size (the tokenizer's vocabulary before padding)")
    divisible = positive_int(_get(model, "make_vocab_size_divisible_by", 128), "model.make_vocab_size_divisible_by")
    multiple = divisible * tp
    padded = math.ceil(raw / multiple) * multiple
    notes.append(f"vocabulary {raw} padded to a multiple of make_vocab_size_divisible_by * tp = {multiple}: {padded}")
    return padded


def _model(model: dict[str, Any], tp: int, notes: list[str], vocab_size: int | None) -> dict[str, Any]:
    layers, hidden = _int(model, "num_layers"), _int(model, "hidden_size")
    heads = _int(model, "num_attention_heads")
    if hidden % heads:
        raise ScenarioError(f"model.hidden_size {hidden} is not divisible by model.num_attention_heads {heads}")
    groups = _get(model, "num_query_groups")
    kv = heads if groups is None else positive_int(groups, "model.num_query_groups")
    if heads % kv:
        raise ScenarioError(f"model.num_query_groups {kv} does not divide model.num_attention_heads {heads}")
    activation = str(_get(model, "activation", "gelu"))
    if activation not in _GATED | _PLAIN:
        raise ScenarioError(f"model.activation = {activation!r} is not modelled (gelu, swiglu, geglu, reglu, "
                            "squared-relu and their fast- forms are)")
    if activation not in ("gelu", "fast-gelu", "swiglu", "fast-swiglu"):
        notes.append(f"model.activation {activation}: costed as {'swiglu' if activation in _GATED else 'gelu'} "
                     f"({'three' if activation in _GATED else 'two'} MLP matrices)")
    position = str(_get(model, "position_embedding_type", "learned_absolute"))
    if position not in ("learned_absolute", "rope"):
        notes.append(f"model.position_embedding_type {position} is not modelled: no position table (as rope)")
    dropout = float(_get(model, "hidden_dropout", 0.1) or 0) > 0 or float(_get(model, "attention_dropout", 0.1) or 0) > 0
    return {
        "layers": layers, "hidden": hidden, "heads": heads, "kv_heads": kv,
        "ffn_hidden": _int(model, "ffn_hidden_size", 4 * hidden), "seq_len": _int(model, "encoder_seq_length"),
        "vocab": _vocab(model, tp, notes, vocab_size), "mlp": "swiglu" if activation in _GATED else "gelu",
        "norm": "rmsnorm" if str(_get(model, "normalization", "layernorm")).lower() == "rmsnorm" else "layernorm",
        "position_embedding": "learned" if position == "learned_absolute" else "rotary",
        "tied_embeddings": bool(_get(model, "share_embeddings_and_output_weights", True)),
        "bias": bool(_get(model, "bias", True)), "dropout": dropout,
    }


def _data_parallel(model: dict[str, Any], precision: str, notes: list[str]) -> dict[str, Any]:
    raw = model.get("optim")
    optim: dict[str, Any] = raw if isinstance(raw, dict) else {}
    name = str(optim.get("name", "fused_adam"))
    if name not in ("mcore_distributed_optim", "distributed_fused_adam"):
        # megatron_amp_O2 with a plain optimizer: MainParamsOptimizerWrapper all-reduces fp32 main
        # gradients asynchronously in grad_allreduce_chunk_size_mb chunks during the backward, only
        # without pipeline parallelism, sequence parallelism and gradient-accumulation fusion
        # (megatron_base_model.py:866-910); otherwise after the backward.
        o2 = bool(_get(model, "megatron_amp_O2", False))
        overlap = (o2 and _get(model, "pipeline_model_parallel_size", 1) == 1
                   and not _get(model, "sequence_parallel", False)
                   and not _get(model, "gradient_accumulation_fusion", False)
                   and bool(_get(model, "async_grad_allreduce", True)))
        ddp: dict[str, Any] = {"overlap": overlap}
        if overlap:
            chunk_mib = float(_get(model, "grad_allreduce_chunk_size_mb", 125))
            ddp.update(bucket_size=f"{chunk_mib:g} MiB", first_bucket_size=f"{chunk_mib:g} MiB")
            notes.append(f"megatron_amp_O2 with {name}: fp32 gradients all-reduced during the backward in "
                         f"{chunk_mib:g} MiB chunks")
        # O2 accumulates fp32 main gradients for bf16 (fp32_grad_accum, megatron_base_model.py:870-872);
        # without O2 the parameters themselves stay fp32 under autocast: either way fp32 on the wire
        return {"sharding": "none", "ddp": ddp, "grad_reduce_dtype": "fp32"}
    apex = name == "distributed_fused_adam"
    zero = {"gradient_reduction": "reduce_scatter", "overlap_comm": bool(optim.get("overlap_grad_sync", apex)),
            "overlap_param_gather": bool(optim.get("overlap_param_sync", False))}
    if zero["overlap_param_gather"] and not zero["overlap_comm"]:
        raise ScenarioError("model.optim.overlap_param_sync needs model.optim.overlap_grad_sync (Megatron-Core "
                            "overlaps the parameter all-gather only with the gradient reduce-scatter)")
    dtype = str(optim.get("grad_sync_dtype", "fp32"))
    grad = {"fp32": "fp32", "float32": "fp32", "bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16"}
    if dtype not in grad:
        raise ScenarioError(f"model.optim.grad_sync_dtype = {dtype!r}: expected fp32, bf16 or fp16")
    notes.append(f"model.optim.name {name}: the distributed optimizer (zero1), gradients reduce-scattered in {dtype}")
    return {"sharding": "zero1", "zero": zero, "grad_reduce_dtype": grad[dtype] if precision != "fp32" else "fp32"}


def _ignored(doc: dict[str, Any]) -> list[str]:
    """Every key of the file the scenario does not take (sections other than trainer and model
    by name only: run, exp_manager, ...)."""
    out = [key for key in doc if key not in ("trainer", "model", "name")]
    out += [f"trainer.{k}" for k in doc.get("trainer") or {} if k not in ("devices", "num_nodes", "precision")]
    optim = doc["model"].get("optim")
    for key in doc["model"]:
        if key == "optim" and isinstance(optim, dict):
            out += [f"model.optim.{k}" for k in optim if k not in ("name", "overlap_grad_sync", "overlap_param_sync",
                                                                    "grad_sync_dtype")]
        elif key not in _READ or key == "max_position_embeddings":
            out.append(f"model.{key}")
    return out


def import_nemo(text: str, *, source: str, cluster: dict[str, Any], world: int, where: str,
                vocab_size: int | None = None) -> Imported:
    """A scenario from a NeMo Megatron GPT training YAML ``text`` (read from ``source``) on ``cluster``;
    ``vocab_size`` (before padding) when the file's tokenizer is not one dtsim knows."""
    from simulator.yamlio import parse_yaml_text, to_plain

    doc = to_plain(parse_yaml_text(text, file=source))
    if not isinstance(doc, dict) or not isinstance(doc.get("model"), dict):
        raise ScenarioError(f"{source}: not a NeMo training config (no model: section)")
    model, trainer = doc["model"], doc.get("trainer") or {}
    if not isinstance(trainer, dict):
        raise ScenarioError(f"{source}: trainer: must be a mapping")
    notes: list[str] = []
    devices, num_nodes = trainer.get("devices"), trainer.get("num_nodes")
    if isinstance(devices, int) and isinstance(num_nodes, int) and devices * num_nodes != world:
        notes.append(f"the file's trainer asks for {num_nodes} x {devices} GPUs; simulated on {where} as given on "
                     "the command line")
    tp = _int(model, "tensor_model_parallel_size", 1)
    pp = _int(model, "pipeline_model_parallel_size", 1)
    cp = _int(model, "context_parallel_size", 1)
    shape = _model(model, tp, notes, vocab_size)
    precision = _precision(trainer, model)
    dp_part = _data_parallel(model, precision, notes)
    micro = _int(model, "micro_batch_size", 1)
    gb = _get(model, "global_batch_size")
    lay = Layout(world=world, where=where, tp=(tp, "model.tensor_model_parallel_size"),
                 pp=(pp, "model.pipeline_model_parallel_size"), cp=(cp, "model.context_parallel_size"),
                 micro=(micro, "model.micro_batch_size"),
                 global_batch=(positive_int(gb, "model.global_batch_size"), "model.global_batch_size")
                 if gb is not None else None,
                 heads=(shape["heads"], "model.num_attention_heads"), kv_heads=(shape["kv_heads"], "model.num_query_groups"))
    _, global_batch = check_layout(lay)
    par: dict[str, Any] = {"tp": tp, "pp": pp, "cp": cp, "sharding": dp_part["sharding"]}
    for key in ("zero", "ddp"):
        if key in dp_part:
            par[key] = dp_part[key]
    if _get(model, "sequence_parallel", False) and tp > 1:
        par["sequence_parallel"] = True
    if _get(model, "ub_tp_comm_overlap", False):
        if not par.get("sequence_parallel"):
            raise ScenarioError("model.ub_tp_comm_overlap needs model.sequence_parallel with "
                                "tensor_model_parallel_size > 1")
        par["tp_comm_overlap"] = True
    virtual = _get(model, "virtual_pipeline_model_parallel_size")
    if virtual is not None and positive_int(virtual, "model.virtual_pipeline_model_parallel_size") > 1:
        par.update(pipeline_schedule="interleaved", virtual_stages=int(virtual))
    granularity = _get(model, "activations_checkpoint_granularity")
    if granularity not in (None, "selective", "full"):
        raise ScenarioError(f"model.activations_checkpoint_granularity = {granularity!r}: expected selective, full "
                            "or null")
    training: dict[str, Any] = {"micro_batch": micro, "global_batch": global_batch, "precision": precision,
                                "recompute": granularity or "none"}
    training["grad_reduce_dtype"] = dp_part["grad_reduce_dtype"]
    if precision == "fp8":
        # fp8_params (default off) all-gathers the fp8 weights (megatron_gpt_model.py:611, fp8_param_gather)
        training["fp8"] = {"all_gather": "fp8" if _get(model, "fp8_params", False) else "bf16"}
    ignored = _ignored(doc)
    scenario = {
        "name": f"NeMo {doc.get('name') or 'megatron_gpt'}: {shape['layers']}L-{shape['hidden']}h, tp {tp} pp {pp} "
                f"cp {cp}",
        "framework": "nemo", "model": shape, "cluster": cluster, "parallelism": par, "training": training,
    }
    return Imported(scenario=scenario, source=source, ignored=ignored, notes=notes)
