"""Framework profiles applied to a scenario mapping, before validation.

``framework: megatron-core`` makes the profile ``topologies/frameworks/megatron-core.yaml``
the scenario's defaults. Precedence, highest first:

1. what the scenario gives (its file and ``--set`` overrides),
2. the framework profile,
3. dtsim's own defaults (``framework: generic``, which has no profile).

:func:`apply_framework` deep-merges the profile's values under the mapping for the paths
the mapping does not give, and records where each profile path got its value
(:data:`SETTINGS_SOURCE_KEY`: path -> the framework's name, ``"scenario"`` or ``"default"``).
An option block is applied only when the effective ``sharding`` reads it
(:data:`~simulator.scenario.parallelism.OPTION_BLOCKS`): a profile's ZeRO options do not
touch a DDP scenario, and the ``training.fp8`` block only when the effective ``precision`` is
fp8. The function is idempotent: a mapping that already carries its
sources is returned as it is, so the loader and ``Scenario.model_validate`` agree.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel

from simulator.catalog import Catalog
from simulator.fields import quantity_of
from simulator.scenario.parallelism import OPTION_BLOCKS

__all__ = ["Framework", "FRAMEWORKS", "GENERIC", "SETTINGS_SOURCE_KEY", "apply_framework", "field_default", "value_at",
           "source_of", "framework_settings", "field_quantity", "format_setting", "setting_row", "framework_setting_rows"]

Framework = Literal[
    "generic", "megatron-core", "nemo", "megatron-lm", "deepspeed", "pytorch-fsdp", "torchtitan", "llm-foundry"
]
GENERIC: Literal["generic"] = "generic"
FRAMEWORKS: tuple[str, ...] = Framework.__args__  # type: ignore[attr-defined]

# the key of the resolved mapping holding {path: source}; Scenario keeps it as ``settings_source``
SETTINGS_SOURCE_KEY = "settings_source"


def _given(data: dict[str, Any], path: tuple[str, ...]) -> bool:
    node: Any = data
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True


def _blocked(data: dict[str, Any], path: tuple[str, ...]) -> bool:
    """True when a prefix of ``path`` is given but is not a section (validation names it)."""
    node: Any = data
    for key in path[:-1]:
        if key not in node:
            return False
        node = node[key]
        if not isinstance(node, dict):
            return True
    return False


def _put(data: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = data
    for key in path[:-1]:
        node[key] = dict(node.get(key) or {})
        node = node[key]
    node[path[-1]] = value


def _effective(data: dict[str, Any], profile_values: dict[tuple[str, ...], Any], path: tuple[str, str],
               default: str) -> Any:
    section = data.get(path[0])
    if isinstance(section, dict) and path[1] in section:
        return section[path[1]]
    return profile_values.get(path, default)


def _read(path: tuple[str, ...], sharding: Any, precision: Any) -> bool:
    """Whether the scenario reads ``path``: an option block only under the sharding that
    reads it, the fp8 block only when training in fp8."""
    if len(path) >= 3 and path[0] == "parallelism" and path[1] in OPTION_BLOCKS:
        return sharding in OPTION_BLOCKS[path[1]]
    if len(path) >= 3 and path[:2] == ("training", "fp8"):
        return precision == "fp8"
    return True


def apply_framework(data: dict[str, Any], catalog: Catalog | Callable[[], Catalog]) -> dict[str, Any]:
    """A copy of the scenario mapping ``data`` with its framework profile's values under it
    and :data:`SETTINGS_SOURCE_KEY` filled (module docstring). ``generic`` (or no
    ``framework``) adds an empty source map and nothing else. ``catalog`` (or a function
    returning it, called only when a profile is read) holds the profiles."""
    if SETTINGS_SOURCE_KEY in data:
        return data
    out = dict(data)
    name = data.get("framework", GENERIC)
    sources: dict[str, str] = {}
    if not isinstance(name, str) or name == GENERIC or name not in FRAMEWORKS:
        out[SETTINGS_SOURCE_KEY] = sources  # a wrong name is left to validation, which lists the values
        return out
    values = (catalog if isinstance(catalog, Catalog) else catalog()).framework(name).path_values()
    sharding = _effective(data, values, ("parallelism", "sharding"), "none")
    precision = _effective(data, values, ("training", "precision"), "bf16")
    for path, value in values.items():
        dotted = ".".join(path)
        if _given(data, path):
            sources[dotted] = "scenario"
        elif _blocked(data, path) or not _read(path, sharding, precision):
            sources[dotted] = "default"
        else:
            _put(out, path, value)
            sources[dotted] = name
    out[SETTINGS_SOURCE_KEY] = sources
    return out


def field_default(model: type[BaseModel], path: tuple[str, ...]) -> Any:
    """dtsim's default of the field at ``path`` (names or aliases) below ``model``: what ``generic`` uses."""
    field = model.model_fields[_field_name(model, path[0])]
    if len(path) == 1:
        return field.get_default(call_default_factory=True)
    child = field.annotation
    assert isinstance(child, type) and issubclass(child, BaseModel), path
    return field_default(child, path[1:])


def field_quantity(model: type[BaseModel], path: tuple[str, ...]) -> str | None:
    """The physical quantity (``size``, ``rate``, ``time``) of the field at ``path``, None for plain values."""
    field = model.model_fields[_field_name(model, path[0])]
    if len(path) == 1:
        return quantity_of(field.metadata)
    child = field.annotation
    assert isinstance(child, type) and issubclass(child, BaseModel), path
    return field_quantity(child, path[1:])


def _field_name(model: type[BaseModel], key: str) -> str:
    return next((n for n, f in model.model_fields.items() if key in (n, f.alias)), key)


def value_at(obj: BaseModel, path: tuple[str, ...]) -> Any:
    """The value at ``path`` (names or aliases) of the validated ``obj``, as a file writes it."""
    node: Any = obj
    for key in path:
        node = getattr(node, _field_name(type(node), key))
    return node


def source_of(scenario: BaseModel, path: str) -> str:
    """Where the scenario's effective value at the dotted ``path`` came from (``Scenario.source_of``)."""
    sources: dict[str, str] = getattr(scenario, SETTINGS_SOURCE_KEY)
    if path in sources:
        return sources[path]
    node: Any = scenario
    for key in path.split("."):
        name = _field_name(type(node), key)
        if name not in node.model_fields_set:
            return "default"
        node = getattr(node, name)
    return "scenario"


def framework_settings(scenario: BaseModel) -> list[tuple[str, Any, str]]:
    """(path, effective value, source) of the profile's settings whose effective value differs
    from dtsim's default (``generic``), in the profile's order."""
    rows = []
    for path, source in getattr(scenario, SETTINGS_SOURCE_KEY).items():
        parts = tuple(path.split("."))
        value = value_at(scenario, parts)
        if value != field_default(type(scenario), parts):
            rows.append((path, value, source))
    return rows


def format_setting(value: Any, quantity: str | None = None) -> str:
    """A setting as a scenario file writes it (``false``, ``null``, ``40000000``, ``fp32``; sizes,
    rates and times with their unit, ``160 MB``)."""
    from simulator import units

    if quantity is not None and isinstance(value, (int, float)):
        return {"size": units.format_bytes, "rate": units.format_rate, "time": units.format_time,
                "duration": units.format_time, "elements": lambda v: f"{v:,} elements"}.get(quantity, lambda v: json.dumps(v))(value)
    return value if isinstance(value, str) else json.dumps(value)


def setting_row(scenario: BaseModel, path: str) -> tuple[str, str, str]:
    """(dotted path, effective value as :func:`format_setting` writes it, source) of one setting."""
    parts = tuple(path.split("."))
    value = value_at(scenario, parts)
    return path, format_setting(value, field_quantity(type(scenario), parts)), source_of(scenario, path)


def framework_setting_rows(scenario: BaseModel) -> list[tuple[str, str, str]]:
    """:func:`framework_settings` with each value written as :func:`format_setting` does:
    what ``dtsim run`` prints under "framework" and the report's effective-settings table lists."""
    return [(path, format_setting(value, field_quantity(type(scenario), tuple(path.split(".")))), source)
            for path, value, source in framework_settings(scenario)]
