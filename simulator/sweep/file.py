"""Sweep files: a base scenario and the axes to vary (shared/CONTRACT.md "Sweep file"), and their loading.

    base: ../quickstart.yaml              # a scenario file, relative to this file (required)
    name: GPT-3 XL scaling                # optional, titles the figures
    set:                                  # fixed overrides of the base (optional)
      training.recompute: full
    vary:                                 # the product of all axes; one axis per key
      cluster.nodes: [1, 2, 4, 8, 16]
    zip:                                  # axes whose fields change together (equal lengths);
      - parallelism.sharding: [none, zero3, mics]        # each group is one axis of the product
        parallelism.shard_group_size: [null, null, 8]
    derive:                               # computed per point, in order, after set/vary/zip
      training.global_batch: "{cluster.nodes} * 8 * 4"   # keep 4 sequences per GPU
    series: parallelism.sharding          # field(s) naming the lines of scaling.html (optional)

Keys are dotted scenario field paths (as ``--set``). A ``null`` value removes the field from
the point, so the scenario default applies (``shard_group_size: null`` for ZeRO-3 next to
``8`` for MiCS). ``derive`` values are arithmetic over ``{field.path}`` references
(:mod:`simulator.sweep.expressions`: numbers, ``+ - * / // % **``, ``min max abs round ceil
floor``). Points (:mod:`simulator.sweep.points`) are numbered in product order: the
``vary`` axes in file order (the first varies slowest), then the ``zip`` groups.

A malformed sweep file raises :class:`~simulator.errors.ScenarioError` naming file, line and
field.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator
from ruamel.yaml.comments import CommentedMap

from simulator import limits
from simulator.errors import ScenarioError
from simulator.fields import Frozen
from simulator.yamlio import dotted, error_from_validation, line_of, load_mapping, load_yaml, to_plain

__all__ = ["SweepSpec", "SweepFile", "load_sweep", "GPU_COUNT_FIELDS"]

# fields that change the number of GPUs: the x axis of scaling curves, never a series
GPU_COUNT_FIELDS = frozenset({"cluster.nodes", "cluster.gpus_per_node"})


def _check_path(path: str) -> str:
    parts = path.split(".")
    if not path or not all(p.strip() for p in parts):
        raise ValueError(f"{path!r} is not a dotted field path such as 'cluster.nodes'")
    return path


class SweepSpec(Frozen):
    """The content of a sweep file (see the module docstring)."""

    base: str = Field(description="scenario file, relative to the sweep file")
    name: str | None = Field(None, description="free text, titles the figures")
    overrides: dict[str, Any] = Field(default_factory=dict, alias="set",
                                      description="fixed field overrides of the base, applied first")
    vary: dict[str, list[Any]] = Field(default_factory=dict, description="field -> values; the product of all axes")
    zip: list[dict[str, list[Any]]] = Field(
        default_factory=list, description="groups of fields varied together; each group is one axis")
    derive: dict[str, str] = Field(default_factory=dict,
                                   description="field -> arithmetic over {field.path} references, in order")
    series: list[str] | None = Field(None, description="fields naming the lines of the scaling figure")

    @field_validator("zip", mode="before")
    @classmethod
    def _one_group(cls, value: Any) -> Any:
        return [value] if isinstance(value, dict) else value

    @field_validator("series", mode="before")
    @classmethod
    def _series_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("vary")
    @classmethod
    def _axes(cls, value: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for path, values in value.items():
            _check_path(path)
            if not values:
                raise ValueError(f"{path}: an axis needs at least one value")
        return value

    @field_validator("overrides", "derive")
    @classmethod
    def _paths(cls, value: dict[str, Any]) -> dict[str, Any]:
        for path in value:
            _check_path(path)
        return value

    @field_validator("derive")
    @classmethod
    def _expressions(cls, value: dict[str, str]) -> dict[str, str]:
        for path, text in value.items():
            if not isinstance(text, str) or not text.strip():
                raise ValueError(f"{path}: a derived value is an arithmetic expression such as \"{{cluster.nodes}} * 64\"")
        return value

    # -- axes ---------------------------------------------------------------------------

    def axes(self) -> list[dict[str, list[Any]]]:
        """Axes of the product in order: one per ``vary`` key, then one per ``zip`` group."""
        return [{path: values} for path, values in self.vary.items()] + [dict(g) for g in self.zip]

    @property
    def varied_fields(self) -> list[str]:
        """Fields that change across points (vary, zip, derive), in column order."""
        return [p for axis in self.axes() for p in axis] + list(self.derive)

    def series_fields(self) -> list[str]:
        """Fields naming a scaling-curve line: ``series`` if given, else the first field of each
        axis that does not change the GPU count."""
        if self.series is not None:
            return list(self.series)
        out = []
        for axis in self.axes():
            first = next(iter(axis))
            if not GPU_COUNT_FIELDS & set(axis):
                out.append(first)
        return out

    @property
    def size(self) -> int:
        """Number of points: the product of the axis lengths."""
        n = 1
        for axis in self.axes():
            n *= len(next(iter(axis.values())))
        return n


@dataclass(frozen=True)
class SweepFile:
    """A loaded sweep file: its spec, where it lives, and the base scenario as a plain mapping."""

    spec: SweepSpec
    path: Path
    base_path: Path
    base: dict[str, Any]


def load_sweep(path: str | Path) -> SweepFile:
    """Read and validate a sweep file and its base scenario file (not yet the points)."""
    path = Path(path)
    root = load_mapping(path, "a sweep file (base, set, vary, zip, derive, series)")
    try:
        spec = SweepSpec.model_validate(to_plain(root))
    except ValidationError as exc:
        raise error_from_validation(exc, root=root, file=str(path), model=SweepSpec) from None
    _check_axes(spec, root, path)
    limits.check_sweep_points(spec.size, field="vary" if spec.vary else "zip", file=str(path),
                              line=line_of(root, ("vary",) if spec.vary else ("zip",)))
    base_path = (path.parent / spec.base).resolve() if not Path(spec.base).is_absolute() else Path(spec.base)
    base_root = load_yaml(base_path)
    if not isinstance(base_root, CommentedMap):
        raise ScenarioError("the base must be a scenario file (a mapping of sections)", field="base", file=str(path),
                            line=line_of(root, ("base",)))
    return SweepFile(spec, path, base_path, to_plain(base_root))


def _check_axes(spec: SweepSpec, root: Any, path: Path) -> None:
    """Cross-field rules: equal lengths inside a zip group, and no field in two places."""

    def fail(message: str, loc: tuple[Any, ...]) -> None:
        raise ScenarioError(message, field=dotted(loc), file=str(path), line=line_of(root, loc))

    seen: dict[str, str] = {}

    def claim(field: str, where: str, loc: tuple[Any, ...]) -> None:
        if field in seen:
            fail(f"{field} appears in both {seen[field]} and {where}", loc)
        seen[field] = where

    for field in spec.overrides:
        claim(field, "set", ("set", field))
    for field in spec.vary:
        claim(field, "vary", ("vary", field))
    for i, group in enumerate(spec.zip):
        if not group:
            fail("a zip group needs at least one field", ("zip", i))
        lengths = {field: len(values) for field, values in group.items()}
        if len(set(lengths.values())) != 1:
            detail = ", ".join(f"{f}: {n}" for f, n in lengths.items())
            fail(f"the lists of a zip group must have equal lengths ({detail})", ("zip", i))
        for field in group:
            _check_field(field, ("zip", i, field), fail)
            if not group[field]:
                fail("an axis needs at least one value", ("zip", i, field))
            claim(field, f"zip[{i}]", ("zip", i, field))
    for field in spec.derive:
        claim(field, "derive", ("derive", field))
    for field in spec.series or []:
        if field not in spec.varied_fields and field not in spec.overrides:
            fail(f"{field} is not a field this sweep varies ({', '.join(spec.varied_fields) or 'none'})", ("series",))


def _check_field(field: str, loc: tuple[Any, ...], fail: Any) -> None:
    try:
        _check_path(field)
    except ValueError as exc:
        fail(str(exc), loc)

