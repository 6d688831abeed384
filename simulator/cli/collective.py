"""``dtsim collective``: one collective over every GPU of a cluster, in nccl-tests' own terms.

It takes nccl-tests' flags (``-b 8 -e 8G -f 2 -g 8 -d bfloat16 -o sum``, NVIDIA/nccl-tests
``src/common.cu`` at a0b82b22) and prints nccl-tests' table, so scripts that parse
``all_reduce_perf`` output parse it; ``--format csv|json`` for machines. ``NCCL_ALGO``,
``NCCL_PROTO`` and ``NCCL_NVLS_ENABLE`` (environment or ``--env``) narrow the simulated tuner
as they narrow NCCL's; an algorithm the topology cannot run is an error (exit 2).
"""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer

from simulator.cli.common import cluster_spec, err_console, fail, guard
from simulator.cluster.collective_algorithms import ALGORITHMS
from simulator.errors import ScenarioError

__all__ = ["collective"]

_FORMATS = ("nccl-tests", "csv", "json")


def collective(
    node: Annotated[str, typer.Option("--node", help="node type (e.g. p5.48xlarge)")],
    name: Annotated[str | None, typer.Argument(
        metavar="[COLLECTIVE]",
        help="all_reduce | all_gather | reduce_scatter | all_to_all | broadcast, or the nccl-tests binary "
             "(all_reduce_perf, alltoall_perf, ...); default all_reduce")] = None,
    nodes: Annotated[int, typer.Option("--nodes", min=1, help="number of nodes")] = 1,
    op: Annotated[str | None, typer.Option(
        "-o", "--op", help="reduction as in nccl-tests (sum | prod | max | min | avg | mulsum; default sum), or "
                           "the collective (dtsim's older use of --op)")] = None,
    minbytes: Annotated[str | None, typer.Option(
        "-b", "--minbytes", help="nccl-tests: smallest size; K, M, G are powers of 1024 (default 32M)")] = None,
    maxbytes: Annotated[str | None, typer.Option("-e", "--maxbytes", help="nccl-tests: largest size (default 32M)")]
        = None,
    stepfactor: Annotated[int | None, typer.Option("-f", "--stepfactor", min=1, help="nccl-tests: size factor")]
        = None,
    stepbytes: Annotated[str | None, typer.Option("-i", "--stepbytes", help="nccl-tests: size increment (if -f 1)")]
        = None,
    sizes: Annotated[str | None, typer.Option(
        "--sizes", help="START:END doubling, instead of -b/-e/-f (default 8:16G; 8B, 16GiB also read)")] = None,
    ngpus: Annotated[int | None, typer.Option(
        "-g", "--ngpus", min=1, help="nccl-tests: GPUs per process; dtsim runs one process per node, so this is "
                                     "the GPUs used on each node (default: all)")] = None,
    nthreads: Annotated[int, typer.Option("-t", "--nthreads", min=1, help="nccl-tests: threads per process "
                                                                          "(GPUs per node = -t x -g)")] = 1,
    datatype: Annotated[str, typer.Option("-d", "--datatype", help="nccl-tests type: float, half, bfloat16, "
                                                                   "int8, ... (sets the count column)")] = "float",
    root: Annotated[int, typer.Option("-r", "--root", help="nccl-tests: root rank (broadcast)")] = 0,
    iters: Annotated[int, typer.Option("-n", "--iters", help="nccl-tests: accepted; a simulation is "
                                                             "deterministic, one iteration is the average")] = 20,
    warmup_iters: Annotated[int, typer.Option("-w", "--warmup_iters", help="nccl-tests: accepted, no effect")] = 1,
    check: Annotated[int, typer.Option("-c", "--check", help="nccl-tests: accepted; no data is checked "
                                                             "(#wrong prints N/A)")] = 1,
    algorithm: Annotated[str | None, typer.Option(
        "--algorithm", help=f"force one: {' | '.join(ALGORITHMS)} (default: NCCL-like choice within NCCL_ALGO)")]
        = None,
    protocol: Annotated[str | None, typer.Option("--protocol", help="as NCCL_PROTO: LL | LL128 | Simple, or a list")]
        = None,
    env: Annotated[list[str] | None, typer.Option(
        "--env", help="NCCL_NAME=VALUE, repeatable; overrides the environment. Honoured: NCCL_ALGO, NCCL_PROTO, "
                      "NCCL_NVLS_ENABLE (NCCL's syntax, e.g. 'Ring,Tree', '^NVLS', 'allreduce:tree')")] = None,
    output_format: Annotated[str, typer.Option("--format", help="nccl-tests (table) | csv | json")] = "nccl-tests",
    fabric: Annotated[str, typer.Option("--fabric", help="fat-tree | rail-optimized | single-switch | torus")]
        = "fat-tree",
    gpus_per_node: Annotated[int | None, typer.Option("--gpus-per-node", min=1, help="same as -g")] = None,
    network: Annotated[str, typer.Option("--network", help="flow | analytical")] = "flow",
) -> None:
    """Simulate nccl-tests (all_reduce_perf and friends) on a cluster; prints nccl-tests' table.

    Example: dtsim collective all_reduce_perf --node p5.48xlarge --nodes 2 -b 8 -e 8G -f 2 -g 8
    """
    from simulator.cli.nccl_args import resolve_collective, resolve_sizes, resolve_tuning

    if output_format not in _FORMATS:
        fail(f"--format {output_format!r}: expected one of {', '.join(_FORMATS)}")
    if network not in ("flow", "analytical"):
        fail(f"--network {network!r}: expected flow or analytical")
    op_name, redop = guard(lambda: resolve_collective(name, op, datatype))
    size_list, lo, hi, step = guard(lambda: resolve_sizes(sizes, minbytes, maxbytes, stepbytes, stepfactor))
    knobs = guard(lambda: resolve_tuning(os.environ, env or [], algorithm, protocol, tuple(ALGORITHMS)))
    per_node = ngpus * nthreads if ngpus is not None else (nthreads if nthreads > 1 else None)
    if per_node is not None and gpus_per_node is not None and per_node != gpus_per_node:
        fail(f"-g/-t give {per_node} GPUs per node but --gpus-per-node {gpus_per_node}")
    per_node = per_node or gpus_per_node
    cluster: dict[str, Any] = {"node": node, "nodes": nodes, "fabric": {"kind": fabric}}
    if per_node:
        cluster["gpus_per_node"] = per_node
    spec = guard(lambda: cluster_spec(cluster))
    for warning in knobs.warnings:
        err_console.print(f"[yellow]note:[/] {warning}", highlight=False, soft_wrap=True)
    rows = guard(lambda: _simulate(spec, op_name, size_list, datatype, redop, root, knobs, network))
    _print(rows, spec, op_name, knobs, network, output_format,
           {"ngpus": spec.gpus_in_node, "nthreads": nthreads, "lo": lo, "hi": hi, "step": step,
            "iters": iters, "warmup": warmup_iters, "check": check})


def _simulate(spec: Any, op: str, size_list: list[int], dtype: str, redop: str, root: int, knobs: Any,
              network: str) -> list[Any]:
    from simulator.results.export.nccl_tests import DTYPE_BYTES, buffer_sizes, make_row
    from simulator.run import collective_choice, simulate_collective

    world = spec.world_size
    rows = []
    for size in size_list:
        nbytes, _ = buffer_sizes(op, size, DTYPE_BYTES[dtype], world)
        try:
            seconds = simulate_collective(spec, op, nbytes, knobs.algorithm, network=network, tuning=knobs.tuning)
            how = collective_choice(spec, op, nbytes, knobs.algorithm, tuning=knobs.tuning) if nbytes else "none/none"
        except ValueError as exc:
            raise ScenarioError(f"{op} of {nbytes} B on {spec.n_nodes} x {spec.node_type.name}: {exc}") from None
        rows.append(make_row(op, size, dtype, redop, root, world, seconds, how))
    return rows


def _choice_ranges(rows: list[Any]) -> str:
    """'ring/LL 8-32768 B, nvls/Simple 65536-17179869184 B': the tuner's pick by size."""
    parts: list[list[Any]] = []
    for r in rows:
        how = f"{r.algorithm}/{r.protocol}"
        if parts and parts[-1][0] == how:
            parts[-1][2] = r.size_bytes
        else:
            parts.append([how, r.size_bytes, r.size_bytes])
    return ", ".join(f"{how} {a} B" if a == b else f"{how} {a}-{b} B" for how, a, b in parts)


def _print(rows: list[Any], spec: Any, op: str, knobs: Any, network: str, output_format: str,
           cfg: dict[str, Any]) -> None:
    from simulator.results.export.nccl_tests import TEST_NAMES, format_csv, format_json, format_table
    from simulator.version import __version__

    test = TEST_NAMES[op]
    if output_format == "csv":
        typer.echo(format_csv(rows), nl=False)
        return
    setting = knobs.tuning.describe() or None
    if output_format == "json":
        config = {"simulator": f"dtsim {__version__}", "test": test, "node": spec.node_type.name,
                  "nodes": spec.n_nodes, "ngpus": cfg["ngpus"], "nranks": spec.world_size, "network_model": network,
                  "minimum_bytes": cfg["lo"], "maximum_bytes": cfg["hi"], "nccl_env": setting,
                  "algorithm": knobs.algorithm}
        typer.echo(format_json(rows, config), nl=False)
        return
    gpu = spec.gpu_name
    header = [f"dtsim {__version__}: simulated {test} on {spec.n_nodes} x {spec.node_type.name} "
              f"({spec.world_size} GPUs, {spec.gpus_in_node} per node), {network} network model; no GPU ran",
              f"Collective test starting: {test}",
              f"nThread {cfg['nthreads']} nGpus {cfg['ngpus'] // cfg['nthreads']} minBytes {cfg['lo']} "
              f"maxBytes {cfg['hi']} step: {cfg['step']} warmup iters: {cfg['warmup']} iters: {cfg['iters']} "
              "agg iters: 1 validation: 0 graph: 0 unalign: 0"]
    header += [f"knob: {note}" for note in knobs.notes]
    header.append(f"algorithm/protocol (dtsim's NCCL-like tuner): {_choice_ranges(rows)}")
    header += ["", "Using devices"]
    header += [f" Rank {r:2d} Group  0 Pid {r // spec.gpus_in_node:6d} on {f'node{r // spec.gpus_in_node}':>10} "
               f"device {r % spec.gpus_in_node:2d} [dtsim] {gpu}" for r in range(spec.world_size)]
    typer.echo(format_table(rows, header, test), nl=False)
