"""Reference resolution: turn the names and paths of a ``cluster`` section into plain data.

A cluster names a node type (catalog name or node file), optionally a GPU, a calibration
profile and a cluster file (``topology``) holding these same keys. :func:`resolve_cluster`
reads what they name through a :class:`~simulator.catalog.Catalog` and returns a mapping in
which the node type and GPU are specs (``node_type``, ``gpu_spec``) and every path is
absolute and exists. Validation of such a mapping reads no file.

Paths are relative to ``base_dir`` (the scenario file's folder; the working directory when
none) or, inside a cluster file, to that file's folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationInfo

from simulator.catalog import Catalog, default_catalog
from simulator.errors import ScenarioError
from simulator.safe_input import not_a_regular_file
from simulator.yamlio import load_mapping, to_plain

__all__ = ["catalog_in", "base_dir_in", "resolve_cluster", "is_resolved_cluster", "is_catalog_name", "check_profile_device"]

# keys of a resolved cluster mapping that hold specs rather than names
RESOLVED_KEYS = ("node_type", "gpu_spec")


def catalog_in(info: ValidationInfo) -> Catalog:
    """The catalog passed as ``context={"catalog": ...}`` to ``model_validate``, or the default."""
    catalog = (info.context or {}).get("catalog")
    return catalog if isinstance(catalog, Catalog) else default_catalog()


def base_dir_in(info: ValidationInfo) -> Path:
    """The folder relative paths start from: ``context={"base_dir": ...}`` or the working directory."""
    return Path((info.context or {}).get("base_dir") or Path.cwd())


def is_catalog_name(value: str, key: str) -> bool:
    """True when ``value`` is a catalog name rather than a path (only ``node`` has a catalog)."""
    if key != "node":
        return False
    return not (value.endswith((".yaml", ".yml")) or "/" in value)


def _absolute(value: str, base: Path) -> str:
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else (base / path).resolve())


def is_resolved_cluster(value: Any) -> bool:
    """True for a mapping that already holds its node type spec (nothing left to read)."""
    return not isinstance(value, dict) or value.get("node_type") is not None


def _merge_topology_file(value: dict[str, Any], base: Path) -> dict[str, Any]:
    path = Path(_absolute(str(value["topology"]), base))
    root = load_mapping(path, "a cluster file (node, nodes, fabric, ...)")
    data = to_plain(root)
    if "topology" in data:
        raise ScenarioError("a cluster file cannot name another topology", field="topology", file=str(path))
    file_fabric = data.pop("fabric", {}) or {}
    for key in ("node", "calibration"):
        if isinstance(data.get(key), str) and not is_catalog_name(data[key], key):
            data[key] = _absolute(data[key], path.parent)
    own_fabric = value.pop("fabric", {}) or {}
    return {**data, **value, "topology": str(path), "fabric": {**file_fabric, **own_fabric}}


def check_profile_device(profile: Any, path: str, gpu: str, other_device: bool) -> None:
    """A measured profile describes the device it was measured on: refuse it for a cluster of
    another GPU unless ``cluster.calibration_other_device`` says the user means it (a CPU
    profile on a GPU cluster answers "what would this job take on my CPU", not a GPU's time)."""
    if other_device or profile.gpu == gpu:
        return
    fix = (f"if the cluster's GPUs are {profile.gpu}, set cluster.gpu: {profile.gpu}; " if profile.gpu else "")
    raise ScenarioError(f"the profile {Path(path).name} was measured on {profile.measured_on}, not on the cluster's "
                        f"GPU {gpu}; {fix}to apply it to {gpu} anyway, set cluster.calibration_other_device: true",
                        field="cluster.calibration")


def resolve_cluster(value: Any, catalog: Catalog, base_dir: Path | None = None) -> Any:
    """The cluster mapping ``value`` with its cluster file merged in, paths made absolute, and
    the node type and GPU looked up (``node_type``, ``gpu_spec``); errors name the field.
    Already resolved mappings and values that are not mappings are returned as they are."""
    if is_resolved_cluster(value):
        return value
    base = base_dir or Path.cwd()
    value = dict(value)
    if value.get("topology"):
        value = _merge_topology_file(value, base)
    for key in ("node", "calibration"):
        if isinstance(value.get(key), str) and not is_catalog_name(value[key], key):
            value[key] = _absolute(value[key], base)
    node = value.get("node")
    if not node:
        raise ScenarioError("cluster.node is required (a node type such as 'p4d.24xlarge', or a file)",
                            field="cluster.node")
    if not isinstance(node, str):
        return value  # validation names the wrong type
    try:
        node_type = catalog.node_type(node)
    except ScenarioError as exc:
        if exc.file:  # an error inside the node file
            raise
        raise ScenarioError(exc.message, field="cluster.node") from None
    gpu = value.get("gpu")
    if gpu is not None and not isinstance(gpu, str):
        return value
    try:
        gpu_spec = catalog.gpu(gpu or node_type.gpu)
    except ScenarioError as exc:
        raise ScenarioError(exc.message, field="cluster.gpu") from None
    calibration = value.get("calibration")
    problem = not_a_regular_file(calibration) if isinstance(calibration, str) else None
    if problem is not None:
        what = "not found" if problem == "no such file" else f"cannot be read: {problem}"
        raise ScenarioError(f"calibration profile {calibration!r} {what}", field="cluster.calibration")
    if isinstance(calibration, str):
        check_profile_device(catalog.profile(calibration), calibration, gpu_spec.name,
                             value.get("calibration_other_device") is True)
    return {**value, "node_type": node_type, "gpu_spec": gpu_spec}
