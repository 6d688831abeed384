"""DeepSpeed ``ds_config.json`` + a Hugging Face ``config.json`` -> a dtsim scenario.

DeepSpeed keys as documented in microsoft/DeepSpeed at commit
38327e07f6cd39b63418f60cedd1651b0be3e7c3, docs/_pages/config-json.md:

- batch (lines 9-29): ``train_batch_size`` = ``train_micro_batch_size_per_gpu`` *
  ``gradient_accumulation_steps`` * number of GPUs; any two of the three determine the third
  (gradient_accumulation_steps defaults to 1). ``"auto"`` (filled in by the Hugging Face
  Trainer) counts as not given.
- ``bf16.enabled`` (:288), ``fp16.enabled``: the training precision (neither: fp32).
- ``zero_optimization``: ``stage`` 0-3 (:389), ``allgather_bucket_size`` (:401),
  ``overlap_comm`` (:407), ``reduce_bucket_size``, ``stage3_prefetch_bucket_size``,
  ``stage3_param_persistence_threshold``, ``stage3_max_live_parameters`` and
  ``offload_optimizer.device`` cpu | nvme (:455) map to dtsim's ``parallelism.zero`` block
  (element counts as in DeepSpeed) and ``offload_optimizer``.

Hugging Face ``config.json`` keys (transformers' ``LlamaConfig`` naming): ``num_hidden_layers``,
``hidden_size``, ``num_attention_heads``, ``num_key_value_heads`` (default: the heads),
``intermediate_size``, ``max_position_embeddings`` (the sequence length unless ``--seq-len``),
``vocab_size``, ``hidden_act`` (silu: a gated SwiGLU MLP as in Llama), ``tie_word_embeddings``
(transformers' default true), ``rms_norm_eps`` (RMSNorm), ``rope_theta`` (rotary positions),
``attention_bias`` / ``mlp_bias``, ``attention_dropout``.
"""

from __future__ import annotations

import json
from typing import Any

from simulator.errors import ScenarioError
from simulator.importers.common import Imported, Layout, check_layout, positive_int

__all__ = ["import_deepspeed", "parse_json", "hf_model"]

_ZERO_KEYS = {
    "reduce_bucket_size": "reduce_bucket_size",
    "allgather_bucket_size": "allgather_bucket_size",
    "stage3_prefetch_bucket_size": "prefetch_bucket_size",
    "stage3_param_persistence_threshold": "param_persistence_threshold",
    "stage3_max_live_parameters": "max_live_parameters",
}
_MAPPED = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "bf16.enabled",
           "fp16.enabled", "zero_optimization.stage", "zero_optimization.overlap_comm",
           "zero_optimization.offload_optimizer.device", "gradient_clipping", "optimizer.type",
           *(f"zero_optimization.{k}" for k in _ZERO_KEYS)}


def parse_json(text: str, source: str) -> dict[str, Any]:
    try:
        doc = json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except json.JSONDecodeError as exc:
        raise ScenarioError(f"{source}: not valid JSON: {exc}") from None
    except RecursionError:  # json's decoder recurses once per nesting level
        raise ScenarioError(f"{source}: not valid JSON: nested too deeply") from None
    except ValueError as exc:  # an integer of more digits than Python converts, or a non-finite number
        raise ScenarioError(f"{source}: not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ScenarioError(f"{source}: expected a JSON object")
    return doc


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a finite number")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text} is not a finite number")
    return value


def _leaves(node: dict[str, Any], prefix: str = "") -> list[str]:
    out: list[str] = []
    for key, value in node.items():
        path = f"{prefix}.{key}" if prefix else key
        out += _leaves(value, path) if isinstance(value, dict) and value else [path]
    return out


def hf_model(cfg: dict[str, Any], source: str, seq_len: int | None, notes: list[str]) -> dict[str, Any]:
    """dtsim's model mapping from a Hugging Face config.json."""
    def need(key: str) -> int:
        if key not in cfg:
            raise ScenarioError(f"{source}: {key} is missing")
        return positive_int(cfg[key], f"{source}: {key}")

    hidden, heads = need("hidden_size"), need("num_attention_heads")
    kv = positive_int(cfg.get("num_key_value_heads") or heads, f"{source}: num_key_value_heads")
    if heads % kv:
        raise ScenarioError(f"{source}: num_key_value_heads = {kv} does not divide num_attention_heads = {heads}")
    if seq_len is None:
        seq_len = need("max_position_embeddings")
        notes.append(f"sequence length = max_position_embeddings = {seq_len} (give --seq-len for the trained length)")
    act = str(cfg.get("hidden_act", "gelu"))
    if act not in ("silu", "swish") and not act.startswith("gelu"):
        notes.append(f"hidden_act {act!r} is not modelled: a 2-matrix GELU-like MLP")
    bias = bool(cfg.get("attention_bias", False) or cfg.get("mlp_bias", False)) if "rms_norm_eps" in cfg else True
    dropout = any(float(cfg.get(k) or 0) > 0 for k in ("attention_dropout", "hidden_dropout", "resid_pdrop",
                                                        "attn_pdrop", "hidden_dropout_prob"))
    return {
        "name": str(cfg.get("_name_or_path") or cfg.get("model_type") or "HF model"),
        "layers": need("num_hidden_layers"), "hidden": hidden, "heads": heads, "kv_heads": kv,
        "ffn_hidden": positive_int(cfg.get("intermediate_size") or 4 * hidden, f"{source}: intermediate_size"),
        "seq_len": seq_len, "vocab": need("vocab_size"), "mlp": "swiglu" if act in ("silu", "swish") else "gelu",
        "norm": "rmsnorm" if "rms_norm_eps" in cfg else "layernorm",
        "position_embedding": "rotary" if "rope_theta" in cfg or "rope_scaling" in cfg else "learned",
        "tied_embeddings": bool(cfg.get("tie_word_embeddings", True)), "bias": bias, "dropout": dropout,
    }


def _given(ds: dict[str, Any], key: str, notes: list[str]) -> int | None:
    value = ds.get(key)
    if value == "auto":
        notes.append(f"{key} = \"auto\" (filled in by the Hugging Face Trainer): not given")
        return None
    return None if value is None else positive_int(value, key)


def _batch(ds: dict[str, Any], dp: int, notes: list[str]) -> tuple[int, int]:
    """(micro-batch, global batch) from any two of the three batch keys."""
    tbs = _given(ds, "train_batch_size", notes)
    mb = _given(ds, "train_micro_batch_size_per_gpu", notes)
    gas = _given(ds, "gradient_accumulation_steps", notes)
    if tbs is None and mb is None:
        raise ScenarioError("train_batch_size or train_micro_batch_size_per_gpu is required")
    if mb is None:
        assert tbs is not None
        gas = gas or 1
        if tbs % (gas * dp):
            raise ScenarioError(f"train_batch_size = {tbs} is not divisible by gradient_accumulation_steps * GPUs = "
                                f"{gas}*{dp} = {gas * dp}")
        mb = tbs // (gas * dp)
    if tbs is None:
        tbs = mb * (gas or 1) * dp
    if gas is not None and tbs != mb * gas * dp:
        raise ScenarioError(f"train_batch_size = {tbs} != train_micro_batch_size_per_gpu * "
                            f"gradient_accumulation_steps * GPUs = {mb}*{gas}*{dp} = {mb * gas * dp}")
    return mb, tbs


def _parallelism(zero: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    stage = zero.get("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise ScenarioError(f"zero_optimization.stage must be 0, 1, 2 or 3, got {stage!r}")
    device = (zero.get("offload_optimizer") or {}).get("device", "none")
    offload = device in ("cpu", "nvme")
    if device == "nvme":
        notes.append("offload_optimizer to nvme is modelled as offload to CPU memory")
    if stage == 0:
        if offload:
            raise ScenarioError("zero_optimization.offload_optimizer needs zero_optimization.stage >= 1")
        return {"sharding": "none"}
    opts: dict[str, Any] = {}
    for key, name in _ZERO_KEYS.items():
        if key in zero:
            opts[name] = positive_int(zero[key], f"zero_optimization.{key}")
    if "overlap_comm" in zero:
        opts["overlap_comm"] = bool(zero["overlap_comm"])
    par: dict[str, Any] = {"sharding": f"zero{stage}"}
    if opts:
        par["zero"] = opts
    if offload:
        par["offload_optimizer"] = True
    return par


def import_deepspeed(ds_text: str, hf_text: str, *, ds_source: str, hf_source: str, cluster: dict[str, Any],
                     world: int, where: str, seq_len: int | None = None) -> Imported:
    """A scenario from a DeepSpeed config and a Hugging Face model config on ``cluster`` (pure data parallel)."""
    ds, hf = parse_json(ds_text, ds_source), parse_json(hf_text, hf_source)
    notes: list[str] = []
    model = hf_model(hf, hf_source, seq_len, notes)
    mb, tbs = _batch(ds, world, notes)
    check_layout(Layout(world=world, where=where, tp=(1, "tp"), pp=(1, "pp"), cp=(1, "cp"),
                        micro=(mb, "train_micro_batch_size_per_gpu"), global_batch=(tbs, "train_batch_size"),
                        heads=(model["heads"], "num_attention_heads"), kv_heads=(model["kv_heads"], "num_key_value_heads")))
    bf16 = bool((ds.get("bf16") or {}).get("enabled", False))
    fp16 = bool((ds.get("fp16") or {}).get("enabled", False))
    if bf16 and fp16:
        raise ScenarioError("bf16.enabled and fp16.enabled are both true")
    par = _parallelism(ds.get("zero_optimization") or {}, notes)
    training: dict[str, Any] = {"micro_batch": mb, "global_batch": tbs,
                                "precision": "bf16" if bf16 else "fp16" if fp16 else "fp32", "recompute": "none"}
    if "gradient_clipping" in ds:
        training["grad_clipping"] = float(ds["gradient_clipping"] or 0) > 0
    opt = str((ds.get("optimizer") or {}).get("type", "adam")).lower()
    training["optimizer"] = "sgd" if opt == "sgd" else "adam"
    if opt not in ("adam", "adamw", "sgd", "fusedadam", "cpuadam"):
        notes.append(f"optimizer {opt!r} is modelled as Adam (12 bytes of fp32 states per parameter)")
    notes.append("activation checkpointing is chosen by the training script (e.g. gradient_checkpointing): "
                 "recompute: none; set training.recompute if the run used it")
    ignored = [path for path in _leaves(ds) if path not in _MAPPED]
    scenario = {"name": f"DeepSpeed {par['sharding']} {model['name']}", "framework": "deepspeed", "model": model,
                "cluster": cluster, "parallelism": par, "training": training}
    return Imported(scenario=scenario, source=f"{ds_source} (DeepSpeed) and {hf_source} (model)", ignored=ignored,
                    notes=notes)
