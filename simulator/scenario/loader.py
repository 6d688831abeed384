"""Reading scenario files: YAML 1.2, ``--set`` overrides, reference resolution, located error messages.

:func:`load_scenario` reads the file, applies the overrides, resolves every reference
(model preset, node type, GPU, cluster file, calibration path) through a catalog with
:func:`resolve_references`, and only then validates: validation itself reads no file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from simulator import limits
from simulator.catalog import Catalog, default_catalog
from simulator.errors import ScenarioError
from simulator.fields import UNITS_REQUIRED
from simulator.scenario.framework import apply_framework
from simulator.scenario.model import resolve_model
from simulator.scenario.resolve import resolve_cluster
from simulator.scenario.spec import Scenario
from simulator.yamlio import error_from_validation, line_of, load_mapping, parse_yaml_text, to_plain

__all__ = ["load_scenario", "scenario_from_mapping", "resolve_references", "apply_overrides", "parse_override"]


def parse_override(text: str) -> tuple[tuple[str, ...], Any]:
    """``"parallelism.tp=4"`` -> ``(("parallelism", "tp"), 4)``; the value is read as YAML."""
    if "=" not in text:
        raise ScenarioError(f"--set {text!r}: expected KEY=VALUE, e.g. parallelism.tp=4")
    key, raw = text.split("=", 1)
    path = tuple(part.strip() for part in key.strip().split("."))
    if not all(path):
        raise ScenarioError(f"--set {text!r}: empty key segment in {key!r}")
    shown = text if len(text) <= 80 else text[:77] + "..."
    try:
        value = to_plain(parse_yaml_text(raw, file=f"--set {shown}")) if raw.strip() else ""
    except ScenarioError as exc:  # a one-line value: its line number says nothing
        raise ScenarioError(exc.message, file=exc.file) if "\n" not in raw.strip() else exc from None
    return path, value


def apply_overrides(data: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> dict[tuple[str, ...], str]:
    """Apply ``KEY=VALUE`` overrides in place; returns {path: original text} for error messages."""
    applied: dict[tuple[str, ...], str] = {}
    for text in overrides:
        path, value = parse_override(text)
        node: Any = data
        for i, key in enumerate(path[:-1]):
            child = node.get(key) if isinstance(node, dict) else None
            if child is None:
                child = {}
                node[key] = child
            elif isinstance(child, str) and key == "model" and i == 0:
                child = {"preset": child}
                node[key] = child
            elif not isinstance(child, dict):
                raise ScenarioError(f"--set {text!r}: {'.'.join(path[: i + 1])} is not a section")
            node = child
        node[path[-1]] = value
        applied[path] = text
    return applied


def _override_for(loc: str | None, applied: dict[tuple[str, ...], str]) -> str | None:
    if not loc:
        return None
    for path, text in applied.items():
        prefix = ".".join(path)
        if loc == prefix or loc.startswith(prefix + ".") or prefix.startswith(loc + "."):
            return text
    return None


def resolve_references(data: dict[str, Any], catalog: Catalog, base_dir: Path | None = None) -> dict[str, Any]:
    """A copy of the scenario mapping ``data`` with its framework profile applied under it
    (:func:`~simulator.scenario.framework.apply_framework`), its model preset merged in and its
    cluster's files read and names looked up in ``catalog`` (paths relative to ``base_dir``).
    ``Scenario.model_validate`` of the result reads no file."""
    data = apply_framework(data, catalog)
    if "model" in data:
        data["model"] = resolve_model(data["model"], catalog)
    if "cluster" in data:
        data["cluster"] = resolve_cluster(data["cluster"], catalog, base_dir)
    return data


def _count(data: dict[str, Any], section: str, key: str) -> int | None:
    value = data.get(section)
    value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def check_sizes(data: dict[str, Any]) -> None:
    """The counts of a resolved scenario mapping against :mod:`simulator.limits` (cluster nodes
    and GPUs, model layers and sequence length, global batch and tokens per step, MoE routing
    draws), before
    validation: an absurd count must be reported as over its limit, not as whatever
    cross-field rule it happens to break first. Values of the wrong type are left to validation."""
    nodes = _count(data, "cluster", "nodes")
    if nodes is not None:
        limits.check("nodes", nodes, what="cluster nodes", field="cluster.nodes")
        per_node = _count(data, "cluster", "gpus_per_node") or getattr(
            (data.get("cluster") or {}).get("node_type"), "gpus", None)
        if isinstance(per_node, int):
            limits.check("world_size", nodes * per_node, what=f"GPUs ({nodes:,} nodes x {per_node} GPUs)",
                         field="cluster.nodes")
    layers, seq_len = _count(data, "model", "layers"), _count(data, "model", "seq_len")
    if layers is not None:
        limits.check("layers", layers, what="model layers", field="model.layers")
    if seq_len is not None:
        limits.check("seq_len", seq_len, what="sequence length", field="model.seq_len")
    batch = _count(data, "training", "global_batch")
    if batch is not None:
        limits.check("global_batch", batch, what="global batch", field="training.global_batch")
        if seq_len is not None:
            limits.check("tokens_per_step", batch * seq_len, what=f"tokens per step ({batch:,} x {seq_len:,})",
                         field="training.global_batch")
    training = data.get("training")
    if isinstance(training, dict):
        samples, seeds = _count(training, "moe_routing", "samples"), _count(training, "moe_routing", "seeds")
        if samples is not None or seeds is not None:  # the defaults: 16 draws, 8 seeds
            samples, seeds = samples or 16, seeds or 8
            limits.check("routing_draws", samples * seeds, what=f"routing draws ({samples:,} samples x {seeds:,} "
                         "seeds)", field="training.moe_routing.samples")


def scenario_from_mapping(
    data: dict[str, Any],
    *,
    root: Any = None,
    file: str | None = None,
    base_dir: Path | None = None,
    applied: dict[tuple[str, ...], str] | None = None,
    catalog: Catalog | None = None,
    units_required: bool | None = None,
) -> Scenario:
    """Resolve and validate a plain mapping into a :class:`Scenario`, turning errors into one
    located line. ``catalog``: where names are looked up (default: the default catalog).
    ``units_required`` (default: when ``file`` is given): a size, rate or time written as a bare
    number is an error; without it a number is taken in SI base units (Python API)."""
    applied = applied or {}
    catalog = catalog or default_catalog()
    strict = file is not None if units_required is None else units_required
    context = {"base_dir": str(base_dir) if base_dir else None, "catalog": catalog, UNITS_REQUIRED: strict}
    try:
        resolved = resolve_references(data, catalog, base_dir)
        check_sizes(resolved)
        return Scenario.model_validate(resolved, context=context)
    except ValidationError as exc:
        error = error_from_validation(exc, root=root, file=file, model=Scenario)
    except ScenarioError as exc:
        if exc.file:  # already located (an error inside a preset or cluster file)
            raise
        error = exc
        if root is not None and exc.field and exc.line is None:
            error = exc.located(file=file, line=line_of(root, _loc(exc.field)))
        elif exc.file is None:
            error = exc.located(file=file)
    override = _override_for(error.field, applied)
    if override is not None:
        raise type(error)(error.message, field=f"--set {override}") from None  # LimitError, InfeasibleError kept
    raise error from None


def _loc(field: str) -> tuple[str | int, ...]:
    """``"faults.links[1].select"`` -> ("faults", "links", 1, "select"): a dotted field as the
    keys and list indices :func:`line_of` follows."""
    out: list[str | int] = []
    for part in field.split("."):
        name, *indices = part.replace("]", "").split("[")
        out.append(name)
        out.extend(int(i) for i in indices if i.isdigit())
    return tuple(out)


# --set values that name files: a relative path that exists from the working directory means
# that file (dtsim run s.yaml --set cluster.calibration=cpu.yaml); otherwise, as in the
# scenario file, it is relative to the scenario's folder
_PATH_KEYS = {("cluster", "calibration"), ("cluster", "topology"), ("cluster", "node")}


def _override_paths_from_cwd(data: dict[str, Any], applied: dict[tuple[str, ...], str]) -> None:
    for path in applied:
        if path not in _PATH_KEYS or not isinstance(data.get(path[0]), dict):
            continue
        section = data[path[0]]
        value = section.get(path[1])
        if isinstance(value, str) and (value.endswith((".yaml", ".yml")) or "/" in value):
            candidate = Path(value).expanduser()
            if not candidate.is_absolute() and candidate.is_file():
                section[path[1]] = str(candidate.resolve())


def load_scenario(
    path: str | Path, overrides: list[str] | tuple[str, ...] | None = None, *, catalog: Catalog | None = None
) -> Scenario:
    """Load, override, resolve and validate a scenario file (shared/CONTRACT.md: ``simulator.load_scenario``);
    ``catalog``: where node types, GPUs and presets are looked up (default: the default catalog)."""
    path = Path(path)
    root = load_mapping(path, "a scenario (model, cluster, parallelism, training, sim)")
    data = to_plain(root)
    applied = apply_overrides(data, list(overrides or []))
    _override_paths_from_cwd(data, applied)
    return scenario_from_mapping(data, root=root, file=str(path), base_dir=path.resolve().parent, applied=applied,
                                 catalog=catalog)

