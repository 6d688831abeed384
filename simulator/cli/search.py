"""``dtsim search``: the fastest (or cheapest) parallel layout of a scenario's model on its cluster."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table

from simulator.cli.common import check_output_dir, check_output_file, console, fail, guard, print_table, safe
from simulator.cli.progress import sweep_progress
from simulator.errors import ScenarioError

__all__ = ["search"]


def search(
    scenario: Annotated[Path, typer.Argument(help="scenario YAML file: the model, cluster and training options")],
    objective: Annotated[str, typer.Option("--objective", help="throughput | cost | time-to-train (with a reliability section: failures, checkpoints and restarts included)")] = "throughput",
    top: Annotated[int, typer.Option("--top", min=1, help="configurations to rank (simulated whole)")] = 5,
    tokens: Annotated[str | None, typer.Option("--tokens", help="training tokens for time and cost, e.g. 1.4T or "
                                               "2e12 (default: 20 per parameter, Hoffmann et al. 2022)")] = None,
    executor: Annotated[str, typer.Option("--executor", help="local | serial | dask-local | dask://HOST:PORT | "
                                          "ray | ray://HOST:PORT")] = "local",
    workers: Annotated[int | None, typer.Option("--workers", min=1, help="worker processes (default and most: the CPUs here)")] = None,
    prices: Annotated[Path | None, typer.Option("--prices", help="price table YAML overriding "
                                                "topologies/prices.yaml")] = None,
    nodes: Annotated[str | None, typer.Option("--nodes", help="node counts to search, e.g. 4,8,16 "
                                              "(default: the scenario's)")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="override a field of the scenario first")] = None,
    max_micro_batch: Annotated[int, typer.Option("--max-micro-batch", min=1)] = 8,
    max_estimates: Annotated[int, typer.Option("--max-estimates", min=0, help="stop after estimating this many "
                                               "candidates, most promising first (0: no cap)")] = 0,
    margin: Annotated[float | None, typer.Option("--margin", min=0.0, max=1.0, help="stage 2 simulates every "
                                                 "candidate whose closed-form estimate times (1 - margin) could enter "
                                                 "the top (default: the estimate's measured error margin; 1: only "
                                                 "the proven bound prunes)")] = None,
    json_path: Annotated[Path | None, typer.Option("--json", help="write the search (counts, what each stage kept, "
                                                   "estimates, predictions, ranking) as JSON")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="folder for the simulation cache and search.json")] = None,
) -> None:
    """Find the fastest (or cheapest) parallel layout of SCENARIO's model on its cluster.

    Enumerates tp, pp, cp, dp, micro-batch, schedule (and virtual stages), sharding,
    recomputation and, for MoE models, ep and etp; prunes invalid and out-of-memory layouts;
    stage 1 estimates every candidate's step in closed form; stage 2 simulates (short runs),
    best first, those whose estimate less its error margin could still enter the top; stage 3
    simulates the best whole. Prints what each stage kept and why the best wins.
    """
    import simulator
    from simulator.search import SearchSpace
    from simulator.search import search as run_search
    from simulator.search.pricing import load_prices
    from simulator.sweep import bound_workers, check_executor, open_executor

    guard(lambda: check_executor(executor))
    if objective not in ("throughput", "cost", "time-to-train"):
        fail(f"--objective {objective!r}: expected throughput, cost or time-to-train")
    check_output_dir(out, "--out", inside=("cache",))
    check_output_file(json_path, "--json")
    base = guard(lambda: simulator.load_scenario(scenario, overrides=list(set_ or [])))
    budget = guard(lambda: _parse_count(tokens, "--tokens")) if tokens else None
    node_counts = guard(lambda: tuple(_parse_node_count(n) for n in nodes.split(","))) if nodes else None
    guard(lambda: _check_node_counts(node_counts or (), base.cluster.gpus_in_node))  # news, not "0 layouts"
    table = guard(lambda: load_prices(prices))
    space = SearchSpace(nodes=node_counts, max_micro_batch=max_micro_batch)
    n_workers, capped = guard(lambda: bound_workers(workers))
    if capped and executor in ("local", "dask-local", "ray"):  # the executors that start processes here
        console.print(capped, highlight=False)
    cache = str(out / "cache") if out is not None else None
    def run_all() -> Any:
        # the executor first: one that cannot open (an unreachable scheduler) fails before any bar is drawn
        with open_executor(executor, n_workers) as pool, sweep_progress() as (bar, update):
            task = bar.add_task("search", total=None)

            def show(stage: str, state: Any) -> None:
                bar.update(task, description=stage, total=state.total)
                update(task, state)

            return run_search(base, executor=pool, space=space, objective=objective,  # type: ignore[arg-type]
                              tokens=budget, prices=table, top=top, batch=4 * n_workers,
                              max_estimates=max_estimates, cache_dir=cache, progress=show,
                              **({} if margin is None else {"margin": margin}))

    report = guard(run_all)
    _print_search(report, base)
    for path in ([out / "search.json"] if out is not None else []) + ([json_path] if json_path is not None else []):
        from simulator.sweep import atomic_write_text

        atomic_write_text(path, json.dumps(_search_document(report), indent=1, default=str) + "\n")
        console.print(f"search written to {safe(path)}")


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
    if not math.isfinite(value):  # nan, inf, 1e999
        raise ScenarioError(f"{option} {text!r}: must be a finite number")
    if value <= 0:
        raise ScenarioError(f"{option} {text!r}: must be positive")
    return value


def _parse_node_count(text: str) -> int:
    """One ``--nodes`` entry: a whole positive number (``16``, ``1k``)."""
    value = _parse_count(text, "--nodes")
    if value != int(value):
        raise ScenarioError(f"--nodes {text!r}: a node count must be a whole number")
    return int(value)


def _print_search(report: Any, base: Any) -> None:
    from simulator.search import explain

    cluster = base.cluster
    console.print(f"[bold]{safe(base.model.label)}[/] " + safe(
        f"on {cluster.n_nodes} x {cluster.node_type.name} ({cluster.world_size} x {cluster.gpu_name}), global batch "
        f"{base.training.global_batch} x {base.model.seq_len} tokens, {base.training.precision}"))
    console.print(f"{report.enumerated} layouts: {report.invalid} invalid, {report.over_memory} over memory "
                  f"(estimate); {report.wall_s:.0f} s in all", highlight=False)
    for line in _stage_lines(report):
        console.print(f"  {line}", highlight=False)
    table = Table(title=f"best by {safe(report.objective)}", title_justify="left", box=box.SIMPLE_HEAD,
                  show_edge=False, pad_edge=False, padding=(0, 1), collapse_padding=True)
    for col in ("layout", "settings", "step", "tokens/s", "MFU", "free mem", "to train", "cost"):
        text = col in ("layout", "settings")
        table.add_column(col, justify="left" if text else "right", no_wrap=not text,
                         overflow="fold" if text else "ellipsis", min_width=9 if text else None)
    for i, ranked in enumerate(report.ranked, 1):
        lay, m = ranked.candidate.layout, ranked.metrics
        schedule = "no pipeline" if lay.pp == 1 else (lay.schedule if lay.virtual_stages == 1
                                                      else f"{lay.schedule} v={lay.virtual_stages}")
        sharding = lay.sharding if lay.shard_group_size is None else f"{lay.sharding} g={lay.shard_group_size}"
        cost = f"${ranked.cost_usd:,.0f}" if ranked.cost_usd is not None else "-"
        table.add_row(f"{i}. tp{lay.tp} pp{lay.pp} cp{lay.cp} dp{lay.dp} mb{lay.micro_batch}",
                      safe(f"{schedule}, {sharding}, recompute {ranked.candidate.recompute}"),
                      f"{m['step_time_s']:.2f} s", f"{m['tokens_per_s']:,.0f}",
                      f"{100 * m['mfu']:.1f}%", f"{m['memory_headroom_bytes'] / 2**30:.1f} GiB",
                      f"{ranked.time_to_train_s / 86400:,.1f} d"
                      + ("" if ranked.ettr is None else f" (ETTR {100 * ranked.ettr:.1f}%)"), cost)
    print_table(table)
    console.print(f"time to train: {report.tokens:.3g} tokens"
                  + (" (20 per parameter, Hoffmann et al. 2022)" if report.tokens_default else ""), highlight=False)
    for node, price in report.prices.items():
        kind = "an ESTIMATE: bought, not rented" if price.kind == "estimate" else price.kind
        console.print(safe(f"cost: {node} at ${price.usd_per_hour:,.2f} per node-hour ({kind}, {price.date}; "
                           f"{price.source})"), highlight=False, soft_wrap=True)
    if not report.prices:
        console.print("cost: no price for this node type (pass --prices FILE)", highlight=False)
    console.print("[bold]why the best wins[/]")
    for line in explain(report):
        console.print(f"  {safe(line)}", highlight=False, soft_wrap=True)


def _stage_lines(report: Any) -> list[str]:
    """What each stage of the layered search kept, and the bound that justified pruning."""
    cutoff = f"{report.cutoff_s:.3f} s" if report.cutoff_s is not None else "-"
    kept = (f"stage 2: {report.estimated} simulated (short runs; {report.simulated_oom} out of memory, "
            f"{report.retried} retried with heavier recomputation): those whose estimate less "
            f"{100 * report.margin:.0f}% (the estimate's error margin) or proven bound could still beat the "
            f"top {len(report.ranked) or '-'}'s simulated step ({cutoff}); {report.bounded_out} pruned")
    if report.capped:
        kept += f", {report.capped} not reached (--max-estimates)"
    return [f"stage 1: {report.stage1} candidates estimated in closed form ({report.stage1_s:.1f} s)",
            kept, f"stage 3: {report.simulated} simulated whole"]


def _search_document(report: Any) -> dict[str, Any]:
    return {
        "objective": report.objective,
        "tokens": report.tokens,
        "counts": {k: getattr(report, k) for k in ("enumerated", "invalid", "over_memory", "bounded_out", "capped",
                                                    "estimated", "simulated_oom", "failed", "simulated")},
        "ranked": [{"layout": r.label, "recompute": r.candidate.recompute, "time_to_train_s": r.time_to_train_s, "ettr": r.ettr,
                    "cost_usd": r.cost_usd, "metrics": r.metrics,
                    "scenario": r.scenario.model_dump(mode="json", by_alias=True)} for r in report.ranked],
        "stages": {"closed_form": {"candidates": report.stage1, "wall_s": report.stage1_s},
                   "short_runs": {"kept": report.estimated, "pruned": report.bounded_out, "margin": report.margin,
                                  "cutoff_step_s": report.cutoff_s},
                   "whole": {"simulated": report.simulated}},
        "estimated_step_s": dict(report.closed_form),
        "predicted_step_s": dict(report.predictions),
        "baseline": report.baseline,
        "prices": {k: v.model_dump() for k, v in report.prices.items()},
        "wall_s": report.wall_s,
    }


def _check_node_counts(counts: tuple[int, ...], gpus_per_node: int) -> None:
    from simulator import limits

    for count in counts:
        limits.check("nodes", count, what="cluster nodes", field="--nodes")
        limits.check("world_size", count * gpus_per_node, what=f"GPUs ({count:,} nodes x {gpus_per_node} GPUs)",
                     field="--nodes")

