"""The sweep cache: one JSON file per finished point, written atomically.

The parent writes every finished point to ``OUT/cache/<key>.json`` at once, atomically (a
temporary file, then :func:`os.replace`), where ``key`` hashes the scenario's content hash,
the simulator version and the fingerprint of its code and data
(:func:`~simulator.sweep.worker.point_key`). A later run with the same output folder reads
those entries instead of simulating, so an interrupted sweep resumes where it stopped and
loses nothing.

Every entry, and every answer a worker sends back, is validated against
:class:`PointOutcome` (:class:`CacheEntry` adds the key and version): metrics a flat mapping
of scalars holding at least ``step_time_s`` and ``tokens_per_s`` (finite, non-negative) and
``oom`` (a boolean), or none and an error. An entry that is unreadable, foreign (another key
inside) or of another shape counts as missing, so its point is simulated again and
overwrites it; it never reaches ``results.csv``. Metrics keep the order the worker gave
them (no key sorting), so a row reads the same from the cache as fresh.
"""

from __future__ import annotations

import math
import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)

from simulator import __version__

__all__ = ["ResultCache", "atomic_write_text", "PointOutcome", "CacheEntry", "outcome_problem"]

Metric = StrictBool | StrictInt | StrictFloat | StrictStr

_REQUIRED_NUMBERS = ("step_time_s", "tokens_per_s")


class PointOutcome(BaseModel):
    """What one point comes back as: its metrics (None when it has none) and its error (None
    when it ran and fits). At least one of the two is set."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    metrics: dict[str, Metric] | None
    error: StrictStr | None

    @model_validator(mode="after")
    def _consistent(self) -> PointOutcome:
        if self.metrics is None:
            if self.error is None:
                raise ValueError("neither metrics nor an error")
            return self
        for name in _REQUIRED_NUMBERS:
            value = self.metrics.get(name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value < 0:
                raise ValueError(f"metrics.{name} must be a finite non-negative number, not {value!r}")
        if not isinstance(self.metrics.get("oom"), bool):
            raise ValueError("metrics.oom must be true or false")
        return self


class CacheEntry(PointOutcome):
    """A cache file: the outcome, its key and the simulator version that wrote it."""

    key: StrictStr
    simulator_version: StrictStr


def outcome_problem(answer: Any) -> str | None:
    """None if ``answer`` is a valid :class:`PointOutcome` mapping, else what is wrong in one
    line (the first error pydantic reports)."""
    if not isinstance(answer, Mapping):
        return f"a {type(answer).__name__}, not a mapping of metrics and error"
    try:
        PointOutcome.model_validate(dict(answer))
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = [str(p) for p in first["loc"]]
        message = first["msg"].removeprefix("Value error, ")
        if len(loc) > 2 and loc[0] == "metrics":  # a metric of a type outside the union
            loc, message = loc[:2], f"must be a number, true/false or text, not {type(first['input']).__name__}"
        return f"{'.'.join(loc) + ': ' if loc else ''}{message}"
    return None


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the whole new one, never
    a part: a uniquely named temporary file in the same folder, flushed to disk, then
    :func:`os.replace` (atomic on POSIX and Windows)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8", newline="") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class ResultCache:
    """Finished points, one JSON file per key under ``folder``. Unreadable, foreign (a
    different key inside) or misshapen entries (not a :class:`CacheEntry`) count as missing."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    def _path(self, key: str) -> Path:
        return self.folder / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        try:
            entry = CacheEntry.model_validate_json(self._path(key).read_bytes())
        except (OSError, ValueError):  # pydantic's ValidationError is a ValueError
            return None
        if entry.key != key:
            return None
        return entry.model_dump()

    def put(self, key: str, outcome: Mapping[str, Any]) -> None:
        """Write ``outcome`` (a :class:`PointOutcome` mapping) under ``key``; metrics keep their order."""
        entry = CacheEntry(key=key, simulator_version=__version__, metrics=outcome.get("metrics"),
                           error=outcome.get("error"))
        atomic_write_text(self._path(key), entry.model_dump_json())
