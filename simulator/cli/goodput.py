"""``dtsim goodput``: the expected wall-clock, ETTR and cost of training a token budget with
failures, checkpoints and restarts (the scenario's ``reliability`` section), from one simulated step."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table

from simulator.cli.common import check_output_file, console, fail, guard, print_table, safe

__all__ = ["goodput"]

_DAY = 86400.0


def goodput(
    scenario: Annotated[Path, typer.Argument(help="scenario YAML file (its reliability section, or the Llama 3 "
                                             "defaults)")],
    tokens: Annotated[str, typer.Option("--tokens", help="training tokens of the run, e.g. 15T, 405B, 2e12")],
    set_: Annotated[list[str] | None, typer.Option("--set", help="override a field: KEY.PATH=VALUE (repeatable), "
                                                   "e.g. reliability.checkpoint.asynchronous=true")] = None,
    interval: Annotated[str | None, typer.Option("--interval", help="checkpoint interval instead of the "
                                                 "optimum, e.g. 30min")] = None,
    trials: Annotated[int, typer.Option("--trials", min=0, help="Monte-Carlo trials for the spread "
                                        "(0: expectation only)")] = 0,
    seed: Annotated[int, typer.Option("--seed", min=0, help="seed of the Monte-Carlo trials")] = 0,
    prices: Annotated[Path | None, typer.Option("--prices", help="price table YAML overriding "
                                                "topologies/prices.yaml")] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="write the estimate as JSON")] = None,
    report: Annotated[Path | None, typer.Option("--report", help="write an HTML report: breakdown, ETTR against "
                                                "cluster size and checkpoint interval")] = None,
) -> None:
    """Expected wall-clock, ETTR and cost of training --tokens tokens on SCENARIO's cluster.

    Simulates one step, then adds checkpoints (Young/Daly optimal interval), failures at the
    reliability section's rates (default: the Llama 3 405B run's, Table 5), lost work and
    restarts (Daly 2006's complete model); --trials gives a seeded Monte-Carlo spread.
    """
    import simulator
    from simulator.goodput import estimate, inputs_for, node_price
    from simulator.goodput.montecarlo import monte_carlo
    from simulator.search.pricing import load_prices
    from simulator.units import UnitError, parse_count, parse_time

    for path, option in ((json_path, "--json"), (report, "--report")):
        check_output_file(path, option)
    try:
        budget = parse_count(tokens)
        interval_s = parse_time(interval) if interval is not None else None
    except UnitError as exc:
        fail(f"--tokens/--interval: {exc}")
        return
    if interval_s is not None and interval_s <= 0:
        fail("--interval must be positive")
    base = guard(lambda: simulator.load_scenario(scenario, overrides=list(set_ or [])))
    table = guard(lambda: load_prices(prices))
    result = guard(lambda: simulator.simulate(base))
    if result.oom:
        console.print("warning: the step does not fit in GPU memory (dtsim run says why); the estimate assumes it "
                      "did", highlight=False)
    inputs = inputs_for(base, result)
    price = node_price(inputs.node_type, table)
    est = guard(lambda: estimate(inputs, budget, usd_per_node_hour=price, interval_s=interval_s))
    if trials:
        est = guard(lambda: monte_carlo(inputs, est, trials, seed))
    _print(est, base, result)
    if json_path is not None:
        json_path.write_text(json.dumps(est.to_json(), indent=1, default=str) + "\n")
        console.print(f"estimate written to {safe(json_path)}", highlight=False)
    if report is not None:
        report.write_text(_report(base, inputs, est, budget, price))
        console.print(f"report written to {safe(report)}", highlight=False)


def _days(seconds: float) -> str:
    if seconds >= _DAY:
        return f"{seconds / _DAY:,.2f} days"
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.3g} s"


def summary_rows(est: Any, scenario: Any) -> list[tuple[str, str]]:
    """The printed and reported summary: (label, value)."""
    run = est.run
    spec = scenario.reliability
    ck = spec.checkpoint if spec is not None else None
    rows = [
        ("tokens", f"{est.tokens:,.4g} in {est.steps:,} steps"),
        ("step time", f"{est.step_time_s:.3f} s (simulated)" + (f", x{1 / est.throughput_factor:.4f} for the "
                                                                 "replicas out (elastic)" if est.throughput_factor < 1 else "")),
        ("job MTBF", f"{_days(est.job_mtbf_s)} (hardware {_days(est.hardware_mtbf_s)}, software "
                     f"{_days(est.software_mtbf_s)})"),
        ("checkpoint", f"{est.checkpoint_bytes / 1e12:.3f} TB, write {_days(est.write_s)}, read {_days(est.read_s)}; "
                       f"training stops {_days(est.checkpoint_s)}" + (" (asynchronous)" if ck and ck.asynchronous else "")),
        ("interval", f"{_days(est.interval_s)} = {est.interval_steps:,} steps ({est.interval_rule}; Young "
                     f"{_days(est.young_interval_s)}, Daly {_days(est.daly_interval_s)})"),
        ("restart", f"hardware {_days(est.restart_hardware_s)}, software/planned {_days(est.restart_software_s)}"),
        ("interruptions", f"{run.failures:,.0f} failures, {run.planned:,.0f} planned"),
        ("ETTR", f"{est.ettr:.2%}"),
        ("wall-clock", f"{_days(run.wall_s)} (no failures: {_days(est.steps * est.step_time_s)})"),
        ("cost", "no price for this node type (pass --prices)" if est.cost_usd is None else
         f"${est.cost_usd:,.0f} ({est.nodes_paid:,} nodes at ${est.usd_per_node_hour:.2f}/node-hour)"),
    ]
    if est.throughput_factor < 1.0:
        rows.append(("  steps at reduced dp", f"{_days(run.productive_s - est.ideal_s)} (elastic; part of the "
                                              "productive steps)"))
    for label, attr in (("  productive steps", "productive_s"), ("  checkpoint writes", "checkpoint_s"),
                        ("  lost work", "lost_s"), ("  restarts", "restart_s")):
        seconds = getattr(run, attr)
        rows.append((label, f"{_days(seconds)} ({seconds / run.wall_s:.1%})"))
    if est.spread:
        w, e = est.spread["wall_s"], est.spread["ettr"]
        rows.append(("Monte-Carlo", f"wall-clock p5 {_days(w['p5'])} / p50 {_days(w['p50'])} / p95 {_days(w['p95'])}; "
                                    f"ETTR p5 {e['p5']:.2%} / p95 {e['p95']:.2%}"))
    rows.extend(("note", n) for n in est.notes)
    return rows


def _print(est: Any, scenario: Any, result: Any) -> None:
    table = Table(title=safe(result.name), box=box.SQUARE, show_header=False)
    table.add_column(style="bold")
    table.add_column()
    for label, value in summary_rows(est, scenario):
        table.add_row(safe(label), safe(value))
    print_table(table)


def _report(scenario: Any, inputs: Any, est: Any, tokens: float, price: float | None) -> str:
    from simulator.goodput import estimate
    from simulator.viz.goodput import (
        breakdown_figure,
        ettr_vs_interval_figure,
        ettr_vs_nodes_figure,
        goodput_report_html,
    )

    nodes = sorted({max(1, round(inputs.nodes * 2.0 ** k)) for k in range(-6, 4)})
    by_nodes = [estimate(inputs.scaled(n), tokens, usd_per_node_hour=price) for n in nodes]
    optimum = est.interval_s
    intervals = [optimum * 2.0 ** (k / 2) for k in range(-8, 9)]
    by_interval = [estimate(inputs, tokens, usd_per_node_hour=price, interval_s=t) for t in intervals]
    figures = [("Where the wall-clock goes", breakdown_figure(est)),
               ("ETTR against cluster size", ettr_vs_nodes_figure(nodes, by_nodes, marked=inputs.nodes)),
               ("ETTR against checkpoint interval", ettr_vs_interval_figure(
                   [e.interval_s for e in by_interval], by_interval, optimum_s=optimum if math.isfinite(optimum) else None))]
    return goodput_report_html(scenario.name or "goodput", summary_rows(est, scenario), figures, est.to_json())
