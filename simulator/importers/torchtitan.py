"""torchtitan job TOML -> a dtsim scenario.

Keys and defaults read from pytorch/torchtitan at commit
4a950eaabff274567873322c206ddb481dae3567 (2026-04-13, the last commit with TOML job files;
the next one, 76d5c72e2, moved configs to Python dataclasses), torchtitan/config/job_config.py:

- ``[model] name`` / ``flavor`` (llama3 8B / 70B / 405B -> dtsim presets llama3-8b / 70b / 405b);
  ``converters`` (:118) containing ``float8`` turns on float8 linears (older files:
  ``[float8] enable_float8_linear``): ``precision: fp8`` with ``training.fp8`` from
  ``[quantize.linear.float8]`` (``[float8]`` in older files): ``recipe_name`` (unset: torchao's
  tensorwise; ``rowwise_with_gw_hp`` costed as rowwise), ``enable_fsdp_float8_all_gather``
  (``all_gather: fp8``), ``filter_fqns`` (``output`` or ``lm_head`` in it keeps the LM head
  bf16: ``output_head: false``).
- ``[training] local_batch_size`` (:253, default 8; ``batch_size`` in older files), ``global_batch_size``
  (:256, default -1 = local_batch_size * data-parallel degree, larger = gradient accumulation),
  ``seq_len`` (:261, default 2048), ``mixed_precision_param`` (:282, bfloat16 | float32; in
  ``[parallelism]`` in some versions).
- ``[parallelism] data_parallel_replicate_degree`` (:313, default 1), ``data_parallel_shard_degree``
  (:324, default -1 = the remaining ranks), ``tensor_parallel_degree`` (:351),
  ``pipeline_parallel_degree`` (:360), ``pipeline_parallel_microbatch_size`` (:412, default 1:
  the local batch is split into micro-batches of this size), ``context_parallel_degree`` (:428).
  Shard degree > 1 with replicate 1 is FSDP2 (fully_shard); both > 1 is HSDP.
- ``[activation_checkpoint] mode`` (:652, selective | full | memory_budget | none, default selective) and
  ``selective_ac_option`` ('op': ``training.recompute: selective-op``; an integer N checkpoints every Nth block,
  which dtsim cannot express per layer: 1 is ``full``, N > 1 is taken as ``full``, noted; default '2' in
  pytorch/torchtitan@9dec370 torchtitan/config_manager.py:522-524).
- the loss: ``cross_entropy(pred.float())`` runs eagerly (``training.cross_entropy: eager-fp32``) unless
  torch.compile is on in a file of the ``[compile]`` era, which compiles the loss too
  (pytorch/torchtitan@e7c0cae torchtitan/components/loss.py:20-29); December 2024 files left it eager
  (pytorch/torchtitan@9dec370 train.py:131-138, the compile of the loss commented out).
- ``[compile] enable`` (``[training] compile`` in older files): torch.compile of each block -> ``training.compile``
  (true or false as the file says; absent: torchtitan's default, off).
- ``[parallelism] enable_async_tensor_parallel`` (``[experimental]`` in older files) with tp > 1 ->
  ``parallelism.tp_comm_overlap``.

Files of December 2024 (pytorch/torchtitan@9dec370ad26b5f8e9a7333a0e36165018262644b
torchtitan/config_manager.py) keep the data-parallel and tensor-parallel degrees, ``batch_size``
and ``compile`` in ``[training]`` and the pipeline and context degrees and
``enable_async_tensor_parallel`` in ``[experimental]``; each key is looked up in the newer
section first, then in the older one.
"""

from __future__ import annotations

from typing import Any

from simulator.errors import ScenarioError
from simulator.importers.common import Imported, Layout, check_layout, positive_int

__all__ = ["import_torchtitan", "import_torchtitan_doc", "parse_toml", "LLAMA3_PRESETS"]

LLAMA3_PRESETS = {"8B": "llama3-8b", "70B": "llama3-70b", "405B": "llama3-405b"}
_LAYOUT_KEYS = {"data_parallel_replicate_degree", "data_parallel_shard_degree", "tensor_parallel_degree",
                "pipeline_parallel_degree", "context_parallel_degree", "enable_async_tensor_parallel"}
_MODELLED = {
    "model": {"name", "flavor", "converters"},
    "training": {"local_batch_size", "batch_size", "global_batch_size", "seq_len", "mixed_precision_param", "compile",
                 *_LAYOUT_KEYS},
    "parallelism": {"pipeline_parallel_microbatch_size", "mixed_precision_param", *_LAYOUT_KEYS},
    "experimental": _LAYOUT_KEYS,
    "activation_checkpoint": {"mode", "selective_ac_option"},
    "float8": {"enable_float8_linear"},
    "compile": {"enable"},
}
# read only when float8 linears are on
_FLOAT8_KEYS = {"recipe_name", "enable_fsdp_float8_all_gather", "precompute_float8_dynamic_scale_for_fsdp",
                "filter_fqns"}
_FLOAT8_SECTIONS = ("float8", "quantize.linear.float8")
# where each layout key may sit: the current section first, then the December 2024 one
_SECTIONS = ("parallelism", "training", "experimental")


def parse_toml(text: str, source: str) -> dict[str, Any]:
    """The TOML document, with stdlib ``tomllib`` (Python 3.11+) or the ``tomli`` package."""
    try:
        import tomllib as toml
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as toml  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise ScenarioError("reading TOML needs Python 3.11 or the tomli package (pip install tomli)") from None
    try:
        return toml.loads(text)
    except toml.TOMLDecodeError as exc:
        raise ScenarioError(f"{source}: not valid TOML: {exc}") from None
    except RecursionError:  # the parser recurses once per nesting level
        raise ScenarioError(f"{source}: not valid TOML: nested too deeply") from None


def _ignored(doc: dict[str, Any], fp8: bool) -> list[str]:
    out: list[str] = []

    def walk(node: dict[str, Any], prefix: str) -> None:
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else key
            if isinstance(value, dict):
                walk(value, path)
            elif not (key in _MODELLED.get(prefix, ()) or (fp8 and prefix in _FLOAT8_SECTIONS and key in _FLOAT8_KEYS)):
                out.append(path)

    walk(doc, "")
    return out


def _int(section: dict[str, Any], key: str, default: int, where: str) -> int:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScenarioError(f"{where}.{key} must be an integer, got {value!r}")
    return value


def _layout_section(doc: dict[str, Any]) -> dict[str, Any]:
    """The layout keys wherever the file keeps them (``[parallelism]``, else ``[training]`` or
    ``[experimental]`` as in December 2024 files), plus the rest of ``[parallelism]``."""
    out: dict[str, Any] = {}
    for section in reversed(_SECTIONS):
        values = doc.get(section, {})
        out.update({k: v for k, v in values.items() if k in _LAYOUT_KEYS or section == "parallelism"})
    return out


def import_torchtitan(text: str, *, source: str, cluster: dict[str, Any], world: int, where: str) -> Imported:
    """A scenario from a torchtitan job TOML ``text`` (read from ``source``) on ``cluster``."""
    return import_torchtitan_doc(parse_toml(text, source), source=source, cluster=cluster, world=world, where=where)


def import_torchtitan_doc(doc: dict[str, Any], *, source: str, cluster: dict[str, Any], world: int,
                          where: str) -> Imported:
    """A scenario from a parsed torchtitan job config ``doc`` (the TOML's tables, with any
    command-line overrides applied by the caller) on ``cluster``."""
    notes: list[str] = []
    model_sec, train = doc.get("model", {}), doc.get("training", {})
    par_sec, ac = _layout_section(doc), doc.get("activation_checkpoint", {})
    name, flavor = model_sec.get("name"), str(model_sec.get("flavor", ""))
    if name not in ("llama3", "llama3_1", "llama3.1") or flavor not in LLAMA3_PRESETS:
        raise ScenarioError(f"[model] name = {name!r}, flavor = {flavor!r}: dtsim maps only llama3 flavors "
                            f"{', '.join(LLAMA3_PRESETS)}; write the model section by hand")
    preset = LLAMA3_PRESETS[flavor]
    seq = _int(train, "seq_len", 2048, "training")
    tp = _int(par_sec, "tensor_parallel_degree", 1, "parallelism")
    pp = _int(par_sec, "pipeline_parallel_degree", 1, "parallelism")
    cp = _int(par_sec, "context_parallel_degree", 1, "parallelism")
    replicate = _int(par_sec, "data_parallel_replicate_degree", 1, "parallelism")
    shard = _int(par_sec, "data_parallel_shard_degree", -1, "parallelism")
    for key, value in (("tensor_parallel_degree", tp), ("pipeline_parallel_degree", pp),
                       ("context_parallel_degree", cp), ("data_parallel_replicate_degree", replicate)):
        positive_int(value, f"[parallelism] {key}")
    mp = tp * pp * cp
    if world % mp:
        raise ScenarioError(f"[parallelism] tensor_parallel_degree * pipeline_parallel_degree * "
                            f"context_parallel_degree = {tp}*{pp}*{cp} = {mp} does not divide the world size "
                            f"{world} ({where})")
    dp = world // mp
    if shard == -1:
        if dp % replicate:
            raise ScenarioError(f"[parallelism] data_parallel_replicate_degree = {replicate} does not divide the "
                                f"data-parallel ranks left, {dp}")
        shard = dp // replicate
    elif shard < 1 or replicate * shard != dp:
        raise ScenarioError(f"[parallelism] data_parallel_replicate_degree * data_parallel_shard_degree = "
                            f"{replicate}*{shard} != world / (tp*pp*cp) = {dp} ({where})")
    local_key = "local_batch_size" if "local_batch_size" in train else "batch_size"
    local = positive_int(train.get(local_key, 8), f"[training] {local_key}")
    micro = local
    micro_name = f"[training] {local_key}"
    if pp > 1:
        micro = positive_int(par_sec.get("pipeline_parallel_microbatch_size", 1),
                             "[parallelism] pipeline_parallel_microbatch_size")
        micro_name = "[parallelism] pipeline_parallel_microbatch_size"
        if local % micro:
            raise ScenarioError(f"[training] {local_key} = {local} is not divisible by {micro_name} = {micro}")
    gb = _int(train, "global_batch_size", -1, "training")
    global_batch = local * dp if gb in (-1, 0) else gb
    if gb not in (-1, 0) and gb % (local * dp):
        raise ScenarioError(f"[training] global_batch_size = {gb} is not divisible by {local_key} * data-parallel "
                            f"degree = {local}*{dp} = {local * dp}")
    heads = {"llama3-8b": (32, 8), "llama3-70b": (64, 8), "llama3-405b": (128, 8)}[preset]
    check_layout(Layout(world=world, where=where, tp=(tp, "[parallelism] tensor_parallel_degree"),
                        pp=(pp, "[parallelism] pipeline_parallel_degree"),
                        cp=(cp, "[parallelism] context_parallel_degree"), micro=(micro, micro_name),
                        global_batch=(global_batch, "[training] global_batch_size"),
                        heads=(heads[0], f"{preset} heads"), kv_heads=(heads[1], f"{preset} kv_heads")))
    par: dict[str, Any] = {"tp": tp, "pp": pp, "cp": cp}
    if tp > 1:
        par["sequence_parallel"] = True
        notes.append("torchtitan's tensor parallelism shards the norms' activations along the sequence "
                     "(SequenceParallel on the norms, torchtitan/models/llama3/infra/parallelize.py:181,219 at 4a950ea): sequence_parallel: true")
    if shard > 1 and replicate > 1:
        par.update(sharding="hsdp", shard_group_size=shard)
    elif shard > 1 or cp > 1:
        par["sharding"] = "fsdp"
    else:
        par["sharding"] = "none"
    if cp > 1:
        notes.append("torchtitan shards parameters over data_parallel_shard_degree x context_parallel_degree ranks "
                     "(the fsdp mesh dimension is dp_shard * cp, torchtitan/distributed/parallel_dims.py:137 at "
                     "4a950ea; FSDP is applied whenever dp_shard or cp > 1, pytorch/torchtitan@9dec370 torchtitan/"
                     "parallelisms/parallelize_llama.py:79-93): dtsim's fsdp shards over dp x cp too"
                     + ("; hsdp's shard groups do not include cp" if replicate > 1 else ""))
    if pp > 1 and par["sharding"] in ("fsdp", "hsdp"):
        par["fsdp"] = {"reshard_after_forward": False, "reduce_every_microbatch": False}
        notes.append("with pipeline parallelism the FSDP2 stage runs every micro-batch's backward without gradient "
                     "sync and reduce-scatters after the last (pytorch/pytorch@0138610331c90b8053a0bfc6df0175b200a1cad2 "
                     "torch/distributed/pipelining/stage.py backward_maybe_with_nosync: set_requires_gradient_sync("
                     "False)): parallelism.fsdp.reduce_every_microbatch: false")
        notes.append("with pipeline parallelism torchtitan does not reshard after forward (pytorch/torchtitan@9dec370 "
                     "torchtitan/parallelisms/parallelize_llama.py:326-339; torchtitan/distributed/fsdp.py:129-132 "
                     "at b5bcd76): parallelism.fsdp.reshard_after_forward: false")
    if pp > 1:
        notes.append("torchtitan's default pipeline schedule (1F1B) is assumed; pipeline_parallel_schedule is not read")
    mode = ac.get("mode", "selective")
    if mode not in ("selective", "full", "none"):
        notes.append(f"[activation_checkpoint] mode = {mode!r} is not modelled: full recomputation")
        mode = "full"
    if mode == "selective":
        option = str(ac.get("selective_ac_option", "2"))
        if option == "op":
            mode = "selective-op"
            notes.append("selective_ac_option = 'op': training.recompute: selective-op (torchtitan's op policy)")
        else:
            notes.append(f"selective_ac_option = {option!r} (every Nth block fully checkpointed) is not expressible "
                         "per layer in dtsim: full recomputation of every block")
            mode = "full"
    converters = [str(c) for c in model_sec.get("converters", [])]
    fp8 = any("float8" in c for c in converters) or bool(doc.get("float8", {}).get("enable_float8_linear"))
    mpp = train.get("mixed_precision_param", par_sec.get("mixed_precision_param", "bfloat16"))
    precision = "fp8" if fp8 else "fp32" if mpp == "float32" else "bf16"
    compiled = bool(doc.get("compile", {}).get("enable", train.get("compile", False)))
    # torchtitan compiles the loss with the model from pytorch/torchtitan@d1f62be73 (2025-02-20,
    # build_cross_entropy_loss); December 2024 files (batch_size, no [compile]) ran it eager. A file
    # with [compile] or local_batch_size (2025-06-05 on) is of the compiled-loss era.
    loss_compiled = compiled and ("compile" in doc or "local_batch_size" in train)
    if tp > 1 and par_sec.get("enable_async_tensor_parallel"):
        par["tp_comm_overlap"] = True
        notes.append("enable_async_tensor_parallel: micro-pipelined TP all-gather/reduce-scatter with the GEMMs "
                     "(parallelism.tp_comm_overlap)")
    model: Any = preset if seq == 8192 else {"preset": preset, "seq_len": seq}
    scenario = {
        "name": f"torchtitan {name} {flavor}", "framework": "torchtitan", "model": model, "cluster": cluster,
        "parallelism": par,
        "training": {"micro_batch": micro, "global_batch": global_batch, "precision": precision, "recompute": mode,
                     "compile": compiled, "cross_entropy": "fused" if loss_compiled else "eager-fp32"},
    }
    if fp8:
        scenario["training"]["fp8"] = _float8(doc, notes)
    return Imported(scenario=scenario, source=source, ignored=_ignored(doc, fp8), notes=notes)


def _float8(doc: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """The ``training.fp8`` block from the float8 section (module docstring)."""
    sec = doc.get("quantize", {}).get("linear", {}).get("float8") or doc.get("float8", {})
    recipe = sec.get("recipe_name") or "tensorwise"
    if recipe == "rowwise_with_gw_hp":
        notes.append("recipe_name = 'rowwise_with_gw_hp' keeps the weight-gradient GEMM in bf16; dtsim costs it as "
                     "rowwise (every GEMM of the linear in fp8)")
        recipe = "rowwise"
    if recipe not in ("tensorwise", "rowwise"):
        raise ScenarioError(f"[float8] recipe_name = {recipe!r}: torchao's recipes are tensorwise, rowwise and "
                            "rowwise_with_gw_hp")
    filtered = [str(f) for f in sec.get("filter_fqns", [])]
    head = not any(f in ("output", "lm_head") for f in filtered)
    others = [f for f in filtered if f not in ("output", "lm_head")]
    if others:
        notes.append(f"float8 filter_fqns {others} keep those linears bf16; dtsim runs every block linear in fp8")
    all_gather = "fp8" if sec.get("enable_fsdp_float8_all_gather") else "bf16"
    return {"recipe": recipe, "gemms": "linears", "all_gather": all_gather, "output_head": head}
