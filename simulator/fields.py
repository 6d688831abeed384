"""Typed fields shared by the scenario and the catalog: the frozen base model and unit-carrying types.

Fields that hold a physical quantity accept a string with a unit (``"400Gbps"``, ``"80GiB"``,
``"2us"``); they are stored as SI floats. Files must write the unit: validated with
``context={UNITS_REQUIRED: True}`` (as every file loader does), a bare number such as
``nic_bandwidth: 400`` is an error ("400 has no unit; write e.g. '400 Gb/s'"), since nothing
says whether it meant bytes, bits, Gb/s or GB/s. Zero needs no unit. The Python API
(``Model.model_validate(data)`` without that context, or constructing models directly) also
accepts a plain number, taken in SI base units: bytes, bytes per second, seconds, FLOP/s.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, WithJsonSchema

from simulator import units

__all__ = [
    "Frozen",
    "quantity_of",
    "Elements",
    "NonNegativeElements",
    "Bytes",
    "Rate",
    "Seconds",
    "FlopRate",
    "PositiveBytes",
    "PositiveRate",
    "Precision",
    "PRECISIONS",
    "Fraction",
    "UNITS_REQUIRED",
]

Precision = Literal["fp32", "tf32", "fp16", "bf16", "fp8"]
PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "fp16", "bf16", "fp8")


class Frozen(BaseModel):
    """Base of every scenario and catalog model: closed (unknown keys are errors) and immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


UNITS_REQUIRED = "units_required"
"""Validation-context key: when true, a size, rate, time or FLOP rate without a unit is an error."""

_BARE_NUMBER = re.compile(r"^\s*[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?\s*$")


def _unitless(value: Any) -> bool:
    """A non-zero number, or a string holding only a number: a quantity whose unit is missing."""
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return value != 0
    return isinstance(value, str) and bool(_BARE_NUMBER.match(value)) and float(value) != 0


def _unit_field(parser: Callable[[Any], float], kind: str, example: str, suggested_unit: tuple[str, str]) -> Any:
    """Validator and schema of a quantity; ``suggested_unit``: the unit an error suggests for a
    small and for a large bare number."""
    def parse(value: Any, info: ValidationInfo) -> Any:
        if value is None:
            return None
        if (info.context or {}).get(UNITS_REQUIRED) and _unitless(value):
            number = str(value).strip()
            unit = suggested_unit[0] if abs(float(number)) < 1e5 else suggested_unit[1]
            raise ValueError(f"{number} has no unit; write e.g. '{number} {unit}'")
        return parser(value)

    schema = {
        "anyOf": [
            {"type": "string", "description": f"{kind} with a unit, e.g. {example}"},
            {"type": "number", "description": "0, or (Python API only) a number in SI base units"},
        ]
    }
    return BeforeValidator(parse), WithJsonSchema(schema)


_bytes = _unit_field(units.parse_bytes, "size", "'80GiB' (B = byte, b = bit)", ("GiB", "B"))
_rate = _unit_field(units.parse_rate, "rate", "'400Gbps' or '25GB/s' (b = bit, B = byte)", ("Gb/s", "B/s"))
_time = _unit_field(units.parse_time, "time", "'2us'", ("us", "s"))
_flop_rate = _unit_field(units.parse_flop_rate, "FLOP rate", "'312TFLOPS'", ("TFLOP/s", "FLOP/s"))

Bytes = Annotated[float, _bytes[0], _bytes[1], Field(ge=0)]
PositiveBytes = Annotated[float, _bytes[0], _bytes[1], Field(gt=0)]
Rate = Annotated[float, _rate[0], _rate[1], Field(gt=0)]
PositiveRate = Rate
Seconds = Annotated[float, _time[0], _time[1], Field(ge=0)]
FlopRate = Annotated[float, _flop_rate[0], _flop_rate[1], Field(gt=0)]
Fraction = Annotated[float, Field(gt=0, le=1)]



class _Count:
    """Marks a count of tensor elements (DeepSpeed's and Megatron's bucket sizes): not bytes."""


_ELEMENTS = _Count()
Elements = Annotated[int, _ELEMENTS, Field(gt=0)]
NonNegativeElements = Annotated[int, _ELEMENTS, Field(ge=0)]

# the quantity a unit-carrying field holds, by its validator (``quantity_of``)
_QUANTITY = {id(_bytes[0]): "size", id(_rate[0]): "rate", id(_time[0]): "time", id(_flop_rate[0]): "FLOP rate",
             id(_ELEMENTS): "elements"}


def quantity_of(metadata: list[Any]) -> str | None:
    """``size``, ``rate``, ``time``, ``FLOP rate`` or ``elements`` for a field declared with one
    of the unit types above (its pydantic ``FieldInfo.metadata``), else None."""
    return next((_QUANTITY[id(m)] for m in metadata if id(m) in _QUANTITY), None)
