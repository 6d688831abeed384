"""Units: the only place a unit factor appears.

Inside the simulator every quantity is an SI float whose name carries its unit
(``nbytes``, ``latency_s``, ``bandwidth_bytes_per_s``, ``flops``). Human units are
parsed here, at the edges (scenario files, CLI flags), and formatted here for output.

The parser is small and **case-sensitive**, because the case carries meaning:

* ``b`` is a bit and ``B`` is a byte: ``"400Gbps"`` = 400e9 bit/s = 50e9 B/s, while
  ``"25GB/s"`` = 25e9 B/s.
* SI prefixes ``k M G T P E`` are powers of 1000; IEC prefixes ``Ki Mi Gi Ti Pi Ei`` are
  powers of 1024 (``"80GiB"`` = 80 * 2**30 bytes).
* times: ``ps ns us µs ms s min h``; FLOP counts ``FLOP``; FLOP rates ``FLOPS`` or ``FLOP/s``.

Plain numbers (int or float) are taken as already being in SI base units.
"""

from __future__ import annotations

import math
import re
from typing import Final

__all__ = [
    "BITS_PER_BYTE",
    "KiB",
    "MiB",
    "GiB",
    "TiB",
    "MICROSECOND",
    "MILLISECOND",
    "GIGA",
    "TERA",
    "UnitError",
    "parse_bytes",
    "parse_rate",
    "parse_count",
    "parse_time",
    "parse_flops",
    "parse_flop_rate",
    "parse_quantity",
    "quantity_pattern",
    "format_bytes",
    "format_rate",
    "format_time",
    "format_flop_rate",
    "format_size_for_table",
]

BITS_PER_BYTE: Final = 8
KiB: Final = 1024
MiB: Final = 1024**2
GiB: Final = 1024**3
TiB: Final = 1024**4
MICROSECOND: Final = 1e-6  # s (Chrome trace timestamps are microseconds)
MILLISECOND: Final = 1e-3  # s
GIGA: Final = 1e9
TERA: Final = 1e12

_SI: Final = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_IEC: Final = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50, "Ei": 2.0**60}
_SMALL: Final = {"m": 1e-3, "u": 1e-6, "µ": 1e-6, "n": 1e-9, "p": 1e-12}

# base unit -> (dimension, factor to SI base of that dimension)
_BYTE_UNITS: Final = {"B": 1.0, "b": 1.0 / BITS_PER_BYTE}
_RATE_UNITS: Final = {"B/s": 1.0, "Bps": 1.0, "b/s": 1.0 / BITS_PER_BYTE, "bps": 1.0 / BITS_PER_BYTE}
_TIME_UNITS: Final = {"s": 1.0, "min": 60.0, "h": 3600.0}
_FLOP_UNITS: Final = {"FLOP": 1.0}
_FLOP_RATE_UNITS: Final = {"FLOPS": 1.0, "FLOP/s": 1.0}

_NUMBER = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_QUANTITY_RE: Final = re.compile(rf"^\s*({_NUMBER})\s*([^\s\d].*?)?\s*$")

_EXAMPLES: Final = {
    "size": "'80GiB', '512MiB', '1.5TB' (B = byte, b = bit)",
    "rate": "'400Gbps', '25GB/s', '100Gb/s' (b = bit, B = byte)",
    "time": "'2us', '1.5ms', '30s'",
    "flops": "'1.2PFLOP', '6e18FLOP'",
    "flop rate": "'312TFLOPS', '989 TFLOP/s'",
}


class UnitError(ValueError):
    """A string could not be parsed as a quantity of the expected dimension."""


def _split(text: str, dimension: str) -> tuple[float, str]:
    match = _QUANTITY_RE.match(text)
    if not match:
        raise UnitError(f"cannot parse {text!r} as a {dimension}; examples: {_EXAMPLES[dimension]}")
    value = float(match.group(1))
    unit = match.group(2) or ""
    return value, unit


def _with_prefixes(
    value: float,
    unit: str,
    units: dict[str, float],
    dimension: str,
    text: str,
    *,
    small: bool = False,
    iec: bool = True,
) -> float:
    """Resolve ``<prefix><unit>`` against ``units``; prefixes are SI, IEC and (for time) sub-unit."""
    tables: list[dict[str, float]] = [_SI]
    if iec:
        tables.insert(0, _IEC)
    if small:
        tables.append(_SMALL)
    for base, base_factor in sorted(units.items(), key=lambda kv: -len(kv[0])):
        if not unit.endswith(base):
            continue
        prefix = unit[: len(unit) - len(base)]
        for table in tables:
            if prefix in table:
                result = value * table[prefix] * base_factor
                if not math.isfinite(result):
                    raise UnitError(f"{text!r} is not a finite {dimension}")
                return result
        hint = " (SI prefixes are k M G T P E, IEC prefixes are Ki Mi Gi Ti Pi Ei; case matters)"
        raise UnitError(f"unknown prefix {prefix!r} in {text!r}{hint}")
    raise UnitError(f"cannot parse {text!r} as a {dimension}; examples: {_EXAMPLES[dimension]}")


def _parse(
    text: str | float | int,
    units: dict[str, float],
    dimension: str,
    *,
    small: bool = False,
    iec: bool = True,
) -> float:
    if isinstance(text, bool):
        raise UnitError(f"expected a {dimension}, got a boolean")
    if isinstance(text, (int, float)):
        if not math.isfinite(float(text)):
            raise UnitError(f"{text!r} is not a finite {dimension}")
        return float(text)
    if not isinstance(text, str):
        raise UnitError(f"expected a {dimension} such as {_EXAMPLES[dimension]}, got {type(text).__name__}")
    value, unit = _split(text, dimension)
    if unit == "":
        return value
    return _with_prefixes(value, unit, units, dimension, text, small=small, iec=iec)


def parse_bytes(text: str | float | int) -> float:
    """Parse a size to bytes: ``"80GiB"`` -> 85899345920.0, ``"8Gb"`` -> 1e9."""
    return _parse(text, _BYTE_UNITS, "size")


def parse_rate(text: str | float | int) -> float:
    """Parse a data rate to bytes per second: ``"400Gbps"`` -> 5e10, ``"25GB/s"`` -> 2.5e10."""
    return _parse(text, _RATE_UNITS, "rate")


_COUNT_SUFFIX: Final = {"k": 1e3, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12, "P": 1e15}


def parse_count(text: str | float | int) -> float:
    """A count such as a token budget: ``"15T"`` -> 1.5e13, ``"405B"`` (billions) -> 4.05e11,
    ``"2e12"``, ``"1_000"``; positive and finite, else :class:`UnitError`."""
    raw = str(text).strip().replace("_", "").replace(",", "")
    factor = _COUNT_SUFFIX.get(raw[-1:], 1.0) if raw else 1.0
    number_text = raw[:-1] if raw[-1:] in _COUNT_SUFFIX else raw
    try:
        number = float(number_text) * factor
    except ValueError:
        raise UnitError(f"{text!r} is not a count (e.g. 15T, 405B, 2e12)") from None
    if not (math.isfinite(number) and number > 0):
        raise UnitError(f"{text!r}: a count must be positive and finite")
    return number


def parse_time(text: str | float | int) -> float:
    """Parse a duration to seconds: ``"2us"`` -> 2e-6, ``"1.5ms"`` -> 1.5e-3."""
    return _parse(text, _TIME_UNITS, "time", small=True, iec=False)


def parse_flops(text: str | float | int) -> float:
    """Parse a FLOP count: ``"1.2PFLOP"`` -> 1.2e15."""
    return _parse(text, _FLOP_UNITS, "flops", iec=False)


def parse_flop_rate(text: str | float | int) -> float:
    """Parse a FLOP rate to FLOP/s: ``"312TFLOPS"`` -> 3.12e14."""
    return _parse(text, _FLOP_RATE_UNITS, "flop rate", iec=False)


_PARSERS: Final = {
    "bytes": parse_bytes,
    "rate": parse_rate,
    "time": parse_time,
    "flops": parse_flops,
    "flop_rate": parse_flop_rate,
}


def parse_quantity(text: str | float | int, kind: str) -> float:
    """Parse ``text`` as a quantity of ``kind`` (bytes, rate, time, flops, flop_rate)."""
    return _PARSERS[kind](text)


# what each parser accepts: its base units and which prefix tables (small, IEC) apply
_DIMENSIONS: Final = {
    "size": (_BYTE_UNITS, False, True),
    "rate": (_RATE_UNITS, False, True),
    "time": (_TIME_UNITS, True, False),
    "flops": (_FLOP_UNITS, False, False),
    "flop rate": (_FLOP_RATE_UNITS, False, False),
}


def quantity_pattern(dimension: str) -> str:
    """A regular expression (Python and ECMA-262 alike) matching exactly the strings the parser of
    ``dimension`` (size, rate, time, flops, flop rate) reads: a number, then optionally one of its
    units with an accepted prefix (``"400Gbps"``, ``"80 GiB"``, ``"2us"``). For JSON Schema."""
    units, small, iec = _DIMENSIONS[dimension]
    tables = [*([_IEC] if iec else []), _SI, *([_SMALL] if small else [])]
    prefixes = sorted({p for table in tables for p in table if p}, key=lambda p: (-len(p), p))
    bases = sorted(units, key=lambda u: (-len(u), u))
    unit = f"(?:{'|'.join(prefixes)})?(?:{'|'.join(re.escape(u) for u in bases)})"
    return rf"^\s*{_NUMBER}\s*(?:{unit})?\s*$"


# ----------------------------------------------------------------------------------------
# formatting (for tables and plots)


def _format(value: float, unit: str, steps: list[tuple[float, str]], digits: int) -> str:
    magnitude = abs(value)
    for factor, prefix in steps:
        if magnitude >= factor:
            return f"{value / factor:.{digits}g} {prefix}{unit}"
    factor, prefix = steps[-1]
    return f"{value / factor:.{digits}g} {prefix}{unit}"


def format_bytes(nbytes: float, digits: int = 4) -> str:
    """Format bytes with IEC prefixes: 85899345920 -> '80 GiB'."""
    steps = [(2.0**50, "Pi"), (2.0**40, "Ti"), (2.0**30, "Gi"), (2.0**20, "Mi"), (2.0**10, "Ki"), (1.0, "")]
    return _format(nbytes, "B", steps, digits)


def format_size_for_table(nbytes: float) -> str:
    """Compact size like nccl-tests prints it: '8 B', '1 MiB', '16 GiB'."""
    return format_bytes(nbytes, digits=4)


def format_rate(bytes_per_s: float, digits: int = 4) -> str:
    """Format a rate in decimal GB/s style: 5e10 -> '50 GB/s'."""
    steps = [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, "")]
    return _format(bytes_per_s, "B/s", steps, digits)


def format_time(seconds: float, digits: int = 4) -> str:
    """Format seconds: 2.5e-6 -> '2.5 us'."""
    steps = [(1.0, ""), (1e-3, "m"), (1e-6, "u"), (1e-9, "n")]
    return _format(seconds, "s", steps, digits)


def format_flop_rate(flop_per_s: float, digits: int = 4) -> str:
    """Format FLOP/s: 3.12e14 -> '312 TFLOP/s'."""
    steps = [(1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1.0, "")]
    return _format(flop_per_s, "FLOP/s", steps, digits)
