"""JSON Schemas of dtsim's file formats (``dtsim schema --kind ...``): scenario, model preset,
cluster file and node file (the sweep file's is :func:`simulator.sweep.schema.sweep_json_schema`).

Each is generated from the pydantic models that validate the files, then finished for editors
(:func:`finish_schema`):

* every property has a description; a quantity's names its SI unit and the unit strings its
  parser accepts (with a ``pattern`` that matches exactly those, :func:`simulator.units.quantity_pattern`),
  a count of elements says it is not bytes;
* names the catalog knows are enums (node types, GPUs, model presets), beside a path pattern
  where the format also takes a file (``cluster.node``), so editors complete them and files
  naming a custom node file still validate;
* the shapes the loader accepts besides the model's own are allowed (``model: gpt3-175b``,
  ``model: {preset: llama3-8b, seq_len: 4096}``).

The enums come from the catalog given (default: the shipped one, or ``DTSIM_DATA_DIR``'s).
"""

from __future__ import annotations

import copy
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from simulator.catalog import Catalog, NodeTypeSpec, default_catalog
from simulator.fields import quantity_of
from simulator.scenario.model import ModelSpec
from simulator.scenario.spec import ClusterSpec, Scenario
from simulator.units import quantity_pattern

__all__ = [
    "SCHEMA_DIALECT",
    "UNIT_TEXT",
    "scenario_json_schema",
    "preset_json_schema",
    "cluster_json_schema",
    "node_json_schema",
    "finish_schema",
    "field_quantity_of",
]

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"

# quantity -> (what a plain number means, the unit strings accepted): appended to the description
UNIT_TEXT: dict[str, tuple[str, str]] = {
    "size": ("bytes (B)", "or a string with a unit: B = byte, b = bit, SI prefixes k M G T P E = powers of 1000, "
             "IEC prefixes Ki Mi Gi Ti Pi Ei = powers of 1024, e.g. '80GiB', '512 MiB'"),
    "rate": ("bytes per second (B/s)", "or a string with a unit: B/s or Bps (bytes), b/s or bps (bits) per second, "
             "SI prefixes k M G T = powers of 1000, IEC prefixes Ki Mi Gi = powers of 1024, e.g. '400 Gb/s' "
             "(= 50e9 B/s), '400Gbps', '25GB/s'"),
    "time": ("seconds (s)", "or a string with a unit: ps ns us µs ms s min h, e.g. '2us', '1.5 ms'"),
    "duration": ("seconds (s)", "or a string with a unit: s min h (and ps ns us µs ms), e.g. '10min', '79230h'"),
    "FLOP rate": ("FLOP per second (FLOP/s)", "or a string FLOPS or FLOP/s with an SI prefix (k M G T P E), "
                  "e.g. '312TFLOPS', '989 TFLOP/s'"),
}
_PATTERN_DIMENSION = {"size": "size", "rate": "rate", "time": "time", "duration": "time", "FLOP rate": "flop rate"}
# a path (not a catalog name) where a field takes either: holds a '/' or ends in .yaml/.yml
# (simulator.scenario.resolve.is_catalog_name)
_PATH_PATTERN = r"(/|\.ya?ml$)"


def _catalog(catalog: Catalog | None) -> Catalog:
    return catalog or default_catalog()


def _names(values: list[str], what: str) -> dict[str, Any]:
    return {"type": "string", "enum": sorted(values), "description": what}


def _with_null(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def scenario_json_schema(catalog: Catalog | None = None) -> dict[str, Any]:
    """The JSON Schema of a scenario file (``dtsim schema``)."""
    catalog = _catalog(catalog)
    schema = Scenario.model_json_schema(by_alias=True, mode="validation")
    finish_schema(schema, Scenario, "dtsim scenario", (
        "A distributed-training scenario: model, cluster, parallelism, training and sim sections. "
        "Quantities accept SI numbers or strings with units ('400Gbps', '80GiB', '2us'). "
        "model may also be a preset name (scenarios/models/), or a preset with fields overridden. framework "
        "names a profile of defaults (topologies/frameworks/); fields the scenario gives always win over it."))
    defs = schema["$defs"]
    _cluster_names(defs["ClusterSpec"], catalog)
    preset = _names(catalog.preset_names(), "a model preset (scenarios/models/<name>.yaml)")
    model = defs["ModelSpec"]
    model["properties"]["preset"] = {**_with_null(preset), "default": None, "description":
                                     "the preset these fields start from (their values override the preset's)"}
    override = copy.deepcopy(model)
    override["properties"]["preset"] = {**preset, "description": "the preset the other fields override"}
    override["required"] = ["preset"]
    override["title"] = "ModelPresetOverride"
    override["description"] = "a model preset with some of its fields overridden, e.g. {preset: llama3-8b, seq_len: 4096}"
    defs["ModelPresetOverride"] = override
    schema["properties"]["model"] = {
        "description": "the transformer: a preset name, a preset with fields overridden, or every field given",
        "anyOf": [preset, {"$ref": "#/$defs/ModelPresetOverride"}, {"$ref": "#/$defs/ModelSpec"}],
    }
    return schema


def preset_json_schema(catalog: Catalog | None = None) -> dict[str, Any]:
    """The JSON Schema of a model preset file (``scenarios/models/<name>.yaml``)."""
    schema = ModelSpec.model_json_schema(by_alias=True, mode="validation")
    finish_schema(schema, ModelSpec, "dtsim model preset", (
        "A model preset (scenarios/models/<name>.yaml): the fields of a scenario's model section, with name and "
        "source (the citation of the architecture). Scenarios name it as model: <name>."))
    del schema["properties"]["preset"]  # a preset file is the preset; it names none
    return schema


def cluster_json_schema(catalog: Catalog | None = None) -> dict[str, Any]:
    """The JSON Schema of a cluster file (what a scenario's ``cluster.topology`` names)."""
    schema = ClusterSpec.model_json_schema(by_alias=True, mode="validation")
    finish_schema(schema, ClusterSpec, "dtsim cluster file", (
        "A cluster file: the keys of a scenario's cluster section, named by cluster.topology; paths in it are "
        "relative to the file, and the scenario's own cluster keys win over the file's."))
    del schema["properties"]["topology"]  # a cluster file cannot name another (simulator.scenario.resolve)
    _cluster_names(schema, _catalog(catalog))
    return schema


def node_json_schema(catalog: Catalog | None = None) -> dict[str, Any]:
    """The JSON Schema of a node type file (``topologies/nodes/<name>.yaml``, or a file ``cluster.node`` names)."""
    schema = NodeTypeSpec.model_json_schema(by_alias=True, mode="validation")
    finish_schema(schema, NodeTypeSpec, "dtsim node type", (
        "A node type (topologies/nodes/<name>.yaml or a file that cluster.node names): its GPUs, their "
        "interconnect, PCIe, NICs and host, with the sources of every number."))
    schema["properties"]["gpu"] = {**_names(list(_catalog(catalog).gpus), "GPU type (topologies/gpus.yaml)")}
    return schema


def _cluster_names(cluster: dict[str, Any], catalog: Catalog) -> None:
    props = cluster["properties"]
    nodes = _names(catalog.node_type_names(), "a node type (topologies/nodes/<name>.yaml)")
    node_file = {"type": "string", "pattern": _PATH_PATTERN,
                 "description": "a node type file (see dtsim schema --kind node), relative to this file"}
    props["node"] = {**props["node"], "anyOf": [nodes, node_file, {"type": "null"}]}
    gpus = _names(list(catalog.gpus), "a GPU type (topologies/gpus.yaml)")
    props["gpu"] = {**props["gpu"], "anyOf": [gpus, {"type": "null"}]}


# ----------------------------------------------------------------------------------------
# finishing: descriptions, units


def finish_schema(schema: dict[str, Any], model: type[BaseModel], title: str, description: str) -> dict[str, Any]:
    """Finish ``schema`` (``model.model_json_schema(by_alias=True, mode="validation")``) in place:
    the 2020-12 dialect, ``title`` and ``description``, each quantity's unit and accepted unit
    strings (:data:`UNIT_TEXT`), and each ``$ref`` property described by its target."""
    schema["$schema"] = SCHEMA_DIALECT
    schema["title"] = title
    schema["description"] = description
    defs = schema.get("$defs", {})
    for cls in _models(model):
        target = schema if cls is model else defs.get(cls.__name__)
        if target is None:
            continue
        for name, field in cls.model_fields.items():
            prop = target.get("properties", {}).get(field.alias or name)
            if prop is not None:
                _describe_quantity(prop, field_quantity_of(field), field)
    for target in [schema, *defs.values()]:
        for prop in target.get("properties", {}).values():
            ref = prop.get("$ref", "")
            if not prop.get("description") and ref.startswith("#/$defs/"):
                prop["description"] = defs[ref.removeprefix("#/$defs/")].get("description", "")
    return schema


def field_quantity_of(field: FieldInfo) -> str | None:
    """The quantity (``size``, ``rate``, ``time``, ``FLOP rate``, ``elements``) of a field declared
    with one of :mod:`simulator.fields`' unit types, optional (``Rate | None``) or not; else None."""
    return quantity_of(_metadata_of(field))


def _describe_quantity(prop: dict[str, Any], quantity: str | None, field: FieldInfo) -> None:
    if quantity is None:
        return
    text = prop.get("description", "")
    if quantity == "elements":
        prop["description"] = f"{text} (a count of tensor elements, not bytes)".strip()
        return
    meaning, strings = UNIT_TEXT[quantity]
    # in a file only 0 may go without a unit (simulator.fields.UNITS_REQUIRED); a field that
    # must be positive has no unitless value at all
    positive = any(getattr(bound, "gt", None) is not None for bound in _metadata_of(field))
    bare = "a bare number is refused" if positive else "a bare number other than 0 is refused"
    prop["description"] = (f"{text}. Unit: files write {strings.removeprefix('or ')} ({bare}: its unit is "
                           f"unknown); the Python API also takes a number in {meaning}").lstrip(". ")
    numbers: list[dict[str, Any]] = [] if positive else [
        {"type": "number", "const": 0, "description": f"0 needs no unit ({meaning})"}]
    string = {"type": "string", "pattern": quantity_pattern(_PATTERN_DIMENSION[quantity]),
              "description": f"{quantity} with a unit, {strings.removeprefix('or a string with a unit: ')}"}
    nullable = any(branch.get("type") == "null" for branch in prop.get("anyOf", []))
    prop["anyOf"] = [*numbers, string, *([{"type": "null"}] if nullable else [])]


def _metadata_of(field: FieldInfo) -> list[Any]:
    """The field's metadata and that of the ``Annotated`` types inside its annotation (``Rate | None``)."""
    out = list(field.metadata)
    stack: list[Any] = [field.annotation]
    while stack:
        annotation = stack.pop()
        if typing.get_origin(annotation) is typing.Annotated:
            for item in annotation.__metadata__:
                out.extend(item.metadata if isinstance(item, FieldInfo) else [item])
            stack.append(typing.get_args(annotation)[0])
        elif typing.get_origin(annotation) in (typing.Union, types.UnionType):
            stack.extend(typing.get_args(annotation))
    return out


def _models(root: type[BaseModel]) -> list[type[BaseModel]]:
    """``root`` and every pydantic model its fields hold, at any depth."""
    seen: list[type[BaseModel]] = []
    stack: list[Any] = [root]
    while stack:
        item = stack.pop()
        if isinstance(item, type) and issubclass(item, BaseModel):
            if item in seen:
                continue
            seen.append(item)
            stack.extend(f.annotation for f in item.model_fields.values())
        else:
            stack.extend(typing.get_args(item))
    return seen
