"""``dtsim run``: simulate one scenario, print its summary, write JSON, traces and a report."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from simulator import limits, units
from simulator.cli.common import check_output_dir, check_output_file, console, guard, safe
from simulator.errors import ScenarioError
from simulator.results.moe import moe_lines

__all__ = ["run", "print_cost", "step_cost_usd"]


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
    memory_only: Annotated[bool, typer.Option("--memory-only", help="only say whether it fits and what fills memory "
                                              "(an estimate, no simulation; same as dtsim fit)")] = False,
    prices: Annotated[Path | None, typer.Option("--prices", help="price table YAML overriding topologies/prices.yaml "
                                                "(for the cost line)")] = None,
) -> None:
    """Simulate one training iteration of SCENARIO and print a summary."""
    import simulator

    for path, option in ((json_path, "--json"), (trace, "--trace"), (report, "--report")):
        check_output_file(path, option)
    check_output_dir(hta, "--hta")
    ranks = guard(lambda: _parse_ranks(trace_ranks)) if trace_ranks else None
    sc = guard(lambda: simulator.load_scenario(scenario, overrides=list(set_ or [])))
    if memory_only:
        from simulator.cli.fit import print_fit

        print_fit(sc)
        return
    price_table = guard(lambda: _load_prices(prices))
    needs_series = report is not None or trace is not None  # link-load time series for counters and heatmap

    def simulate() -> Any:
        try:
            return simulator.run_simulation(sc, record_series=needs_series)
        except limits.LimitError as exc:  # tasks or engine events: the scenario file is what is too large
            raise exc.located(file=str(scenario)) from None
        except ScenarioError as exc:  # a link selector matching nothing, failed links leaving no path
            raise exc.located(file=str(scenario)) from None

    sim = guard(simulate)
    result = sim.result
    if not quiet:
        _print_summary(result, sc)
        print_cost(result, sc, price_table, prices)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(result.model_dump_json(indent=2))
        console.print(f"result written to {safe(json_path)}")
    if trace is not None:
        from simulator.results.export import write_trace

        guard(lambda: write_trace(sim, trace, ranks=ranks))
        console.print(f"trace written to {safe(trace)} (open in https://ui.perfetto.dev or chrome://tracing)")
    if hta is not None:
        from simulator.results.export import write_hta_traces

        paths = guard(lambda: write_hta_traces(sim, hta, ranks=ranks))
        console.print(f"{len(paths)} HTA trace(s) written to {safe(hta)} (hta.trace_analysis.TraceAnalysis(trace_dir=...))")
    if report is not None:
        from simulator.viz.report import write_report

        write_report(sim, sc, report)
        console.print(f"report written to {safe(report)}")


def _parse_ranks(text: str) -> list[int]:
    """``"0-7,1024"`` -> [0, ..., 7, 1024]; the ranks are counted before any range is expanded
    (limit ``trace_ranks`` of :mod:`simulator.limits`)."""
    spans: list[tuple[int, int]] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            a, _, b = part.partition("-")
            spans.append((int(a), int(b) if b else int(a)))
        except ValueError:
            raise ScenarioError(f"--trace-ranks: cannot read {part!r}; use e.g. 0-7,1024") from None
    limits.check("trace_ranks", sum(max(0, b - a + 1) for a, b in spans), what="ranks named", field="--trace-ranks")
    return [r for a, b in spans for r in range(a, b + 1)]


def _measured_on(sc: Any) -> str:
    """`` (measured on cpu: Intel Xeon ...)`` for a scenario with a calibration profile."""
    if sc.cluster.calibration is None:
        return ""
    from simulator.scenario.calibration import load_profile_spec

    return f" (measured on {load_profile_spec(sc.cluster.calibration).measured_on})"


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:5.1f}%" if whole > 0 else "-"


def _framework_rows(table: Table, sc: Any) -> None:
    """The framework, then each of its profile's settings whose effective value differs from
    ``generic``, with where it came from (the profile's name, or ``scenario``)."""
    from simulator.scenario.framework import framework_setting_rows
    from simulator.scenario.notes import overlap_settings

    rows = framework_setting_rows(sc)
    effective = {path: (text, source) for path, text, source in overlap_settings(sc)}
    label = sc.framework if sc.framework != "generic" else "generic (dtsim defaults)"
    table.add_row("framework", safe(label) + (f": {len(rows)} setting(s) differ from generic" if rows else ""))
    for path, text, source in rows:
        if path in effective:  # null in the profile: printed below as what it means for this sharding
            continue
        table.add_row("", safe(f"{path} = {text} ({source})"))
    for path, (text, source) in effective.items():
        table.add_row("", safe(f"{path} = {text} ({source})"))


def _print_summary(result: Any, sc: Any) -> None:
    from simulator.results.faults import faults_lines
    from simulator.scenario.notes import bandwidth_lines, setting_notes, why_lines

    par = sc.parallelism
    mem = max(result.memory, key=lambda m: m.peak_bytes)
    title = safe(result.name)
    if result.oom:
        title = f"[bold red]OUT OF MEMORY[/] {title}"
    table = Table(title=title, show_header=False, title_justify="left", min_width=72)
    table.add_column("metric", style="bold")
    table.add_column("value")
    invalid = ""
    if result.oom:
        table.add_row("[red]verdict[/]", f"[bold red]OUT OF MEMORY: does not fit[/] ({units.format_bytes(mem.peak_bytes)} "
                      f"needed on rank {mem.rank}, {units.format_bytes(mem.capacity_bytes)} available). Step time, "
                      "throughput and MFU below are what it would run at if it fitted: not achievable as configured")
        invalid = " [red](not valid: out of memory)[/]"
    cluster = sc.cluster
    transport = cluster.fabric.transport or cluster.node_type.nics.transport
    table.add_row("cluster", safe(f"{cluster.n_nodes} x {cluster.node_type.name} = {result.world_size} x "
                                  f"{cluster.gpu_name} ({transport}, {cluster.fabric.kind})"))
    for line in bandwidth_lines(cluster):
        table.add_row("", safe(line))
    layout = f"tp {par.tp} x pp {par.pp} x cp {par.cp} x dp {result.dp}, sharding {par.sharding}"
    if sc.model.moe:
        layout += f"; experts: ep {par.ep} x etp {par.expert_tp} x expert dp {sc.edp}, {par.moe.dispatcher} dispatcher"
    if par.pp > 1:
        layout += f", {par.pipeline_schedule}" + (f" v={par.virtual_stages}" if par.virtual_stages > 1 else "")
    table.add_row("layout", safe(layout))
    _framework_rows(table, sc)
    table.add_row("batch", safe(f"micro-batch {sc.training.micro_batch} x {result.micro_batches} micro-batches x dp "
                  f"{result.dp} = {result.global_batch} sequences of {sc.model.seq_len} tokens, {sc.training.precision}, "
                  f"recompute {sc.training.recompute}"))
    table.add_row("model", safe(f"{sc.model.label}: {result.params / 1e9:.2f} B parameters"))
    table.add_row("step time", f"[bold]{units.format_time(result.step_time_s)}[/]{invalid}")
    table.add_row("throughput", f"{result.tokens_per_s:,.0f} tokens/s ({result.samples_per_s:,.1f} samples/s){invalid}")
    table.add_row("per GPU", f"{result.tflops_per_gpu:.1f} TFLOP/s model, {result.hardware_tflops_per_gpu:.1f} hardware; "
                  f"MFU [bold]{100 * result.mfu:.1f}%[/], HFU {100 * result.hfu:.1f}%{invalid}")
    for label, line in moe_lines(result.moe):
        table.add_row(label, safe(line))
    verdict = "[bold red]OUT OF MEMORY[/]" if result.oom else "[green]fits[/]"
    table.add_row("peak memory", f"{units.format_bytes(mem.peak_bytes)} of {units.format_bytes(mem.capacity_bytes)} "
                  f"(rank {mem.rank}) {verdict}; caching allocator: allocated "
                  f"{units.format_bytes(result.peak_allocated_bytes)}, reserved {units.format_bytes(result.peak_reserved_bytes)}")
    if result.oom_detail is not None:
        table.add_row("", safe(result.oom_detail.message))
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
    for line in why_lines(sc, b, step):
        table.add_row("why", line)
    for line in setting_notes(sc):
        table.add_row("note", line)
    for link in result.links[:3]:
        table.add_row("busy link", safe(f"{link.label}: {100 * link.utilisation:.0f}% of {link.kind} capacity"))
    table.add_row("calibration", safe(result.calibration + _measured_on(sc)))
    table.add_row("engine", f"{result.engine['tasks']} tasks on {result.engine['simulated_ranks']} simulated ranks, "
                  f"{result.engine['network_entities']} transfers ({result.engine['network']} network, "
                  f"symmetry {result.engine['symmetry']})")
    for label, line in faults_lines(result.faults):
        table.add_row(label, safe(line))
    console.print(table)


# ----------------------------------------------------------------------------------------
# the cost of the simulated job, when the node type has a price


def _load_prices(path: Path | None) -> Any:
    from simulator.search.pricing import load_prices

    return load_prices(path)


def step_cost_usd(step_time_s: float, nodes: int, usd_per_node_hour: float) -> float:
    """Dollars one step costs: the whole cluster (``nodes`` nodes) for ``step_time_s`` seconds."""
    from simulator.search.pricing import HOUR_S

    return step_time_s / HOUR_S * nodes * usd_per_node_hour


def print_cost(result: Any, sc: Any, table: Any, prices: Path | None) -> None:
    """``cost``: per step and per million tokens at the node type's hourly price, and where the
    price comes from; a line saying how to give one when the node type has none."""
    node = sc.cluster.node_type.name
    price = table.get(node)
    if price is None:
        console.print(safe(f"cost: no price for {node} (pass --prices FILE; format of topologies/prices.yaml)"),
                      highlight=False, soft_wrap=True)
        return
    nodes = sc.cluster.n_nodes
    per_step = step_cost_usd(result.step_time_s, nodes, price.usd_per_hour)
    tokens = result.global_batch * sc.model.seq_len
    kind = "an ESTIMATE: bought, not rented" if price.kind == "estimate" else price.kind
    shipped = price == _load_prices(None).get(node)  # else the --prices file replaced it
    origin = "topologies/prices.yaml" if shipped or prices is None else str(prices)
    console.print(f"[bold]cost[/]: ${per_step:,.4f} per step, ${per_step / tokens * 1e6:,.4f} per million tokens "
                  + safe(f"({nodes} x {node} at ${price.usd_per_hour:,.2f} per node-hour, {kind}, {price.date}; "
                         f"{origin}: {price.source})"), highlight=False, soft_wrap=True)
