"""``dtsim sweep``: every point of a sweep file in parallel; results.csv, results.json, scaling.html."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from simulator.cli.common import console, err_console, guard
from simulator.cli.progress import sweep_progress

__all__ = ["sweep"]


def sweep(
    sweep_file: Annotated[Path, typer.Argument(help="sweep YAML file (base scenario + axes)")],
    executor: Annotated[str, typer.Option("--executor", help="local | serial | dask-local | dask://HOST:PORT | "
                                          "ray | ray://HOST:PORT")] = "local",
    out: Annotated[Path | None, typer.Option("--out", help="output folder (default: out/<sweep file name>)")] = None,
    workers: Annotated[int | None, typer.Option("--workers", min=1, help="worker processes (default: CPUs here)")] = None,
) -> None:
    """Simulate every point of a sweep in parallel; write results.csv, results.json and scaling.html.

    Finished points are cached in OUT/cache: run the same command again to resume an
    interrupted sweep. Infeasible and out-of-memory points are recorded with their reason.
    """
    from simulator.sweep import expand_sweep, load_sweep, open_executor, run_sweep, write_results

    loaded = guard(lambda: load_sweep(sweep_file))
    points = guard(lambda: expand_sweep(loaded))
    out_dir = out if out is not None else Path("out") / sweep_file.stem
    spec = loaded.spec
    invalid = sum(p.scenario is None for p in points)
    console.print(f"[bold]{spec.name or sweep_file.stem}[/]: {len(points)} points ({invalid} invalid), "
                  f"executor {executor}, results in {out_dir}")
    with sweep_progress() as (bar, update):
        task = bar.add_task("sweep", total=len(points))

        def run_all() -> Any:
            with open_executor(executor, workers) as pool:
                return run_sweep(points, out_dir, executor=pool, varied=spec.varied_fields,
                                 series=spec.series_fields(), progress=lambda p: update(task, p))

        try:
            result = guard(run_all)
        except KeyboardInterrupt:
            err_console.print(f"interrupted: finished points are kept in {out_dir / 'cache'}; run the same command "
                              "again to resume", highlight=False)
            raise typer.Exit(130) from None
    meta = {"sweep_file": str(sweep_file), "base": str(loaded.base_path), "name": spec.name,
            "executor": executor, "wall_s": result.wall_s}
    paths = write_results(result, out_dir, meta=meta)
    html = out_dir / "scaling.html"
    _write_scaling_html(_drawable_rows(result.rows), html, title=spec.name or sweep_file.stem,
                        by_series=bool(spec.series_fields()))
    console.print(f"{len(points)} points: {result.simulated} simulated, {result.cached} from cache, "
                  f"{result.failed} infeasible or failed, {result.wall_s:.1f} s")
    for path in (*paths, html):
        console.print(f"  {path}")


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
