"""``dtsim sweep``: every point of a sweep file in parallel; results.csv, results.json, scaling.html.

Exit codes: 0 when at least one point has a result (the invalid ones are counted and their
reasons summarised); 2 for a bad sweep file or executor, or when no point has a result
because every point is invalid (the reason printed, or a count of each reason when they
differ); 1 when no point has a result and some failed inside dtsim (a bug, a lost worker).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from simulator.cli.common import check_output_dir, console, err_console, guard, safe
from simulator.cli.progress import sweep_progress

__all__ = ["sweep"]

_REASONS_SHOWN = 5  # distinct reasons printed; the rest are counted
_ROWS_SHOWN = 40  # points in the results table; the rest are in results.csv


def sweep(
    sweep_file: Annotated[Path, typer.Argument(help="sweep YAML file (base scenario + axes)")],
    executor: Annotated[str, typer.Option("--executor", help="local | serial | dask-local | dask://HOST:PORT | "
                                          "ray | ray://HOST:PORT")] = "local",
    out: Annotated[Path | None, typer.Option("--out", help="output folder (default: out/<sweep file name>)")] = None,
    workers: Annotated[int | None, typer.Option("--workers", min=1, help="worker processes (default and most: the "
                                                "CPUs here; no more than the points to run)")] = None,
) -> None:
    """Simulate every point of a sweep in parallel; write results.csv, results.json and scaling.html.

    Finished points are cached in OUT/cache: run the same command again to resume an
    interrupted sweep. Infeasible and out-of-memory points are recorded with their reason.
    """
    from simulator.sweep import (
        bound_workers,
        check_executor,
        expand_sweep,
        invalid_reasons,
        load_sweep,
        open_executor,
        run_sweep,
        write_results,
    )
    from simulator.sweep.runner import INTERNAL_PREFIX

    guard(lambda: check_executor(executor))
    out_dir = out if out is not None else Path("out") / sweep_file.stem
    check_output_dir(out_dir, "--out", inside=("cache",))
    loaded = guard(lambda: load_sweep(sweep_file))
    points = guard(lambda: expand_sweep(loaded))
    spec = loaded.spec
    invalid = sum(p.scenario is None for p in points)
    if points and invalid == len(points):  # nothing to run: say why, start no worker
        _no_result([{"fits": None, "error": p.error} for p in points], code=2)
    n_workers, capped = guard(lambda: bound_workers(workers, len(points) - invalid))
    console.print(f"[bold]{safe(spec.name or sweep_file.stem)}[/]: {len(points)} points ({invalid} invalid), "
                  f"executor {safe(executor)}, results in {safe(out_dir)}", highlight=False)
    if capped and executor in ("local", "dask-local", "ray"):  # the executors that start processes here
        console.print(capped, highlight=False)

    def run_all() -> Any:
        # the executor first: one that cannot open (an unreachable scheduler) fails before any bar is drawn
        with open_executor(executor, n_workers) as pool, sweep_progress() as (bar, update):
            task = bar.add_task("sweep", total=len(points))
            return run_sweep(points, out_dir, executor=pool, varied=spec.varied_fields,
                             series=spec.series_fields(), progress=lambda p: update(task, p))

    try:
        result = guard(run_all)
    except KeyboardInterrupt:
        err_console.print(f"interrupted: finished points are kept in {safe(out_dir / 'cache')}; run the same command "
                          "again to resume", highlight=False)
        raise typer.Exit(130) from None
    meta = {"sweep_file": str(sweep_file), "base": str(loaded.base_path), "name": spec.name,
            "executor": executor, "wall_s": result.wall_s}
    paths = write_results(result, out_dir, meta=meta)
    html = out_dir / "scaling.html"
    _write_scaling_html(_drawable_rows(result.rows), html, title=spec.name or sweep_file.stem,
                        by_series=bool(spec.series_fields()))
    _print_table(result.rows, result.varied, out_dir / "results.csv")
    console.print(f"{len(points)} points: {result.simulated} simulated, {result.cached} from cache, "
                  f"{result.failed} infeasible or failed, {result.wall_s:.1f} s")
    for path in (*paths, html):
        console.print(f"  {safe(path)}", highlight=False)
    reasons = invalid_reasons(result.rows)
    if reasons and sum(n for _, n in reasons) == len(result.rows):
        internal = any(reason.startswith(INTERNAL_PREFIX) for reason, _ in reasons)
        _no_result(result.rows, code=1 if internal else 2)
    if reasons:
        _print_reasons(f"{sum(n for _, n in reasons)} of {len(points)} points have no result:", reasons)


def _print_table(rows: list[dict[str, Any]], varied: list[str], csv_path: Path) -> None:
    """The points in sweep order: varied fields, fits, step time, MFU, tokens/s (at most
    ``_ROWS_SHOWN``; a note points to results.csv for the rest)."""
    from rich.table import Table

    from simulator import units

    table = Table(title="results", title_justify="left")
    table.add_column("#", justify="right", no_wrap=True)
    short = [name.rsplit(".", 1)[-1] for name in varied]
    for name, label in zip(varied, short, strict=True):  # the last segment, unless two fields share it
        table.add_column(safe(label if short.count(label) == 1 else name), justify="right", no_wrap=True)
    for col in ("fits", "step", "MFU", "tokens/s"):
        table.add_column(col, justify="right", no_wrap=True)
    for row in rows[:_ROWS_SHOWN]:
        fits = row.get("fits")
        verdict = "-" if fits is None else "yes" if fits else "[bold red]OOM[/]"
        has = row.get("step_time_s") is not None
        table.add_row(str(row["point"]), *(safe("default" if row.get(n) is None else row[n]) for n in varied), verdict,
                      units.format_time(row["step_time_s"]) if has else "-",
                      f"{100 * row['mfu']:.1f}%" if has and row.get("mfu") is not None else "-",
                      f"{row['tokens_per_s']:,.0f}" if has and row.get("tokens_per_s") is not None else "-")
    console.print(table)
    if len(rows) > _ROWS_SHOWN:
        console.print(f"  {len(rows) - _ROWS_SHOWN} more points in {safe(csv_path)}", highlight=False)
    if any(row.get("fits") is False for row in rows):
        console.print("  OOM: out of memory; its step time and MFU are not achievable", highlight=False)


def _no_result(rows: list[Any], *, code: int) -> None:
    """Say why no point has a result and exit with ``code``: the one reason, or each with its count."""
    from simulator.sweep import invalid_reasons

    reasons = invalid_reasons(rows)
    what = "every point of the sweep is invalid" if code == 2 else "no point of the sweep has a result"
    if len(reasons) == 1:
        err_console.print(f"[bold red]error:[/] {what}: {safe(reasons[0][0])}", highlight=False,
                          soft_wrap=True)
    else:
        _print_reasons(f"error: {what}, for {len(reasons)} different reasons:", reasons)
    raise typer.Exit(code)


def _print_reasons(title: str, reasons: list[tuple[str, int]]) -> None:
    err_console.print(safe(title), highlight=False, soft_wrap=True)
    for reason, count in reasons[:_REASONS_SHOWN]:
        err_console.print(f"  {count} point{'s' if count != 1 else ''}: {safe(reason)}",
                          highlight=False, soft_wrap=True)
    if len(reasons) > _REASONS_SHOWN:
        rest = reasons[_REASONS_SHOWN:]
        err_console.print(f"  ... {len(rest)} more reasons ({sum(n for _, n in rest)} points): see results.csv",
                          highlight=False)



def _drawable_rows(rows: list[Any]) -> list[Any]:
    """Feasible rows, and out-of-memory rows (the figure leaves them out and counts them in a note)."""
    from simulator.sweep.worker import OOM_PREFIX

    return [r for r in rows if r.get("error") is None or str(r.get("error")).startswith(OOM_PREFIX)]


def _write_scaling_html(rows: list[Any], path: Path, *, title: str, by_series: bool) -> None:
    from simulator.viz.scaling import scaling_figure

    fig = scaling_figure(rows, gpus_key="world_size", throughput_key="tokens_per_s",
                         series_key="series" if by_series else None, title=title)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(str(path), include_plotlyjs=True, full_html=True)
