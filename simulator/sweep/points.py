"""The points of a sweep: the product of its axes, each point's scenario built and validated.

Points are numbered in product order: the ``vary`` axes in file order (the first varies
slowest), then the ``zip`` groups; ``set`` applies first, then the point's values, then
``derive`` (:mod:`simulator.sweep.file`).

Expansion never aborts on a bad combination: a point whose scenario does not validate
(:class:`~simulator.errors.ScenarioError`, :class:`~simulator.errors.InfeasibleError`,
a derived value that cannot be computed) carries its one-line reason in ``error``. A
malformed sweep file itself raises :class:`~simulator.errors.ScenarioError` naming file,
line and field.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass
from typing import Any

from simulator.errors import ScenarioError
from simulator.scenario import Scenario, scenario_from_mapping
from simulator.sweep.expressions import ExpressionError, evaluate, references
from simulator.sweep.file import SweepFile

__all__ = ["SweepPoint", "expand_sweep", "set_path", "get_path"]


@dataclass(frozen=True)
class SweepPoint:
    """One point of a sweep: the values of the varied fields and the validated scenario, or why not."""

    index: int
    values: dict[str, Any]
    scenario: Scenario | None
    error: str | None = None


def expand_sweep(sweep: SweepFile) -> list[SweepPoint]:
    """All points of the sweep in product order, each validated (see the module docstring)."""
    spec = sweep.spec
    axes = spec.axes()
    columns = [list(zip(*axis.values(), strict=True)) for axis in axes]  # per axis: tuples of values
    points = []
    for index, combo in enumerate(itertools.product(*columns)):
        values: dict[str, Any] = {}
        for axis, chosen in zip(axes, combo, strict=True):
            values.update(zip(axis, chosen, strict=True))
        points.append(_point(sweep, index, values))
    return points


def _point(sweep: SweepFile, index: int, values: dict[str, Any]) -> SweepPoint:
    data = copy.deepcopy(sweep.base)
    for path, value in {**sweep.spec.overrides, **values}.items():
        set_path(data, path, value)
    all_values = dict(values)
    for path, text in sweep.spec.derive.items():
        try:
            known = {ref: get_path(data, ref) for ref in references(text)}
            value = evaluate(text, known)
        except (ExpressionError, KeyError) as exc:
            message = exc.args[0] if exc.args else str(exc)
            return SweepPoint(index, {**all_values, path: None}, None, f"derive.{path}: {message}")
        set_path(data, path, value)
        all_values[path] = value
    try:
        # no file: the reason belongs to the point (its row names it), not to a line of the base
        scenario = scenario_from_mapping(data, base_dir=sweep.base_path.parent, units_required=True)
    except ScenarioError as exc:
        return SweepPoint(index, all_values, None, str(exc))
    return SweepPoint(index, all_values, scenario)


def set_path(data: dict[str, Any], path: str, value: Any) -> None:
    """Set a dotted field path in a scenario mapping, creating sections; ``None`` removes the
    field (the scenario default applies). A model given as a preset name becomes
    ``{preset: name}`` when one of its fields is set (as ``--set model.seq_len=...``)."""
    keys = path.split(".")
    node = data
    for i, key in enumerate(keys[:-1]):
        child = node.get(key)
        if child is None:
            if value is None:
                return
            child = node[key] = {}
        elif isinstance(child, str) and i == 0 and key == "model":
            child = node[key] = {"preset": child}
        elif not isinstance(child, dict):
            raise ScenarioError(f"{'.'.join(keys[: i + 1])} is not a section", field=path)
        node = child
    if value is None:
        node.pop(keys[-1], None)
    else:
        node[keys[-1]] = value


def get_path(data: dict[str, Any], path: str) -> Any:
    """The value at a dotted path of a scenario mapping; KeyError with a message when absent."""
    node: Any = data
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            raise KeyError(f"{{{path}}} is not set in this point (only fields written in the base or the sweep "
                           "can be referenced)")
        node = node[key]
    return node
