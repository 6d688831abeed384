"""JSON Schema of a sweep file (``dtsim schema --kind sweep``): :class:`~simulator.sweep.file.SweepSpec`
finished like the scenario's (:func:`simulator.scenario.schema.finish_schema`), with the shapes the
loader also accepts (``series`` as one field, ``zip`` as one group) and keys that are dotted
scenario field paths (``cluster.nodes``)."""

from __future__ import annotations

from typing import Any

from simulator.scenario.schema import finish_schema
from simulator.sweep.file import SweepSpec

__all__ = ["sweep_json_schema", "FIELD_PATH_PATTERN"]

# a dotted field path: parts separated by '.', each holding something besides white space
# (simulator.sweep.file._check_path)
FIELD_PATH_PATTERN = r"^[^.]*[^.\s][^.]*(\.[^.]*[^.\s][^.]*)*$"


def sweep_json_schema() -> dict[str, Any]:
    """The JSON Schema of a sweep file."""
    schema = SweepSpec.model_json_schema(by_alias=True, mode="validation")
    finish_schema(schema, SweepSpec, "dtsim sweep", (
        "A sweep: a base scenario file and the fields to vary, as dotted scenario field paths (as dtsim run "
        "--set); every point is the base with set, then one value of each vary axis and zip group, then derive."))
    props = schema["properties"]
    path_keys = {"propertyNames": {"pattern": FIELD_PATH_PATTERN}}
    for key in ("set", "vary", "derive"):
        props[key].update(path_keys)
    group = {"type": "object", **path_keys, "additionalProperties": {"type": "array", "minItems": 1},
             "description": "fields varied together: field -> values, all lists of one length"}
    props["zip"] = {**props["zip"], "anyOf": [{"type": "array", "items": group}, group]}
    props["zip"].pop("type", None)
    props["zip"].pop("items", None)
    field = {"type": "string", "pattern": FIELD_PATH_PATTERN}
    props["series"] = {**props["series"], "anyOf": [field, {"type": "array", "items": field}, {"type": "null"}]}
    props["vary"]["additionalProperties"] = {"type": "array", "minItems": 1}
    return schema
