"""Scenario stage: the input format, its validation, and reference resolution.

``Scenario`` is validated, frozen and in SI units. Load one from YAML with
:func:`load_scenario` (``--set`` overrides, errors naming file, line and field) or from a
mapping with ``Scenario.model_validate``.
"""

from simulator.scenario.loader import apply_overrides, load_scenario, scenario_from_mapping
from simulator.scenario.presets import preset_names
from simulator.scenario.schema import scenario_json_schema
from simulator.scenario.spec import (
    ClusterSpec,
    FabricSpec,
    Fp8Spec,
    ModelSpec,
    ParallelismSpec,
    Scenario,
    SimSpec,
    TrainingSpec,
)

__all__ = [
    "Scenario",
    "ModelSpec",
    "ClusterSpec",
    "FabricSpec",
    "ParallelismSpec",
    "TrainingSpec",
    "Fp8Spec",
    "SimSpec",
    "load_scenario",
    "scenario_from_mapping",
    "apply_overrides",
    "preset_names",
    "scenario_json_schema",
]
