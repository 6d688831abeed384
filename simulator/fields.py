"""Typed fields shared by the scenario and the catalog: the frozen base model and unit-carrying types.

Fields that hold a physical quantity accept either a plain number in SI base units or a
string with a unit (``"400Gbps"``, ``"80GiB"``, ``"2us"``); they are stored as SI floats.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema

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
]

Precision = Literal["fp32", "tf32", "fp16", "bf16", "fp8"]
PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "fp16", "bf16", "fp8")


class Frozen(BaseModel):
    """Base of every scenario and catalog model: closed (unknown keys are errors) and immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def _unit_field(parser: Callable[[Any], float], kind: str, example: str) -> Any:
    def parse(value: Any) -> Any:
        if value is None:
            return None
        return parser(value)

    schema = {
        "anyOf": [
            {"type": "number"},
            {"type": "string", "description": f"{kind} with a unit, e.g. {example}"},
        ]
    }
    return BeforeValidator(parse), WithJsonSchema(schema)


_bytes = _unit_field(units.parse_bytes, "size", "'80GiB' (B = byte, b = bit)")
_rate = _unit_field(units.parse_rate, "rate", "'400Gbps' or '25GB/s' (b = bit, B = byte)")
_time = _unit_field(units.parse_time, "time", "'2us'")
_flop_rate = _unit_field(units.parse_flop_rate, "FLOP rate", "'312TFLOPS'")

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
