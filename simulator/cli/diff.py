"""``dtsim diff A.json B.json``: what changed between two ``dtsim run --json`` results, and by how much.

Each row shows A, B, the change B - A and the relative change (B - A) / A. Exit code 0; 2 when
a file is not a result (one line naming the file and the field).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from simulator import units
from simulator.cli.common import console, guard, safe
from simulator.errors import ScenarioError

__all__ = ["diff", "load_result", "diff_rows"]

Row = tuple[str, float | None, float | None, Callable[[float], str]]


def diff(
    a: Annotated[Path, typer.Argument(help="the first result (dtsim run --json)")],
    b: Annotated[Path, typer.Argument(help="the second result")],
) -> None:
    """Compare two results written by dtsim run --json: step time, throughput, MFU, breakdown, memory."""
    ra, rb = guard(lambda: load_result(a)), guard(lambda: load_result(b))
    console.print(safe(f"A: {a} ({ra.name}, {_layout(ra)})"), highlight=False, soft_wrap=True)
    console.print(safe(f"B: {b} ({rb.name}, {_layout(rb)})"), highlight=False, soft_wrap=True)
    table = Table(title="B against A", title_justify="left")
    for col in ("metric", "A", "B", "change", "relative"):
        table.add_column(col, justify="left" if col == "metric" else "right", no_wrap=True)
    for label, va, vb, fmt in diff_rows(ra, rb):
        change = "-" if va is None or vb is None else _signed(fmt, vb - va)
        table.add_row(label, "-" if va is None else fmt(va), "-" if vb is None else fmt(vb), change,
                      relative_change(va, vb))
    fits = ["fits" if not r.oom else "OUT OF MEMORY" for r in (ra, rb)]
    table.add_row("fits", fits[0], fits[1], "same" if fits[0] == fits[1] else "changed", "")
    console.print(table)


def load_result(path: Path) -> Any:
    """The :class:`~simulator.results.Result` in ``path``; a located ScenarioError when it is not one."""
    from pydantic import ValidationError

    from simulator.results.result import Result
    from simulator.yamlio import error_from_validation

    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ScenarioError(f"not a JSON file ({exc}); expected a result written by dtsim run --json",
                            file=str(path)) from None
    if not isinstance(data, dict) or "step_time_s" not in data:
        raise ScenarioError("not a result written by dtsim run --json (no step_time_s)", file=str(path))
    try:
        return Result.model_validate(data)
    except ValidationError as exc:
        raise error_from_validation(exc, file=str(path)) from None


def relative_change(a: float | None, b: float | None) -> str:
    """``(b - a) / a`` as a signed percentage; ``-`` when undefined (a missing or zero)."""
    if a is None or b is None or a == 0:
        return "-" if a != b else "+0.0%"
    return f"{100 * (b - a) / a:+.1f}%"


def diff_rows(a: Any, b: Any) -> list[Row]:
    """(label, value in A, value in B, formatter) for every compared quantity; a value is None
    where that result has no such row (e.g. an exposed communication kind only one has)."""
    t, n, byte = units.format_time, _number, units.format_bytes
    rows: list[Row] = [
        ("GPUs", a.world_size, b.world_size, n),
        ("global batch (sequences)", a.global_batch, b.global_batch, n),
        ("step time", a.step_time_s, b.step_time_s, t),
        ("tokens/s", a.tokens_per_s, b.tokens_per_s, n),
        ("MFU", a.mfu, b.mfu, _percent),
        ("model TFLOP/s per GPU", a.tflops_per_gpu, b.tflops_per_gpu, _one),
        ("compute", a.breakdown.compute_s, b.breakdown.compute_s, t),
    ]
    for kind in sorted(set(a.breakdown.exposed_comm_s) | set(b.breakdown.exposed_comm_s)):
        rows.append((f"exposed {kind} comm", a.breakdown.exposed_comm_s.get(kind), b.breakdown.exposed_comm_s.get(kind), t))
    rows += [
        ("pipeline bubble", a.breakdown.bubble_s, b.breakdown.bubble_s, t),
        ("idle", a.breakdown.idle_s, b.breakdown.idle_s, t),
        ("peak memory", a.peak_memory_bytes, b.peak_memory_bytes, byte),
    ]
    for part in ("params", "grads", "optimizer", "activations", "buffers", "other"):
        key = f"{part}_bytes"
        rows.append((f"  {part}", getattr(_peak(a), key), getattr(_peak(b), key), byte))
    return rows


def _peak(result: Any) -> Any:
    return max(result.memory, key=lambda m: m.peak_bytes)


def _layout(r: Any) -> str:
    return f"{r.world_size} GPUs, tp {r.tp} x pp {r.pp} x cp {r.cp} x dp {r.dp}"


def _number(value: float) -> str:
    return f"{value:,.0f}"


def _one(value: float) -> str:
    return f"{value:,.1f}"


def _percent(value: float) -> str:
    return f"{100 * value:.1f}%"


def _signed(fmt: Callable[[float], str], value: float) -> str:
    """``value`` with its sign; a change of a fraction shown as a percentage is in points (pp)."""
    text = f"{100 * abs(value):.1f} pp" if fmt is _percent else fmt(abs(value))
    return ("+" if value > 0 else "-" if value < 0 else "") + text
