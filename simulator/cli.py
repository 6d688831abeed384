"""``dtsim``: the command line (typer + rich).

Exit codes: 0 success, 2 bad input (one line naming file, line and field), 1 a bug.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from simulator import units
from simulator.cli_calibrate import calibrate as calibrate_command
from simulator.cluster.collective_algorithms import ALGORITHMS
from simulator.errors import ScenarioError

__all__ = ["app", "main"]

app = typer.Typer(
    name="dtsim",
    help="Discrete-event simulator of distributed deep-learning training.\n\n"
    "Run a scenario:  dtsim run scenarios/quickstart.yaml --set parallelism.tp=2",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])


def _fail(message: str) -> None:
    from rich.markup import escape

    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def _guard(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except ScenarioError as exc:
        _fail(str(exc))


# ----------------------------------------------------------------------------------------
# run


@app.command()
def run(
    scenario: Annotated[Path, typer.Argument(help="scenario YAML file")],
    set_: Annotated[list[str] | None, typer.Option("--set", help="override a field: KEY.PATH=VALUE (repeatable)")] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="write the full result as JSON")] = None,
    trace: Annotated[Path | None, typer.Option("--trace", help="write a Chrome/Perfetto trace (.json or .json.gz)")] = None,
    trace_ranks: Annotated[str | None, typer.Option("--trace-ranks", help="ranks to trace, e.g. 0-7,1024")] = None,
    hta: Annotated[Path | None, typer.Option("--hta", help="write one Holistic Trace Analysis trace per rank "
                                             "(rank<R>.json.gz) into this directory; --trace-ranks selects")] = None,
    report: Annotated[Path | None, typer.Option("--report", help="write a self-contained HTML report")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no summary table")] = False,
) -> None:
    """Simulate one training iteration of SCENARIO and print a summary."""
    import simulator

    sc = _guard(lambda: simulator.load_scenario(scenario, overrides=list(set_ or [])))
    needs_series = report is not None or trace is not None  # link-load time series for counters and heatmap
    result = _guard(lambda: simulator.simulate(sc, record_series=needs_series))
    if not quiet:
        _print_summary(result, sc)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(result.model_dump_json(indent=2))
        console.print(f"result written to {json_path}")
    ranks = _guard(lambda: _parse_ranks(trace_ranks)) if trace_ranks else None
    if trace is not None:
        from simulator.results.trace import write_trace

        _guard(lambda: write_trace(result, trace, ranks=ranks))
        console.print(f"trace written to {trace} (open in https://ui.perfetto.dev or chrome://tracing)")
    if hta is not None:
        from simulator.results.trace import write_hta_traces

        paths = _guard(lambda: write_hta_traces(result, hta, ranks=ranks))
        console.print(f"{len(paths)} HTA trace(s) written to {hta} (hta.trace_analysis.TraceAnalysis(trace_dir=...))")
    if report is not None:
        from simulator.viz.report import write_report

        write_report(result, sc, report)
        console.print(f"report written to {report}")


def _parse_ranks(text: str) -> list[int]:
    ranks: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                a, b = part.split("-", 1)
                ranks += list(range(int(a), int(b) + 1))
            else:
                ranks.append(int(part))
        except ValueError:
            raise ScenarioError(f"--trace-ranks: cannot read {part!r}; use e.g. 0-7,1024") from None
    return ranks


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:5.1f}%" if whole > 0 else "-"


def _print_summary(result: Any, sc: Any) -> None:
    par = sc.parallelism
    title = f"{result.name}"
    table = Table(title=title, show_header=False, title_justify="left", min_width=72)
    table.add_column("metric", style="bold")
    table.add_column("value")
    cluster = sc.cluster
    table.add_row("cluster", f"{cluster.n_nodes} x {cluster.node_type.name} = {result.world_size} x "
                  f"{cluster.gpu_name} ({cluster.node_type.nics.transport if not cluster.fabric.transport else cluster.fabric.transport}, "
                  f"{cluster.fabric.kind})")
    layout = f"tp {par.tp} x pp {par.pp} x cp {par.cp} x dp {result.dp}, sharding {par.sharding}"
    if par.pp > 1:
        layout += f", {par.pipeline_schedule}" + (f" v={par.virtual_stages}" if par.virtual_stages > 1 else "")
    table.add_row("layout", layout)
    table.add_row("batch", f"micro-batch {sc.training.micro_batch} x {result.micro_batches} micro-batches x dp "
                  f"{result.dp} = {result.global_batch} sequences of {sc.model.seq_len} tokens, {sc.training.precision}, "
                  f"recompute {sc.training.recompute}")
    table.add_row("model", f"{sc.model.label}: {result.params / 1e9:.2f} B parameters")
    table.add_row("step time", f"[bold]{units.format_time(result.step_time_s)}[/]")
    table.add_row("throughput", f"{result.tokens_per_s:,.0f} tokens/s ({result.samples_per_s:,.1f} samples/s)")
    table.add_row("per GPU", f"{result.tflops_per_gpu:.1f} TFLOP/s model, {result.hardware_tflops_per_gpu:.1f} hardware; "
                  f"MFU [bold]{100 * result.mfu:.1f}%[/], HFU {100 * result.hfu:.1f}%")
    mem = max(result.memory, key=lambda m: m.peak_bytes)
    verdict = "[bold red]OUT OF MEMORY[/]" if result.oom else "[green]fits[/]"
    table.add_row("peak memory", f"{units.format_bytes(mem.peak_bytes)} of {units.format_bytes(mem.capacity_bytes)} "
                  f"(rank {mem.rank}) {verdict}")
    if result.oom_detail is not None:
        table.add_row("", result.oom_detail.message)
    table.add_row("", "params {} grads {} optimizer {} activations {} buffers {} other {}".format(
        *(units.format_bytes(v) for v in (mem.params_bytes, mem.grads_bytes, mem.optimizer_bytes,
                                           mem.activations_bytes, mem.buffers_bytes, mem.other_bytes))))
    b = result.breakdown
    step = result.step_time_s
    table.add_row("critical rank", f"rank {b.rank} (stage {b.stage})")
    table.add_row("  compute", f"{units.format_time(b.compute_s)}  {_pct(b.compute_s, step)}")
    for kind, value in b.exposed_comm_s.items():
        total = b.comm_s.get(kind, 0.0)
        table.add_row(f"  exposed {kind} comm", f"{units.format_time(value)}  {_pct(value, step)}"
                      f"  (in flight {units.format_time(total)})")
    if b.bubble_s > 0:
        table.add_row("  pipeline bubble", f"{units.format_time(b.bubble_s)}  {_pct(b.bubble_s, step)}")
    if b.idle_s > 0:
        table.add_row("  idle", f"{units.format_time(b.idle_s)}  {_pct(b.idle_s, step)}")
    for link in result.links[:3]:
        table.add_row("busy link", f"{link.label}: {100 * link.utilisation:.0f}% of {link.kind} capacity")
    table.add_row("calibration", result.calibration)
    table.add_row("engine", f"{result.engine['tasks']} tasks on {result.engine['simulated_ranks']} simulated ranks, "
                  f"{result.engine['network_entities']} transfers ({result.engine['network']} network, "
                  f"symmetry {result.engine['symmetry']})")
    console.print(table)


# ----------------------------------------------------------------------------------------
# sweep


@app.command()
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
    from simulator.executors import open_executor
    from simulator.sweep import feasible_rows, run_sweep, write_results
    from simulator.sweepfile import expand_sweep, load_sweep

    loaded = _guard(lambda: load_sweep(sweep_file))
    points = _guard(lambda: expand_sweep(loaded))
    out_dir = out if out is not None else Path("out") / sweep_file.stem
    spec = loaded.spec
    invalid = sum(p.scenario is None for p in points)
    console.print(f"[bold]{spec.name or sweep_file.stem}[/]: {len(points)} points ({invalid} invalid), "
                  f"executor {executor}, results in {out_dir}")
    with _sweep_progress() as (bar, update):
        task = bar.add_task("sweep", total=len(points))

        def run_all() -> Any:
            with open_executor(executor, workers) as pool:
                return run_sweep(points, out_dir, executor=pool, varied=spec.varied_fields,
                                 series=spec.series_fields(), progress=lambda p: update(task, p))

        try:
            result = _guard(run_all)
        except KeyboardInterrupt:
            err_console.print(f"interrupted: finished points are kept in {out_dir / 'cache'}; run the same command "
                              "again to resume", highlight=False)
            raise typer.Exit(130) from None
    meta = {"sweep_file": str(sweep_file), "base": str(loaded.base_path), "name": spec.name,
            "executor": executor, "wall_s": result.wall_s}
    paths = write_results(result, out_dir, meta=meta)
    html = out_dir / "scaling.html"
    _write_scaling_html(feasible_rows(result.rows), html, title=spec.name or sweep_file.stem,
                        by_series=bool(spec.series_fields()))
    console.print(f"{len(points)} points: {result.simulated} simulated, {result.cached} from cache, "
                  f"{result.failed} infeasible or failed, {result.wall_s:.1f} s")
    for path in (*paths, html):
        console.print(f"  {path}")


# ----------------------------------------------------------------------------------------
# search


@app.command()
def search(
    scenario: Annotated[Path, typer.Argument(help="scenario YAML file: the model, cluster and training options")],
    objective: Annotated[str, typer.Option("--objective", help="throughput | cost | time-to-train")] = "throughput",
    top: Annotated[int, typer.Option("--top", min=1, help="configurations to rank (simulated whole)")] = 5,
    tokens: Annotated[str | None, typer.Option("--tokens", help="training tokens for time and cost, e.g. 1.4T or "
                                               "2e12 (default: 20 per parameter, Hoffmann et al. 2022)")] = None,
    executor: Annotated[str, typer.Option("--executor", help="local | serial | dask-local | dask://HOST:PORT | "
                                          "ray | ray://HOST:PORT")] = "local",
    workers: Annotated[int | None, typer.Option("--workers", min=1, help="worker processes (default: CPUs here)")] = None,
    prices: Annotated[Path | None, typer.Option("--prices", help="price table YAML overriding "
                                                "topologies/prices.yaml")] = None,
    nodes: Annotated[str | None, typer.Option("--nodes", help="node counts to search, e.g. 4,8,16 "
                                              "(default: the scenario's)")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="override a field of the scenario first")] = None,
    max_micro_batch: Annotated[int, typer.Option("--max-micro-batch", min=1)] = 8,
    max_estimates: Annotated[int, typer.Option("--max-estimates", min=0, help="stop after estimating this many "
                                               "candidates, most promising first (0: no cap)")] = 0,
    out: Annotated[Path | None, typer.Option("--out", help="folder for the simulation cache and search.json")] = None,
) -> None:
    """Find the fastest (or cheapest) parallel layout of SCENARIO's model on its cluster.

    Enumerates tp, pp, cp, dp, micro-batch, schedule (and virtual stages), sharding and
    recomputation; prunes invalid and out-of-memory layouts before simulating; predicts the
    rest best-first from short simulations until nothing left can enter the top; simulates
    the best whole and prints them with why the best wins.
    """
    import simulator
    from simulator.executors import open_executor
    from simulator.pricing import load_prices
    from simulator.search import SearchSpace
    from simulator.search import search as run_search

    if objective not in ("throughput", "cost", "time-to-train"):
        _fail(f"--objective {objective!r}: expected throughput, cost or time-to-train")
    base = _guard(lambda: simulator.load_scenario(scenario, overrides=list(set_ or [])))
    budget = _guard(lambda: _parse_count(tokens, "--tokens")) if tokens else None
    node_counts = _guard(lambda: tuple(int(_parse_count(n, "--nodes")) for n in nodes.split(","))) if nodes else None
    table = _guard(lambda: load_prices(prices))
    space = SearchSpace(nodes=node_counts, max_micro_batch=max_micro_batch)
    cache = str(out / "cache") if out is not None else None
    with _sweep_progress() as (bar, update):
        task = bar.add_task("search", total=None)

        def show(stage: str, state: Any) -> None:
            bar.update(task, description=stage, total=state.total)
            update(task, state)

        def run_all() -> Any:
            with open_executor(executor, workers) as pool:
                return run_search(base, executor=pool, space=space, objective=objective,  # type: ignore[arg-type]
                                  tokens=budget, prices=table, top=top, batch=4 * (workers or _cpus()),
                                  max_estimates=max_estimates, cache_dir=cache, progress=show)

        report = _guard(run_all)
    _print_search(report, base)
    if out is not None:
        from simulator.sweep import atomic_write_text

        atomic_write_text(out / "search.json", json.dumps(_search_document(report), indent=1, default=str) + "\n")
        console.print(f"search written to {out / 'search.json'}")


def _cpus() -> int:
    from simulator.executors import default_workers

    return default_workers()


def _parse_count(text: str, option: str) -> float:
    """``"1.4T"``, ``"2e12"``, ``"500B"`` (billions), ``"16"`` -> a number."""
    factors = {"k": 1e3, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12, "P": 1e15}
    raw = text.strip()
    factor = factors.get(raw[-1:], 1.0) if raw else 1.0
    number = raw[:-1] if factor != 1.0 else raw
    try:
        value = float(number) * factor
    except ValueError:
        raise ScenarioError(f"{option} {text!r}: expected a number such as 1.4T or 2e12") from None
    if value <= 0:
        raise ScenarioError(f"{option} {text!r}: must be positive")
    return value


def _print_search(report: Any, base: Any) -> None:
    from simulator.search import explain

    cluster = base.cluster
    console.print(f"[bold]{base.model.label}[/] on {cluster.n_nodes} x {cluster.node_type.name} "
                  f"({cluster.world_size} x {cluster.gpu_name}), global batch {base.training.global_batch} x "
                  f"{base.model.seq_len} tokens, {base.training.precision}")
    console.print(f"{report.enumerated} layouts: {report.invalid} invalid, {report.over_memory} over memory "
                  f"(estimate), {report.bounded_out} unable to beat the top {len(report.ranked) or '-'} (bound)"
                  + (f", {report.capped} not reached (--max-estimates)" if report.capped else "")
                  + f"; {report.estimated} estimated from short runs ({report.simulated_oom} out of memory), "
                  f"{report.simulated} simulated whole, {report.wall_s:.0f} s", highlight=False)
    table = Table(title=f"best by {report.objective}", title_justify="left")
    for col in ("#", "layout", "mb", "schedule", "sharding", "recompute", "step", "tokens/s", "MFU", "free mem",
                "to train", "cost"):
        table.add_column(col, justify="left" if col in ("layout", "schedule", "sharding", "recompute") else "right",
                         no_wrap=True)
    for i, ranked in enumerate(report.ranked, 1):
        lay, m = ranked.candidate.layout, ranked.metrics
        schedule = "-" if lay.pp == 1 else (lay.schedule if lay.virtual_stages == 1
                                             else f"{lay.schedule} v={lay.virtual_stages}")
        sharding = lay.sharding if lay.shard_group_size is None else f"{lay.sharding} g={lay.shard_group_size}"
        cost = f"${ranked.cost_usd:,.0f}" if ranked.cost_usd is not None else "-"
        table.add_row(str(i), f"tp{lay.tp} pp{lay.pp} cp{lay.cp} dp{lay.dp}", str(lay.micro_batch), schedule, sharding,
                      ranked.candidate.recompute, f"{m['step_time_s']:.2f} s", f"{m['tokens_per_s']:,.0f}",
                      f"{100 * m['mfu']:.1f}%", f"{m['memory_headroom_bytes'] / 2**30:.1f} GiB",
                      f"{ranked.time_to_train_s / 86400:,.1f} d", cost)
    wide = console if console.is_terminal else Console(width=max(console.width, 132))
    wide.print(table)
    console.print(f"time to train: {report.tokens:.3g} tokens"
                  + (" (20 per parameter, Hoffmann et al. 2022)" if report.tokens_default else ""), highlight=False)
    for node, price in report.prices.items():
        kind = "an ESTIMATE: bought, not rented" if price.kind == "estimate" else price.kind
        console.print(f"cost: {node} at ${price.usd_per_hour:,.2f} per node-hour ({kind}, {price.date}; "
                      f"{price.source})", highlight=False, soft_wrap=True)
    if not report.prices:
        console.print("cost: no price for this node type (pass --prices FILE)", highlight=False)
    console.print("[bold]why the best wins[/]")
    for line in explain(report):
        console.print(f"  {line}", highlight=False, soft_wrap=True)


def _search_document(report: Any) -> dict[str, Any]:
    return {
        "objective": report.objective,
        "tokens": report.tokens,
        "counts": {k: getattr(report, k) for k in ("enumerated", "invalid", "over_memory", "bounded_out", "capped",
                                                    "estimated", "simulated_oom", "failed", "simulated")},
        "ranked": [{"layout": r.label, "recompute": r.candidate.recompute, "time_to_train_s": r.time_to_train_s,
                    "cost_usd": r.cost_usd, "metrics": r.metrics,
                    "scenario": r.scenario.model_dump(mode="json", by_alias=True)} for r in report.ranked],
        "predicted_step_s": dict(report.predictions),
        "baseline": report.baseline,
        "prices": {k: v.model_dump() for k, v in report.prices.items()},
        "wall_s": report.wall_s,
    }


class _Failures(ProgressColumn):
    def render(self, task: Any) -> Any:
        from rich.text import Text

        failed = task.fields.get("failed", 0)
        cached = task.fields.get("cached", 0)
        return Text(f"{failed} infeasible/failed, {cached} cached", style="red" if failed else "dim")


@contextmanager
def _sweep_progress() -> Iterator[tuple[Progress, Callable[[Any, Any], None]]]:
    """A rich progress bar: done/total, failures and cached points, elapsed and ETA."""
    bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), _Failures(),
                   TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=False)

    def update(task: Any, state: Any) -> None:
        bar.update(task, completed=state.done, failed=state.failed, cached=state.cached)

    with bar:
        yield bar, update


def _write_scaling_html(rows: list[Any], path: Path, *, title: str, by_series: bool) -> None:
    from simulator.viz.scaling import scaling_figure

    fig = scaling_figure(rows, gpus_key="world_size", throughput_key="tokens_per_s",
                         series_key="series" if by_series else None, title=title)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(str(path), include_plotlyjs=True, full_html=True)


# ----------------------------------------------------------------------------------------
# schema, topo, collective


@app.command()
def schema(
    out: Annotated[Path | None, typer.Option("--out", help="write to a file instead of stdout")] = None,
) -> None:
    """Print the JSON Schema of the scenario format."""
    from simulator.scenario import scenario_json_schema

    text = json.dumps(scenario_json_schema(), indent=2)
    if out:
        out.write_text(text + "\n")
    else:
        sys.stdout.write(text + "\n")


@app.command()
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
    from simulator.scenario import ClusterSpec

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
        try:
            spec = ClusterSpec.model_validate(data)
        except Exception as exc:
            from pydantic import ValidationError

            from simulator.scenario.yamlio import error_from_validation

            if isinstance(exc, ValidationError):
                raise error_from_validation(exc) from None
            raise
        return build_cluster(spec)

    cluster = _guard(build)
    summary = summarize(cluster)
    spec = cluster.node_type
    console.print(f"[bold]{summary.description}[/]")
    console.print(f"{summary.gpus} GPUs ({cluster.gpu.full_name}, {units.format_bytes(cluster.gpu.memory_bytes)}, "
                  f"{units.format_rate(cluster.gpu.memory_bandwidth_bytes_per_s)} HBM) on {summary.nodes} node(s); "
                  f"{summary.switches} switches; {len(cluster.links)} directed links")
    table = Table(title="links (one direction)", title_justify="left")
    for col in ("kind", "tier", "count", "bandwidth each", "total"):
        table.add_column(col, justify="right" if col in ("count", "bandwidth each", "total") else "left")
    for g in summary.links:
        table.add_row(g.kind, g.tier, str(g.count), units.format_rate(g.bandwidth_bytes_per_s),
                      units.format_rate(g.count * g.bandwidth_bytes_per_s))
    console.print(table)
    for line in summary.diagram:
        console.print(line, highlight=False, markup=False)
    console.print(f"per-GPU injection: NVLink {units.format_rate(summary.nvlink_per_gpu_bytes_per_s)}, "
                  f"PCIe {units.format_rate(summary.pcie_per_gpu_bytes_per_s)}, network "
                  f"{units.format_rate(summary.network_per_gpu_bytes_per_s)} "
                  f"({spec.nics.count} x {units.format_rate(spec.nics.bandwidth_bytes_per_s)} {spec.nics.transport} "
                  f"per node)")
    how = "max flow" if summary.bisection_exact else "estimate"
    console.print(f"bisection bandwidth: {units.format_rate(summary.bisection_bytes_per_s)} ({how}, one direction)")
    console.print("sources: " + "; ".join(spec.sources), style="dim", soft_wrap=True)


def _is_cluster_file(path: str) -> bool:
    from simulator.scenario.yamlio import load_yaml

    try:
        data = load_yaml(path)
    except ScenarioError:
        return False
    return isinstance(data, dict) and "nodes" in data


def _size_range(text: str) -> list[float]:
    if ":" not in text:
        return [units.parse_bytes(text)]
    lo, hi = (units.parse_bytes(x) for x in text.split(":", 1))
    if lo <= 0 or hi < lo:
        raise ScenarioError(f"--sizes {text!r}: need 0 < start <= end, e.g. 8B:16GiB")
    sizes, size = [], lo
    while size <= hi * (1 + 1e-9):
        sizes.append(size)
        size *= 2
    return sizes


@app.command()
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
        _fail(f"--op {op!r}: expected one of {', '.join(o for o in OPS if o != 'p2p')}")
    if algorithm is not None and algorithm not in ALGORITHMS:
        _fail(f"--algorithm {algorithm!r}: expected one of {', '.join(ALGORITHMS)}")
    if network not in ("flow", "analytical"):
        _fail(f"--network {network!r}: expected flow or analytical")
    size_list = _guard(lambda: _size_range(sizes))
    cluster: dict[str, Any] = {"node": node, "nodes": nodes, "fabric": {"kind": fabric}}
    if gpus_per_node:
        cluster["gpus_per_node"] = gpus_per_node

    def table_rows() -> list[tuple[float, float, str]]:
        from simulator.scenario import ClusterSpec

        try:
            spec = ClusterSpec.model_validate(cluster)
        except Exception as exc:
            from pydantic import ValidationError

            from simulator.scenario.yamlio import error_from_validation

            if isinstance(exc, ValidationError):
                raise error_from_validation(exc) from None
            raise
        out = []
        for size in size_list:
            try:
                seconds = simulate_collective(spec, op, size, algorithm, network=network)
                how = collective_choice(spec, op, size, algorithm)
            except ValueError as exc:
                raise ScenarioError(f"--algorithm {algorithm}: {exc}") from None
            out.append((size, seconds, how))
        return out

    rows = _guard(table_rows)
    world = nodes * (gpus_per_node or 0) or None
    table = Table(title=f"{op} on {nodes} x {node} ({network} model)", title_justify="left")
    for col in ("size", "time", "algbw", "busbw", "algorithm"):
        table.add_column(col, justify="left" if col == "algorithm" else "right")
    from simulator.scenario import ClusterSpec

    world = ClusterSpec.model_validate(cluster).world_size
    factor = bus_bandwidth_factor(op, world)
    for size, seconds, how in rows:
        algbw = size / seconds if seconds > 0 else 0.0
        table.add_row(units.format_size_for_table(size), f"{seconds * 1e6:,.1f} us", f"{algbw / 1e9:.2f} GB/s",
                      f"{algbw * factor / 1e9:.2f} GB/s", how)
    console.print(table)


@app.command()
def validate(
    json_path: Annotated[Path | None, typer.Option("--json", help="write every record's result as JSON")] = None,
    docs: Annotated[Path, typer.Option("--docs", help="folder for validation.md / .svg / .html")] = Path("docs"),
    source: Annotated[list[str] | None, typer.Option("--source", help="only these sources (megatron-sc21, "
                                                     "megatron-core, llm-foundry)")] = None,
    no_docs: Annotated[bool, typer.Option("--no-docs", help="do not write docs/validation.md")] = False,
) -> None:
    """Simulate every published training run and nccl-tests point; print and document the errors."""
    from rich.progress import Progress

    from simulator.validation.records import load_records
    from simulator.validation.report import SOURCE_NAMES, write_markdown
    from simulator.validation.runner import validate as run_validation

    sources = set(source) if source else None
    total = sum(1 for r in load_records() if not sources or r.source in sources)
    with Progress(console=err_console, transient=True) as progress:
        task = progress.add_task("simulating published runs", total=total)
        result = run_validation(sources=sources, progress=lambda _id: progress.advance(task))
    table = Table(title="predicted vs measured step time", title_justify="left")
    for col in ("record", "GPUs", "measured (s)", "predicted (s)", "error"):
        table.add_column(col, justify="left" if col == "record" else "right")
    for r in result.records:
        colour = "green" if abs(r.error) <= 0.10 else "yellow" if abs(r.error) <= 0.25 else "red"
        table.add_row(r.record.id, str(r.record.gpus), f"{r.record.measured_step_s:.3f}",
                      f"{r.predicted_step_s:.3f}", f"[{colour}]{100 * r.error:+.1f}%[/]")
    console.print(table)
    summary = result.summary()
    per = Table(title="mean absolute percentage error", title_justify="left")
    for col in ("source", "records", "MAPE", "worst"):
        per.add_column(col, justify="left" if col == "source" else "right")
    for name, row in summary["per_source"].items():
        per.add_row(SOURCE_NAMES.get(name, name), str(row["records"]), f"{100 * row['mape']:.1f}%",
                    f"{100 * row['max_abs_error']:.1f}%")
    o = summary["overall"]
    per.add_row("[bold]all[/]", str(o["records"]), f"[bold]{100 * o['mape']:.1f}%[/]", f"{100 * o['max_abs_error']:.1f}%")
    c = summary["collectives"]
    per.add_row("nccl-tests all-reduce >= 1 MiB", str(c["points"]), f"{100 * c['mape']:.1f}%",
                f"{100 * c['max_abs_error']:.1f}%")
    console.print(per)
    if json_path is not None:
        data = {"summary": summary,
                "records": [{"id": r.record.id, "source": r.record.source, "gpus": r.record.gpus,
                             "measured_step_s": r.record.measured_step_s, "predicted_step_s": r.predicted_step_s,
                             "error": r.error, "mfu": r.mfu, "breakdown": r.breakdown} for r in result.records],
                "collectives": [{"id": c.record.id, "bytes": c.record.nbytes, "measured_s": c.record.measured_s,
                                 "predicted_s": c.predicted_s, "error": c.error, "algorithm": c.algorithm}
                                for c in result.comm]}
        json_path.write_text(json.dumps(data, indent=2))
        console.print(f"results written to {json_path}")
    if not no_docs:
        path = write_markdown(result, docs)
        console.print(f"report written to {path}")


# dtsim calibrate (simulator/cli_calibrate.py; PyTorch is imported only when it runs)
app.command(name="calibrate")(calibrate_command)


def main() -> None:
    try:
        app()
    except ScenarioError as exc:  # raised outside a guarded block
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
