"""``dtsim run``: simulate one scenario, print its summary, write JSON, traces and a report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from simulator import units
from simulator.cli.common import console, guard
from simulator.errors import ScenarioError

__all__ = ["run"]


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

    sc = guard(lambda: simulator.load_scenario(scenario, overrides=list(set_ or [])))
    needs_series = report is not None or trace is not None  # link-load time series for counters and heatmap
    sim = guard(lambda: simulator.run_simulation(sc, record_series=needs_series))
    result = sim.result
    if not quiet:
        _print_summary(result, sc)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(result.model_dump_json(indent=2))
        console.print(f"result written to {json_path}")
    ranks = guard(lambda: _parse_ranks(trace_ranks)) if trace_ranks else None
    if trace is not None:
        from simulator.results.export import write_trace

        guard(lambda: write_trace(sim, trace, ranks=ranks))
        console.print(f"trace written to {trace} (open in https://ui.perfetto.dev or chrome://tracing)")
    if hta is not None:
        from simulator.results.export import write_hta_traces

        paths = guard(lambda: write_hta_traces(sim, hta, ranks=ranks))
        console.print(f"{len(paths)} HTA trace(s) written to {hta} (hta.trace_analysis.TraceAnalysis(trace_dir=...))")
    if report is not None:
        from simulator.viz.report import write_report

        write_report(sim, sc, report)
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


def _plain(value: Any, quantity: str | None = None) -> str:
    """A setting as a scenario file writes it (``false``, ``null``, ``40000000``, ``fp32``; sizes,
    rates and times with their unit, ``160 MB``)."""
    from simulator import units

    if quantity is not None and isinstance(value, (int, float)):
        return {"size": units.format_bytes, "rate": units.format_rate, "time": units.format_time,
                "elements": lambda v: f"{v:,} elements"}.get(quantity, lambda v: json.dumps(v))(value)
    return value if isinstance(value, str) else json.dumps(value)


def _framework_rows(table: Table, sc: Any) -> None:
    """The framework, then each of its profile's settings whose effective value differs from
    ``generic``, with where it came from (the profile's name, or ``scenario``)."""
    settings = sc.framework_settings()
    label = sc.framework if sc.framework != "generic" else "generic (dtsim defaults)"
    table.add_row("framework", label + (f": {len(settings)} setting(s) differ from generic" if settings else ""))
    from simulator.scenario import Scenario
    from simulator.scenario.framework import field_quantity
    from simulator.scenario.notes import effective_settings

    effective = {path: (text, source) for path, text, source in effective_settings(sc)}
    for path, value, source in settings:
        if path in effective:  # null in the profile: print what it means for this sharding
            continue
        quantity = field_quantity(Scenario, tuple(path.split(".")))
        table.add_row("", f"{path} = {_plain(value, quantity)} ({source})")
    for path, (text, source) in effective.items():
        table.add_row("", f"{path} = {text} ({source})")


def _print_summary(result: Any, sc: Any) -> None:
    from simulator.scenario.notes import bandwidth_lines, setting_notes, why_lines

    par = sc.parallelism
    mem = max(result.memory, key=lambda m: m.peak_bytes)
    title = f"{result.name}"
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
    table.add_row("cluster", f"{cluster.n_nodes} x {cluster.node_type.name} = {result.world_size} x "
                  f"{cluster.gpu_name} ({cluster.node_type.nics.transport if not cluster.fabric.transport else cluster.fabric.transport}, "
                  f"{cluster.fabric.kind})")
    for line in bandwidth_lines(cluster):
        table.add_row("", line)
    layout = f"tp {par.tp} x pp {par.pp} x cp {par.cp} x dp {result.dp}, sharding {par.sharding}"
    if par.pp > 1:
        layout += f", {par.pipeline_schedule}" + (f" v={par.virtual_stages}" if par.virtual_stages > 1 else "")
    table.add_row("layout", layout)
    _framework_rows(table, sc)
    table.add_row("batch", f"micro-batch {sc.training.micro_batch} x {result.micro_batches} micro-batches x dp "
                  f"{result.dp} = {result.global_batch} sequences of {sc.model.seq_len} tokens, {sc.training.precision}, "
                  f"recompute {sc.training.recompute}")
    table.add_row("model", f"{sc.model.label}: {result.params / 1e9:.2f} B parameters")
    table.add_row("step time", f"[bold]{units.format_time(result.step_time_s)}[/]{invalid}")
    table.add_row("throughput", f"{result.tokens_per_s:,.0f} tokens/s ({result.samples_per_s:,.1f} samples/s){invalid}")
    table.add_row("per GPU", f"{result.tflops_per_gpu:.1f} TFLOP/s model, {result.hardware_tflops_per_gpu:.1f} hardware; "
                  f"MFU [bold]{100 * result.mfu:.1f}%[/], HFU {100 * result.hfu:.1f}%{invalid}")
    verdict = "[bold red]OUT OF MEMORY[/]" if result.oom else "[green]fits[/]"
    table.add_row("peak memory", f"{units.format_bytes(mem.peak_bytes)} of {units.format_bytes(mem.capacity_bytes)} "
                  f"(rank {mem.rank}) {verdict}; allocated by the caching allocator "
                  f"{units.format_bytes(result.peak_allocated_bytes)} (reserved: at least this, fragmentation not modelled)")
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
    for line in why_lines(sc, b, step):
        table.add_row("why", line)
    for line in setting_notes(sc):
        table.add_row("note", line)
    for link in result.links[:3]:
        table.add_row("busy link", f"{link.label}: {100 * link.utilisation:.0f}% of {link.kind} capacity")
    table.add_row("calibration", result.calibration)
    table.add_row("engine", f"{result.engine['tasks']} tasks on {result.engine['simulated_ranks']} simulated ranks, "
                  f"{result.engine['network_entities']} transfers ({result.engine['network']} network, "
                  f"symmetry {result.engine['symmetry']})")
    console.print(table)
