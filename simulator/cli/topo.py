"""``dtsim topo``: describe a cluster (GPUs, links by kind, injection and bisection bandwidth)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from simulator import units
from simulator.cli.common import cluster_spec, console, guard, printable, safe
from simulator.errors import ScenarioError

__all__ = ["topo"]


def topo(
    node: Annotated[str, typer.Argument(help="node type (e.g. p4d.24xlarge) or a node / cluster YAML file")],
    nodes: Annotated[int, typer.Option("--nodes", min=1, help="number of nodes")] = 1,
    fabric: Annotated[str, typer.Option("--fabric", help="fat-tree | rail-optimized | single-switch | torus")] = "fat-tree",
    oversubscription: Annotated[float | None, typer.Option("--oversubscription", min=1.0)] = None,
    dims: Annotated[str | None, typer.Option("--dims", help="torus fabric: nodes per dimension, e.g. 4x4")] = None,
) -> None:
    """Describe a cluster: GPUs, links by kind, per-GPU injection and bisection bandwidth."""
    from simulator.cluster import build_cluster
    from simulator.cluster.describe import summarize

    def build() -> Any:
        data: dict[str, Any]
        if node.endswith((".yaml", ".yml")) and _is_cluster_file(node):
            data = {"topology": node}
        else:
            fabric_data: dict[str, Any] = {"kind": fabric}
            if oversubscription is not None:
                fabric_data["oversubscription"] = oversubscription
            if dims is not None:
                fabric_data["dims"] = [int(d) for d in dims.lower().split("x") if d.strip().isdigit()]
            data = {"node": node, "nodes": nodes, "fabric": fabric_data}
        return build_cluster(cluster_spec(data))

    cluster = guard(build)
    summary = summarize(cluster)
    spec = cluster.node_type
    console.print(f"[bold]{safe(summary.description)}[/]")
    console.print(f"{summary.gpus} GPUs ({safe(cluster.gpu.full_name)}, {units.format_bytes(cluster.gpu.memory_bytes)}, "
                  f"{units.format_rate(cluster.gpu.memory_bandwidth_bytes_per_s)} HBM) on {summary.nodes} node(s); "
                  f"{summary.switches} switches; {len(cluster.links)} directed links")
    table = Table(title="links (one direction)", title_justify="left")
    for col in ("kind", "tier", "count", "bandwidth each", "total"):
        table.add_column(col, justify="right" if col in ("count", "bandwidth each", "total") else "left")
    for g in summary.links:
        table.add_row(safe(g.kind), safe(g.tier), str(g.count), units.format_rate(g.bandwidth_bytes_per_s),
                      units.format_rate(g.count * g.bandwidth_bytes_per_s))
    console.print(table)
    for line in summary.diagram:
        console.print(printable(line), highlight=False, markup=False)
    scale_up = "NeuronLink" if cluster.node_type.intra_node.kind == "torus" else "NVLink"
    console.print(f"per-GPU injection: {scale_up} {units.format_rate(summary.nvlink_per_gpu_bytes_per_s)}, "
                  f"PCIe {units.format_rate(summary.pcie_per_gpu_bytes_per_s)}, network "
                  f"{units.format_rate(summary.network_per_gpu_bytes_per_s)} "
                  f"({spec.nics.count} x {units.format_rate(spec.nics.bandwidth_bytes_per_s)} {safe(spec.nics.transport)} "
                  f"per node)")
    how = "max flow" if summary.bisection_exact else "estimate"
    console.print(f"bisection bandwidth: {units.format_rate(summary.bisection_bytes_per_s)} ({how}, one direction)")
    console.print(safe("sources: " + "; ".join(spec.sources)), style="dim", soft_wrap=True)


def _is_cluster_file(path: str) -> bool:
    from simulator.yamlio import load_yaml

    try:
        data = load_yaml(path)
    except ScenarioError:
        return False
    return isinstance(data, dict) and "nodes" in data
