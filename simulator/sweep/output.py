"""What a sweep writes: ``results.csv`` and ``results.json``.

``results.csv`` has one row per point, in point order: ``point``, the varied fields, the
metrics, ``series`` (the label of its scaling curve), ``scaling_efficiency`` and ``error``
(:attr:`~simulator.sweep.runner.SweepRun.columns`), led by ``fits``. ``results.json`` holds
the same rows, the counts of the run and the caller's ``meta``. :func:`invalid_reasons`
counts why points have no result (what ``dtsim sweep`` prints).
"""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from simulator import __version__
from simulator.sweep.cache import atomic_write_text
from simulator.sweep.runner import SweepRun

__all__ = ["results_csv", "write_results", "feasible_rows", "invalid_reasons"]


def _csv_cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return value


def results_csv(run: SweepRun) -> str:
    """The rows as CSV text (empty cells for missing values; floats at full precision)."""
    buffer = io.StringIO()
    columns = run.columns
    writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in run.rows:
        writer.writerow({c: _csv_cell(row.get(c)) for c in columns})
    return buffer.getvalue()


def write_results(run: SweepRun, out_dir: str | Path, *, meta: Mapping[str, Any] | None = None) -> list[Path]:
    """Write ``results.csv`` and ``results.json`` (rows plus ``meta``) atomically; returns the paths."""
    out = Path(out_dir)
    csv_path, json_path = out / "results.csv", out / "results.json"
    atomic_write_text(csv_path, results_csv(run))
    document = {
        "simulator_version": __version__,
        "points": len(run.rows),
        "simulated": run.simulated,
        "cached": run.cached,
        "failed": run.failed,
        "columns": run.columns,
        **dict(meta or {}),
        "rows": run.rows,
    }
    atomic_write_text(json_path, json.dumps(document, indent=1, default=str) + "\n")
    return [csv_path, json_path]


def feasible_rows(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Rows without an error (what the scaling figure draws)."""
    return [r for r in rows if r.get("error") is None]


def invalid_reasons(rows: Iterable[Mapping[str, Any]]) -> list[tuple[str, int]]:
    """Why points have no result: each distinct error of the rows without metrics (``fits``
    empty; out-of-memory rows have metrics and are not counted) with how many rows give it,
    most frequent first, ties in row order."""
    counts = Counter(str(r.get("error") or "invalid point") for r in rows if r.get("fits") is None)
    return counts.most_common()
