"""``dtsim fit`` (and ``dtsim run --memory-only``): does a scenario fit in GPU memory, and what
fills it, from the memory pre-estimate the search prunes with
(:func:`~simulator.workload.memory_estimate.estimate_stage_memory`): no simulation, milliseconds
at any size.

The estimate is a lower one (it leaves out transient buffers whose size depends on timing), so
"does not fit" is certain and "fits" is confirmed by ``dtsim run``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table

from simulator import units
from simulator.cli.common import console, guard, print_table, safe

__all__ = ["fit", "print_fit"]

_STAGES_SHOWN = 16  # pipeline stages listed one per row; the fullest is always among them


def fit(
    scenario: Annotated[Path, typer.Argument(help="scenario YAML file")],
    set_: Annotated[list[str] | None, typer.Option("--set", help="override a field: KEY.PATH=VALUE (repeatable)")] = None,
) -> None:
    """Does SCENARIO fit in GPU memory, and what fills it? A memory estimate, no simulation (well under a second).

    Exit code 0 whether it fits or not; 2 for a bad scenario. Same as dtsim run --memory-only.
    """
    import simulator

    sc = guard(lambda: simulator.load_scenario(scenario, overrides=list(set_ or [])))
    print_fit(sc)


def _row(e: Any) -> list[str]:
    return [units.format_bytes(v) for v in (e.params_bytes, e.grads_bytes, e.optimizer_bytes, e.activations_bytes,
                                            e.buffers_bytes - e.context_bytes, e.context_bytes, e.peak_bytes)]


def print_fit(sc: Any) -> None:
    """Print the verdict and the per-GPU breakdown (one row per pipeline stage when pp > 1)."""
    from simulator.workload.memory_estimate import estimate_stage_memory

    stages = guard(lambda: estimate_stage_memory(sc))
    worst = max(stages, key=lambda e: e.peak_bytes)
    cluster, par = sc.cluster, sc.parallelism
    console.print(safe(f"{sc.model.label} on {cluster.n_nodes} x {cluster.node_type.name} "
                       f"({cluster.world_size} x {cluster.gpu_name}), tp {par.tp} x pp {par.pp} x cp {par.cp}, "
                       f"sharding {par.sharding}, micro-batch {sc.training.micro_batch}, recompute "
                       f"{sc.training.recompute}"), highlight=False, soft_wrap=True)
    peak, capacity = units.format_bytes(worst.peak_bytes), units.format_bytes(worst.capacity_bytes)
    where = f" (stage {worst.stage})" if par.pp > 1 else ""
    if worst.fits:
        console.print(f"[bold green]fits[/]: at least {peak} of {capacity} per GPU{where}, "
                      f"{units.format_bytes(worst.headroom_bytes)} free by this estimate", highlight=False)
        console.print("  a lower estimate (transient communication buffers and prefetched parameters are not "
                      "counted): dtsim run confirms", highlight=False, soft_wrap=True)
    else:
        console.print(f"[bold red]DOES NOT FIT[/]: at least {peak} of {capacity} per GPU{where}, "
                      f"{units.format_bytes(-worst.headroom_bytes)} over", highlight=False)
    table = Table(title="per-GPU memory at the first backward (estimate)", title_justify="left", box=box.SIMPLE_HEAD,
                  show_edge=False, pad_edge=False)
    header = ["stage"] if par.pp > 1 else []
    for col in (*header, "params", "grads", "optimizer", "activations", "buffers", "other", "total"):
        table.add_column(col, justify="right", no_wrap=True)
    shown = list(stages)
    if len(shown) > _STAGES_SHOWN:  # the first stages, and the fullest if it is further on
        shown = shown[: _STAGES_SHOWN - 1] + ([worst] if worst.stage >= _STAGES_SHOWN - 1 else [shown[_STAGES_SHOWN - 1]])
    for e in shown:
        table.add_row(*([str(e.stage)] if par.pp > 1 else []), *_row(e),
                      style="bold" if e is worst and par.pp > 1 else None)
    print_table(table)
    if len(stages) > len(shown):
        console.print(f"  {len(stages) - len(shown)} more stages not shown (the fullest is)", highlight=False)
    console.print("  buffers: the sharding strategy's static buffers; other: the CUDA context and DeepEP's buffers; activations: "
                  "micro-batches in flight + one layer's backward workspace", style="dim", highlight=False,
                  soft_wrap=True)
