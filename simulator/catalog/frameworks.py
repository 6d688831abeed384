"""Framework profiles: the YAML format of ``topologies/frameworks/<name>.yaml``.

A profile holds the defaults one training framework really has, for fields of the
scenario that exist today, each with the place in the framework's code or documentation
it was read from (``source``). What the framework does that dtsim does not model yet is
listed under ``not_modelled``, also cited, so users see it; it changes nothing.

The settings are keyed by dotted scenario paths (``parallelism.ddp.overlap``); applying a
profile to a scenario is :func:`simulator.scenario.framework.apply_framework`.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from simulator.fields import Frozen

__all__ = ["FrameworkSetting", "NotModelled", "FrameworkProfile", "SETTING_SECTIONS"]

# the scenario sections a profile may set: how the job is run, never what is trained or on what
SETTING_SECTIONS = ("parallelism", "training", "sim")


class FrameworkSetting(Frozen):
    """One default of a framework: its value in the scenario's terms and where it was read."""

    value: Any = Field(description="the value, written as in a scenario file")
    source: str = Field(min_length=1, description="file path and commit, or documentation URL, it was read from")
    note: str | None = Field(None, description="how the framework's own setting maps onto this field")


class NotModelled(Frozen):
    """Behaviour of the framework that dtsim does not model (listed, never faked with another knob)."""

    what: str = Field(min_length=1)
    source: str = Field(min_length=1)


class FrameworkProfile(Frozen):
    """The defaults of one framework (``topologies/frameworks/<name>.yaml``)."""

    name: str
    description: str = Field(min_length=1, description="which framework, which version or recipe")
    settings: dict[str, FrameworkSetting] = Field(default_factory=dict)
    not_modelled: list[NotModelled] = Field(default_factory=list)

    @field_validator("settings")
    @classmethod
    def _paths(cls, value: dict[str, FrameworkSetting]) -> dict[str, FrameworkSetting]:
        for path in value:
            parts = path.split(".")
            if len(parts) < 2 or parts[0] not in SETTING_SECTIONS or not all(parts):
                raise ValueError(f"setting {path!r}: a dotted path inside one of {', '.join(SETTING_SECTIONS)}")
        return value

    def path_values(self) -> dict[tuple[str, ...], Any]:
        """``{("parallelism", "ddp", "overlap"): False, ...}``."""
        return {tuple(path.split(".")): setting.value for path, setting in self.settings.items()}
