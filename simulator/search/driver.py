"""The search itself: steps 4 (bound, then predict, best first) and 5 (confirm and rank) of
:mod:`simulator.search`, whose docstring describes each step; a naive data-parallel baseline
(PyTorch DDP, no model parallelism) is simulated beside.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from typing import Any

from simulator.errors import ScenarioError
from simulator.scenario import Scenario
from simulator.search.estimate import ESTIMATE_MARGIN, CommCoster, closed_form_s, terms_of
from simulator.search.prediction import Estimate, estimate_round, simulate_rows
from simulator.search.pricing import PriceTable, chinchilla_tokens, time_to_train_s, training_cost_usd
from simulator.search.pruning import admitted, screen
from simulator.search.report import Ranked, SearchReport
from simulator.search.space import Layout, Objective, SearchSpace, layout_scenario, scenario_json
from simulator.sweep import SweepProgress
from simulator.workload.builder import overlap_slowdown
from simulator.workload.memory_estimate import estimate_peak_memory

__all__ = ["search"]


def _score(objective: Objective, ranked: Ranked) -> float:
    """Smaller is better."""
    if objective == "throughput":
        return -float(ranked.metrics["tokens_per_s"])
    if objective == "time-to-train":
        return ranked.time_to_train_s
    return ranked.cost_usd if ranked.cost_usd is not None else math.inf


def search(
    base: Scenario,
    *,
    executor: Any,
    space: SearchSpace | None = None,
    objective: Objective = "throughput",
    tokens: float | None = None,
    prices: PriceTable | None = None,
    top: int = 10,
    batch: int = 8,
    max_estimates: int = 0,
    margin: float = ESTIMATE_MARGIN,
    cache_dir: str | None = None,
    progress: Callable[[str, SweepProgress], None] | None = None,
) -> SearchReport:
    """Search the layouts of ``base`` (:mod:`simulator.search`) and return the best ``top`` ranked by
    ``objective``.

    ``tokens``: the training budget for time and cost (default: 20 tokens per parameter);
    ``prices``: the node price table (needed for ``cost``); ``batch``: candidates estimated
    per round (keep it a few times the executor's workers); ``max_estimates``: stop after
    estimating this many candidates, most promising first (0: until the bound says stop);
    ``margin``: stage 2 keeps every candidate whose closed-form estimate times ``1 - margin``
    could still enter the top (default :data:`~simulator.search.estimate.ESTIMATE_MARGIN`,
    the estimate's measured error; 1: only the proven bound prunes);
    ``cache_dir``: keep simulated points there (a rerun is then nearly free);
    ``progress(stage, state)`` is called as points finish.
    """
    import tempfile
    import time

    space = space or SearchSpace()
    if base.reliability is not None and objective != "throughput" and len(space.nodes or ()) > 1:
        return _search_each_cluster_size(base, space, objective, top, dict(
            executor=executor, tokens=tokens, prices=prices, batch=batch, max_estimates=max_estimates, margin=margin,
            cache_dir=cache_dir, progress=progress))
    start = time.perf_counter()
    node = base.cluster.node_type.name
    price = prices.get(node) if prices is not None else None
    if objective == "cost" and price is None:
        raise ScenarioError(f"no price for node type {node!r} in the price table; pass --prices FILE",
                            field="--objective cost")
    budget = float(tokens) if tokens is not None else chinchilla_tokens(_params(base))
    report = SearchReport(objective, budget, tokens_default=tokens is None,
                          prices={node: price} if price is not None else {})
    base_json = scenario_json(base)
    profile = _profile(base)

    def score(step_s: float, layout: Layout) -> float:
        """The objective of a step time (smaller is better)."""
        tps = base.tokens_per_step / step_s
        if objective == "throughput":
            return -tps
        hours = budget / tps / 3600.0
        if objective == "time-to-train":
            return hours
        assert price is not None
        return hours * layout.nodes * price.usd_per_hour

    # stage 1: every candidate's closed-form estimate, in one vectorised pass over their terms
    t1 = time.perf_counter()
    screened = screen(base, space, report, executor, chunks=max(2, batch // 2))
    slowdown = overlap_slowdown(base)
    estimates_s = closed_form_s([t for _, t in screened], slowdown)
    report.candidates = report.stage1 = len(screened)
    report.margin = margin
    report.stage1_s = time.perf_counter() - t1

    def lower(step_estimate_s: float, bound_s: float) -> float:
        """What the simulated step cannot be below: the proven bound, or the estimate less its margin."""
        return max(bound_s, (1.0 - margin) * step_estimate_s)

    queue = [(score(lower(float(e), t.bound_s), c.layout), c) for (c, t), e in zip(screened, estimates_s, strict=True)]
    report.closed_form = sorted(((c.label, float(e)) for (c, _), e in zip(screened, estimates_s, strict=True)),
                                key=lambda item: item[1])
    queue.sort(key=lambda item: (item[0], item[1].label))
    estimates: list[tuple[float, Estimate]] = []
    threshold = math.inf
    comm: CommCoster | None = None
    with tempfile.TemporaryDirectory(prefix="dtsim-search-") as scratch:
        folder = cache_dir or scratch
        stage = 1
        while queue and queue[0][0] <= threshold:
            if max_estimates and report.estimated >= max_estimates:
                report.capped = len(queue)
                queue = []
                break
            round_ = [cand for bound, cand in queue[:batch] if bound <= threshold]  # a prefix: queue is sorted
            queue = queue[len(round_):]
            for est in estimate_round(round_, folder, executor, progress, f"stage 2, round {stage}"):
                report.estimated += 1
                cand = est.candidate
                if est.oom:
                    report.simulated_oom += 1
                    heavier = admitted(base_json, cand)  # the next heavier recompute policy the estimate admits
                    if heavier is not None:
                        report.retried += 1
                        comm = comm or CommCoster(base)
                        terms = terms_of(heavier.scenario, profile, comm)
                        again = float(closed_form_s([terms], slowdown)[0])
                        bisect.insort(queue, (score(lower(again, terms.bound_s), heavier.layout), heavier),
                                      key=lambda item: (item[0], item[1].label))
                elif est.error is not None:
                    report.failed += 1
                else:
                    assert est.step_s is not None
                    estimates.append((score(est.step_s, cand.layout), est))
            estimates.sort(key=lambda item: (item[0], item[1].candidate.label))
            if len(estimates) >= top:
                threshold = estimates[top - 1][0]
            stage += 1
        report.bounded_out = len(queue)
        report.cutoff_s = estimates[top - 1][1].step_s if top and len(estimates) >= top else None
        report.predictions = [(e.candidate.label, e.step_s) for _, e in estimates]
        best = [e.candidate for _, e in estimates[:max(1, top)]]
        baseline, naive = _baseline(base)  # simulated beside the finalists, in the same sweep
        rows = simulate_rows([c.scenario for c in best] + ([naive] if naive is not None else []), folder, executor,
                             progress, "stage 3: simulate whole")
        report.simulated = len(best)
        report.baseline = _baseline_verdict(baseline, rows[len(best)] if naive is not None else None)
        rows = rows[:len(best)]

    for cand, row in zip(best, rows, strict=True):
        if row.get("error") is not None:
            report.failed += 1
            continue
        seconds = time_to_train_s(budget, float(row["tokens_per_s"]))
        ettr = row.get("goodput_ettr")
        if ettr is not None:  # a reliability section: the expected wall-clock with failures (simulator/goodput/)
            seconds /= float(ettr)  # ETTR = failure-free time / expected wall-clock, on this layout's nodes
        cost = training_cost_usd(seconds, cand.layout.nodes, price) if price is not None else None
        report.ranked.append(Ranked(cand, row, budget, seconds, cost, None if ettr is None else float(ettr)))
    report.ranked.sort(key=lambda r: (_score(objective, r), r.label))
    report.wall_s = time.perf_counter() - start
    return report


def _profile(base: Scenario) -> Any:
    from simulator.workload import compute_profile

    return compute_profile(base.cluster.gpu_spec, base.cluster.calibration)


def _params(base: Scenario) -> float:
    from simulator.workload.layout import ModelLayout

    return float(ModelLayout(base).counts.total)


def _baseline(base: Scenario) -> tuple[dict[str, Any], Scenario | None]:
    """Naive data parallelism on the base cluster: PyTorch DDP, no model parallelism, no
    recomputation, the base micro-batch; its memory estimated, and its scenario to simulate
    (None when invalid)."""
    cluster = base.cluster
    layout = Layout(cluster.n_nodes, 1, 1, 1, cluster.world_size, base.training.micro_batch, "1f1b", 1, "none", None)
    out: dict[str, Any] = {"label": layout.label + " rc=none"}
    try:
        scenario = layout_scenario(scenario_json(base), layout, "none")
    except ScenarioError as exc:
        out.update(verdict="invalid", reason=str(exc))
        return out, None
    out["estimated_peak_bytes"] = estimate_peak_memory(scenario).peak_bytes
    return out, scenario


def _baseline_verdict(out: dict[str, Any], row: dict[str, Any] | None) -> dict[str, Any]:
    """The baseline's entry with its simulated row (``row`` None: it was invalid)."""
    if row is None:
        return out
    out["metrics"] = row
    out["verdict"] = "out of memory" if row.get("oom") else ("failed" if row.get("error") else "fits")
    if row.get("error"):
        out["reason"] = row["error"]
    return out


_SUMMED = ("enumerated", "invalid", "over_memory", "candidates", "retried", "bounded_out", "capped", "estimated",
           "simulated_oom", "failed", "simulated", "stage1")


def _search_each_cluster_size(base: Scenario, space: SearchSpace, objective: Objective, top: int,
                              options: dict[str, Any]) -> SearchReport:
    """The search of a scenario with a ``reliability`` section over several node counts, for
    time-to-train or cost: one search per node count, their finalists ranked together by the
    expected wall-clock with failures. Within one node count every layout sees the same
    failure process (the job's rate is the sum of its nodes', simulator/goodput/) and the same
    checkpoint, so ETTR differs between them only by the interval's rounding to whole steps
    and, with ``elastic``, by the replicas a lost node takes: the failure-free pruning holds
    there up to that, and the finalists are ranked by their own ETTR. Across node counts it
    does not hold (a larger cluster fails more often), which is why the sizes are searched
    apart and joined only by the whole simulations' goodput."""
    import tempfile
    import time
    from dataclasses import replace

    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dtsim-search-") as scratch:
        # one cache for every size: the naive baseline each part simulates is the same point
        shared = {**options, "cache_dir": options["cache_dir"] or scratch}
        parts = [search(base, space=replace(space, nodes=(n,)), objective=objective, top=top, **shared)
                 for n in space.nodes or ()]
    joined = parts[0]
    for part in parts[1:]:
        for name in _SUMMED:
            setattr(joined, name, getattr(joined, name) + getattr(part, name))
        joined.stage1_s += part.stage1_s
        joined.closed_form += part.closed_form
        joined.predictions += part.predictions
        joined.ranked += part.ranked
        joined.prices.update(part.prices)
        joined.baseline = joined.baseline or part.baseline
    joined.closed_form.sort(key=lambda item: item[1])
    joined.cutoff_s = None  # one per node count
    joined.ranked.sort(key=lambda r: (_score(objective, r), r.label))
    del joined.ranked[top:]
    joined.wall_s = time.perf_counter() - start
    return joined
