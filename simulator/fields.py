"""Typed fields shared by the scenario and the catalog: the frozen base model and unit-carrying types.

Fields that hold a physical quantity accept a string with a unit (``"400Gbps"``, ``"80GiB"``,
``"2us"``); they are stored as SI floats. Files must write the unit: validated with
``context={UNITS_REQUIRED: True}`` (as every file loader does), a bare number such as
``nic_bandwidth: 400`` is an error ("400 has no unit; write e.g. '400 Gb/s'"), since nothing
says whether it meant bytes, bits, Gb/s or GB/s. Zero needs no unit. The Python API
(``Model.model_validate(data)`` without that context, or constructing models directly) also
accepts a plain number, taken in SI base units: bytes, bytes per second, seconds, FLOP/s.

Every number is checked at this edge: no model accepts ``nan`` or ``inf`` (``allow_inf_nan``
off), a boolean is never taken for a number (``true`` is not a count of 1), and each kind of
quantity lies within bounds far outside any real machine (``QUANTITY_BOUNDS``: a rate below
1 kB/s is a missing unit, not a network), so a wrong number cannot turn into an ``inf``, ``nan``
or 0 figure further on.
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, WithJsonSchema, model_validator

from simulator import units

__all__ = [
    "Frozen",
    "quantity_of",
    "Elements",
    "NonNegativeElements",
    "Bytes",
    "Rate",
    "Seconds",
    "Duration",
    "FlopRate",
    "PositiveBytes",
    "PositiveRate",
    "Precision",
    "PRECISIONS",
    "Fraction",
    "QUANTITY_BOUNDS",
    "UNITS_REQUIRED",
]

Precision = Literal["fp32", "tf32", "fp16", "bf16", "fp8"]
PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "fp16", "bf16", "fp8")


class Frozen(BaseModel):
    """Base of every scenario and catalog model: closed (unknown keys are errors) and immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_boolean_numbers(cls, data: Any) -> Any:
        """``true``/``false`` where a number (or a list of numbers) is expected is an error,
        not 1/0 as pydantic's lax mode would take it: the boolean is swapped for a marker that
        fails the field's own validation, so the error names the field (``got true``)."""
        if not isinstance(data, dict):
            return data
        numeric = _numeric_fields(cls)
        out = None
        for key, value in data.items():
            if key not in numeric:
                continue
            if isinstance(value, bool):
                swapped: Any = _NotANumber(value)
            elif isinstance(value, list) and any(isinstance(v, bool) for v in value):
                swapped = [_NotANumber(v) if isinstance(v, bool) else v for v in value]
            else:
                continue
            out = dict(data) if out is None else out
            out[key] = swapped
        return data if out is None else out


class _NotANumber:
    """A boolean given where a number is expected; prints as the YAML spelling."""

    def __init__(self, value: bool) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "true" if self.value else "false"


_NUMERIC: dict[type, frozenset[str]] = {}


def _numeric_fields(model: type[BaseModel]) -> frozenset[str]:
    """Names and aliases of ``model``'s plain number fields (unit-carrying ones reject booleans
    in their own parser)."""
    found = _NUMERIC.get(model)
    if found is None:
        names: set[str] = set()
        for name, info in model.model_fields.items():
            if _wants_number(info.annotation) and quantity_of(info.metadata) in (None, "elements"):
                names.add(name)
                if info.alias:
                    names.add(info.alias)
        found = _NUMERIC[model] = frozenset(names)
    return found


def _wants_number(annotation: Any) -> bool:
    """Whether ``annotation`` takes an int or float (directly, in a union, or as list items)
    and never a bool."""
    if annotation is bool:
        return False
    if annotation in (int, float):
        return True
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _wants_number(args[0])
    if origin in (typing.Union, types.UnionType):
        return bool not in args and any(_wants_number(a) for a in args)
    if origin in (list, tuple) and args:
        return _wants_number(args[0])
    return False


# the range each kind of quantity may take (SI units): far outside any real device, so only
# a missing unit, a typo or a deliberate absurdity falls outside
QUANTITY_BOUNDS: dict[str, tuple[float, float, str]] = {
    "size": (0.0, 2.0**60, "at most 1 EiB"),
    "rate": (1e3, 1e18, "between 1 kB/s and 1 EB/s (a bare number is bytes per second: add a unit, e.g. '400Gbps')"),
    "time": (0.0, 3600.0, "between 0 and 1 hour"),
    "duration": (0.0, 1e12, "between 0 and 1e12 s (about 30,000 years)"),
    "FLOP rate": (1e6, 1e19, "between 1 MFLOP/s and 10 EFLOP/s (add a unit, e.g. '312TFLOPS')"),
}


_SI_UNIT = {"size": "B", "rate": "B/s", "time": "s", "duration": "s", "FLOP rate": "FLOP/s"}


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
    low, high, allowed = QUANTITY_BOUNDS[kind]

    def parse(value: Any, info: ValidationInfo) -> Any:
        if value is None:
            return None
        if (info.context or {}).get(UNITS_REQUIRED) and _unitless(value):
            bare = str(value).strip()
            unit = suggested_unit[0] if abs(float(bare)) < 1e5 else suggested_unit[1]
            raise ValueError(f"{bare} has no unit; write e.g. '{bare} {unit}'")
        number = parser(value)
        if not low <= number <= high and not (kind == "size" and number < 0):  # sizes: ge/gt say why
            shown = value if isinstance(value, str) else f"{number:g} {_SI_UNIT[kind]}"
            raise ValueError(f"{kind} {shown} is out of range: {allowed}")
        return number

    schema = {
        "anyOf": [
            {"type": "string", "description": f"{kind} with a unit, e.g. {example}"},
            {"type": "number", "minimum": low, "maximum": high,
             "description": "(Python API only) a number in SI base units; files write the unit (0 needs none)"},
        ]
    }
    return BeforeValidator(parse), WithJsonSchema(schema)


_bytes = _unit_field(units.parse_bytes, "size", "'80GiB' (B = byte, b = bit)", ("GiB", "B"))
_rate = _unit_field(units.parse_rate, "rate", "'400Gbps' or '25GB/s' (b = bit, B = byte)", ("Gb/s", "B/s"))
_time = _unit_field(units.parse_time, "time", "'2us'", ("us", "s"))
# a span of wall-clock time (restarts, mean times between failures): seconds up to years
_duration = _unit_field(units.parse_time, "duration", "'10min' or '79230h'", ("h", "s"))
_flop_rate = _unit_field(units.parse_flop_rate, "FLOP rate", "'312TFLOPS'", ("TFLOP/s", "FLOP/s"))

Bytes = Annotated[float, _bytes[0], _bytes[1], Field(ge=0)]
PositiveBytes = Annotated[float, _bytes[0], _bytes[1], Field(gt=0)]
Rate = Annotated[float, _rate[0], _rate[1], Field(gt=0)]
PositiveRate = Rate
Seconds = Annotated[float, _time[0], _time[1], Field(ge=0)]
Duration = Annotated[float, _duration[0], _duration[1], Field(ge=0)]
FlopRate = Annotated[float, _flop_rate[0], _flop_rate[1], Field(gt=0)]
# a fraction of a rate (efficiencies): at least 1e-6, so no efficiency turns a rate into a 1e300 s step
Fraction = Annotated[float, Field(ge=1e-6, le=1)]



class _Count:
    """Marks a count of tensor elements (DeepSpeed's and Megatron's bucket sizes): not bytes."""


_ELEMENTS = _Count()
Elements = Annotated[int, _ELEMENTS, Field(gt=0)]
NonNegativeElements = Annotated[int, _ELEMENTS, Field(ge=0)]

# the quantity a unit-carrying field holds, by its validator (``quantity_of``)
_QUANTITY = {id(_bytes[0]): "size", id(_rate[0]): "rate", id(_time[0]): "time", id(_duration[0]): "duration",
             id(_flop_rate[0]): "FLOP rate", id(_ELEMENTS): "elements"}


def quantity_of(metadata: list[Any]) -> str | None:
    """``size``, ``rate``, ``time``, ``duration``, ``FLOP rate`` or ``elements`` for a field declared with one
    of the unit types above (its pydantic ``FieldInfo.metadata``), else None."""
    return next((_QUANTITY[id(m)] for m in metadata if id(m) in _QUANTITY), None)
