"""``dtsim calibrate``: the command (typer + rich); registered on the app in :mod:`simulator.cli.application`.

Exit codes as for every command: 0 success, 2 a request that cannot run here (no PyTorch,
no such device, a dtype the device would emulate, a bad scenario) with one line saying why,
and 2 when the measurements are too noisy to keep
(:func:`~simulator.calibrate.timing.noise_problem`): the summary is printed, no profile is
written, unless ``--force``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from simulator import units
from simulator.cli.common import check_output_file, console, err_console, fail, safe
from simulator.errors import ScenarioError

__all__ = ["calibrate"]


class _Bar:
    """rich progress bar behind the runner's Progress protocol."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.task: Any = None

    def start(self, total: int) -> None:
        self.task = self.progress.add_task("calibrating", total=total)

    def step(self, label: str) -> None:
        self.progress.update(self.task, advance=1, description=label)


def calibrate(
    device: Annotated[str, typer.Option("--device", help="auto | cpu | cuda | cuda:N")] = "auto",
    dtype: Annotated[str | None, typer.Option("--dtype", help="fp32 | bf16 | fp16 (default: bf16 on GPUs that "
                                              "have it, else fp32)")] = None,
    scenario: Annotated[Path | None, typer.Option("--scenario", help="measure this scenario's model shapes "
                                                  "(QKV, projection, MLP GEMMs and attention at its micro-batch "
                                                  "and sequence length)")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="smaller block and sweeps (seconds on a CPU)")] = False,
    out: Annotated[Path | None, typer.Option("--out", help="profile YAML to write (default: <gpu>-<dtype>.yaml, "
                                             "cpu-<dtype>.yaml on a CPU)")] = None,
    comm: Annotated[int | None, typer.Option("--comm", min=2, help="also time all-reduce / all-gather / "
                                             "reduce-scatter over N local processes (NCCL on N GPUs, gloo on "
                                             "the CPU) and fit alpha-beta")] = None,
    threads: Annotated[int | None, typer.Option("--threads", min=1, help="CPU intra-op threads (default: "
                                                "PyTorch's)")] = None,
    force: Annotated[bool, typer.Option("--force", help="write the profile even when its repeated timings are "
                                        "too noisy (median kernel spread above 10%, block above 20%)")] = False,
) -> None:
    """Measure this machine's device with PyTorch kernels and write a compute profile.

    Use the profile with: dtsim run SCENARIO --set cluster.calibration=PROFILE
    """
    from simulator.calibrate import CalibrationError, CalibrationOptions, run_calibration, write_profile
    from simulator.calibrate.device import DTYPES, parse_device
    from simulator.calibrate.runner import default_out

    if dtype is not None and dtype not in DTYPES:
        fail(f"--dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    check_output_file(out, "--out")
    if scenario is not None and not scenario.is_file():
        fail(f"--scenario {scenario}: file not found")
    options = CalibrationOptions(device=device, dtype=dtype, scenario=scenario, quick=quick, comm_ranks=comm,
                                 threads=threads)
    try:
        parse_device(device)
        with Progress(TextColumn("{task.description:<48}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=err_console, transient=True) as bar:
            result = run_calibration(options, _Bar(bar))
    except (CalibrationError, ScenarioError) as exc:
        fail(str(exc))
        return
    _print_summary(result)
    for warning in result.warnings:
        err_console.print(f"[bold yellow]warning:[/] {safe(warning)}", highlight=False, soft_wrap=True)
    target = out or default_out(result.device, result.dtype)
    if result.noise is not None and not force:
        fail(f"not writing {target}: the timings are too noisy to trust ({result.noise}); calibrate again on an "
             "idle machine (or with fewer --threads), or pass --force to write it anyway")
    if result.noise is not None:
        result.profile["metadata"]["noise"]["forced"] = True
    path = write_profile(result.profile, target)
    other = "" if result.profile.get("gpu") else " --set cluster.calibration_other_device=true"
    console.print(f"profile written to [bold]{safe(str(path))}[/]; use it with: dtsim run SCENARIO --set "
                  f"cluster.calibration={safe(str(path))}{other}", soft_wrap=True)


def _curve_text(curve: dict[str, list[float]]) -> str:
    pairs = zip(curve["log10_flops"], curve["efficiency"], strict=True)
    return ", ".join(f"1e{x:.1f}: {e:.2f}" for x, e in pairs)


def _print_summary(result: Any) -> None:
    p = result.profile
    dtype = result.dtype
    table = Table(title=safe(f"calibration of {p['device']} ({dtype})"), show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    meta = p["metadata"]
    table.add_row("device", safe(f"{p['device']}; torch {meta['torch_version']}")
                  + (f", {meta['threads']} thread(s)" if meta.get("threads") else ""))
    table.add_row("peak", f"{p['peak_flops'][dtype]} ({meta['peak_flops_source']})")
    table.add_row("memory", f"{p['memory_bandwidth']} x efficiency {p['memory_efficiency']} "
                  f"({meta['memory_bandwidth_source']})")
    table.add_row("launch overhead", p["launch_overhead"])
    table.add_row("GEMM efficiency", _curve_text(p["gemm"][dtype]))
    table.add_row("attention fwd", _curve_text(p["attention_fwd"][dtype]))
    table.add_row("attention bwd", _curve_text(p["attention_bwd"][dtype]))
    loop = result.closed_loop
    table.add_row("closed loop", loop.block.describe())
    table.add_row("", f"measured {units.format_time(loop.measured.median_s)} (spread {100 * loop.measured.spread:.0f}%)"
                  f", simulator {units.format_time(loop.predicted_s)}: [bold]error {loop.error_pct:+.1f}%[/]")
    for op, fit in p.get("comm", {}).items():
        table.add_row(f"{op}", f"alpha {fit['alpha']}, bus bandwidth {fit.get('bus_bandwidth', '-')} "
                      f"({fit['ranks']} ranks, {fit['backend']})")
    console.print(table)
