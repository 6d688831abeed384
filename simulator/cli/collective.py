"""``dtsim collective``: an nccl-tests-style table of one collective over every GPU of a cluster."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from simulator import units
from simulator.cli.common import cluster_spec, console, fail, guard, safe
from simulator.cluster.collective_algorithms import ALGORITHMS
from simulator.errors import ScenarioError

__all__ = ["collective"]


def _size(text: str, whole: str) -> float:
    try:
        size = units.parse_bytes(text)
    except units.UnitError as exc:
        raise ScenarioError(f"--sizes {whole!r}: {exc}") from None
    if size < 0:
        raise ScenarioError(f"--sizes {whole!r}: a size cannot be negative")
    return size


def _size_range(text: str) -> list[float]:
    if ":" not in text:
        return [_size(text, text)]
    lo, hi = (_size(x, text) for x in text.split(":", 1))
    if lo <= 0 or hi < lo:
        raise ScenarioError(f"--sizes {text!r}: need 0 < start <= end, e.g. 8B:16GiB")
    sizes, size = [], lo
    while size <= hi * (1 + 1e-9):
        sizes.append(size)
        size *= 2
    return sizes


def collective(
    node: Annotated[str, typer.Option("--node", help="node type")],
    nodes: Annotated[int, typer.Option("--nodes", min=1)] = 1,
    op: Annotated[str, typer.Option("--op", help="all_reduce | all_gather | reduce_scatter | all_to_all | broadcast")] = "all_reduce",
    sizes: Annotated[str, typer.Option("--sizes", help="START:END, doubling (nccl-tests -b/-e/-f 2)")] = "8B:16GiB",
    algorithm: Annotated[str | None, typer.Option("--algorithm", help=f"{' | '.join(ALGORITHMS)} (default: NCCL-like choice)")] = None,
    fabric: Annotated[str, typer.Option("--fabric")] = "fat-tree",
    gpus_per_node: Annotated[int | None, typer.Option("--gpus-per-node", min=1)] = None,
    network: Annotated[str, typer.Option("--network", help="flow | analytical")] = "flow",
) -> None:
    """nccl-tests-style table of one collective over every GPU of a cluster."""
    from simulator.cluster.collectives import OPS
    from simulator.costs.collectives import bus_bandwidth_factor
    from simulator.run import collective_choice, simulate_collective

    if op not in OPS or op == "p2p":
        fail(f"--op {op!r}: expected one of {', '.join(o for o in OPS if o != 'p2p')}")
    if algorithm is not None and algorithm not in ALGORITHMS:
        fail(f"--algorithm {algorithm!r}: expected one of {', '.join(ALGORITHMS)}")
    if network not in ("flow", "analytical"):
        fail(f"--network {network!r}: expected flow or analytical")
    size_list = guard(lambda: _size_range(sizes))
    cluster: dict[str, Any] = {"node": node, "nodes": nodes, "fabric": {"kind": fabric}}
    if gpus_per_node:
        cluster["gpus_per_node"] = gpus_per_node

    def table_rows() -> list[tuple[float, float, str]]:
        spec = cluster_spec(cluster)
        out = []
        for size in size_list:
            try:
                seconds = simulate_collective(spec, op, size, algorithm, network=network)
                how = collective_choice(spec, op, size, algorithm)
            except ValueError as exc:
                raise ScenarioError(f"--algorithm {algorithm}: {exc}") from None
            out.append((size, seconds, how))
        return out

    rows = guard(table_rows)
    world = nodes * (gpus_per_node or 0) or None
    table = Table(title=safe(f"{op} on {nodes} x {node} ({network} model)"), title_justify="left")
    for col in ("size", "time", "algbw", "busbw", "algorithm"):
        table.add_column(col, justify="left" if col == "algorithm" else "right")
    from simulator.scenario import ClusterSpec

    world = ClusterSpec.model_validate(cluster).world_size
    factor = bus_bandwidth_factor(op, world)
    for size, seconds, how in rows:
        algbw = size / seconds if seconds > 0 else 0.0
        table.add_row(units.format_size_for_table(size), f"{seconds * 1e6:,.1f} us", f"{algbw / 1e9:.2f} GB/s",
                      f"{algbw * factor / 1e9:.2f} GB/s", safe(how))
    console.print(table)
