"""Strategy search: the fastest (or cheapest) way to train a scenario's model on its cluster.

    report = search(load_scenario("scenarios/llama3-70b-fsdp-p5.yaml"), executor=pool)
    report.ranked[0].scenario            # the winner, a full Scenario
    explain(report)                      # why it wins, from its simulated breakdown

Steps:

1. **Enumerate** layouts of the scenario's model on its cluster (or on each ``nodes`` count
   asked for): tp (powers of two, within a node), cp (powers of two keeping at least
   ``min_tokens_per_cp_rank`` tokens per rank), pp (powers of two), dp = world / (tp*cp*pp),
   micro-batch (powers of two up to ``max_micro_batch``), schedule (1F1B, and interleaved 1F1B
   with ``virtual_stages`` when pp > 1) and sharding (every strategy; HSDP and MiCS with
   shard groups of one node's data-parallel ranks). Sequence parallelism is on whenever
   tp > 1 (it only removes activation memory; Korthikanti et al. 2022). GPipe is left out:
   it has 1F1B's bubble and holds all micro-batches' activations (Narayanan et al. 2021).
   Sharding is left out where there is only one data-parallel rank.
2. **Prune invalid layouts**: whatever :class:`~simulator.scenario.Scenario` validation
   rejects (:class:`~simulator.errors.InfeasibleError`: tp does not divide the heads, pp*v
   does not split the layers, the batch does not split, ZeRO-2/3 with pipelines, ...).
3. **Prune out-of-memory ones** with :func:`~simulator.memory_estimate.estimate_peak_memory`,
   a lower estimate: what it rejects cannot fit. Recomputation only trades time for memory,
   so each layout starts with the lightest policy (none, selective, full) the estimate admits;
   a heavier one is simulated only if the lighter one runs out of memory in the simulation.
4. **Bound, then predict, best first** (branch and bound): every candidate gets a lower bound
   of its step time from its own compute and unhidden tensor-parallel traffic
   (:func:`step_bound_s`, milliseconds) and the candidates are taken in order of that bound,
   a ``batch`` at a time. Each one's step time
   is predicted from two short simulations instead of a whole one
   (:func:`probe_micro_batches`): past the pipeline's fill every further micro-batch adds
   the same time, so runs with ``m1`` and ``2*m1`` micro-batches give the step with ``m``
   (and the same peak memory: the same micro-batches are in flight); candidates with few
   micro-batches are simulated whole. The search stops when the next bound cannot beat the
   ``top``-th best prediction: nothing left can enter the top. A candidate that runs out of
   memory in the simulation goes back in the queue with its next heavier recompute policy.
5. **Confirm and rank**: the ``top`` best predictions are simulated whole (every point goes
   through :func:`simulator.sweep.run_sweep`: any executor, cached in ``cache_dir`` when
   given) and ranked by the objective: ``throughput`` (tokens/s), ``time-to-train`` (hours
   for ``tokens``) or ``cost`` (dollars for ``tokens`` at the node type's hourly price). On
   one cluster the three orders agree (time and cost are both proportional to
   1 / throughput); they differ when several ``nodes`` counts are searched.

A naive data-parallel baseline (PyTorch DDP, no model parallelism) is simulated beside, and
:func:`explain` says why the best wins from the simulated breakdowns.
"""

from __future__ import annotations

import bisect
import copy
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from simulator.errors import ScenarioError
from simulator.memory_estimate import MemoryEstimate, estimate_peak_memory
from simulator.pricing import PriceTable, chinchilla_tokens, time_to_train_s, training_cost_usd
from simulator.scenario import Scenario
from simulator.scenario.parallelism import drop_foreign_options
from simulator.sweep import SweepProgress, run_sweep
from simulator.sweepfile import SweepPoint, set_path

__all__ = ["SearchSpace", "Layout", "Candidate", "Ranked", "SearchReport", "search", "explain", "Objective",
           "RECOMPUTE_ORDER", "enumerate_layouts"]

Objective = Literal["throughput", "cost", "time-to-train"]
RECOMPUTE_ORDER = ("none", "selective", "full")


@dataclass(frozen=True)
class SearchSpace:
    """Bounds of the enumeration (``None``: derived from the model and cluster, see the module
    docstring)."""

    nodes: tuple[int, ...] | None = None
    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    cp: tuple[int, ...] | None = None
    micro_batch: tuple[int, ...] | None = None
    max_micro_batch: int = 8
    virtual_stages: tuple[int, ...] = (2, 4)
    shardings: tuple[str, ...] = ("none", "zero1", "zero2", "zero3", "fsdp", "hsdp", "mics")
    recompute: tuple[str, ...] = RECOMPUTE_ORDER
    min_tokens_per_cp_rank: int = 4096


@dataclass(frozen=True)
class Layout:
    """A parallel layout without its recomputation policy."""

    nodes: int
    tp: int
    pp: int
    cp: int
    dp: int
    micro_batch: int
    schedule: str
    virtual_stages: int
    sharding: str
    shard_group_size: int | None

    def overrides(self, recompute: str) -> dict[str, Any]:
        """Scenario field -> value of this layout with ``recompute`` (``None``: the default)."""
        return {
            "cluster.nodes": self.nodes,
            "parallelism.tp": self.tp,
            "parallelism.pp": self.pp,
            "parallelism.cp": self.cp,
            "parallelism.dp": "auto",
            "parallelism.sequence_parallel": self.tp > 1,
            "parallelism.pipeline_schedule": self.schedule,
            "parallelism.virtual_stages": self.virtual_stages,
            "parallelism.stage_layers": None,
            "parallelism.sharding": self.sharding,
            "parallelism.shard_group_size": self.shard_group_size,
            "parallelism.offload_optimizer": False,
            "training.micro_batch": self.micro_batch,
            "training.recompute": recompute,
        }

    @property
    def label(self) -> str:
        """``"tp8 pp4 cp1 dp2 mb1 interleaved(v=2) zero1"``."""
        schedule = self.schedule if self.virtual_stages == 1 else f"{self.schedule}(v={self.virtual_stages})"
        sharding = self.sharding if self.shard_group_size is None else f"{self.sharding}(g={self.shard_group_size})"
        parts = [f"tp{self.tp}", f"pp{self.pp}", f"cp{self.cp}", f"dp{self.dp}", f"mb{self.micro_batch}"]
        if self.pp > 1:
            parts.append(schedule)
        return " ".join([*parts, sharding])


@dataclass(frozen=True)
class Candidate:
    """A layout with a recomputation policy, validated, and its memory estimate."""

    layout: Layout
    recompute: str
    scenario: Scenario
    memory: MemoryEstimate
    fallbacks: tuple[str, ...] = ()  # heavier recompute policies to try if this one runs out of memory

    @property
    def label(self) -> str:
        return f"{self.layout.label} rc={self.recompute}"


@dataclass(frozen=True)
class Ranked:
    """A simulated candidate that fits, with its metrics and what it would take to train."""

    candidate: Candidate
    metrics: dict[str, Any]
    tokens: float
    time_to_train_s: float
    cost_usd: float | None

    @property
    def scenario(self) -> Scenario:
        return self.candidate.scenario

    @property
    def label(self) -> str:
        return self.candidate.label


@dataclass
class SearchReport:
    """Everything a search did: counts at each step, the ranking, and the naive baseline."""

    objective: Objective
    tokens: float
    tokens_default: bool = True  # the budget is the Chinchilla rule's, not the caller's
    enumerated: int = 0
    invalid: int = 0
    over_memory: int = 0
    candidates: int = 0  # layouts left after both prunings, each with its lightest admitted recompute policy
    retried: int = 0  # candidates queued again with a heavier recompute policy after running out of memory
    bounded_out: int = 0  # candidates whose step bound could not beat the top predictions
    capped: int = 0  # candidates left when max_estimates was reached
    estimated: int = 0  # candidates whose step time was predicted from short runs (or simulated whole)
    simulated_oom: int = 0  # of those, out of memory in the simulation
    failed: int = 0
    simulated: int = 0  # best predictions simulated whole
    predictions: list[tuple[str, float | None]] = field(default_factory=list)  # label, predicted step (s), best first
    ranked: list[Ranked] = field(default_factory=list)
    baseline: dict[str, Any] | None = None  # plain DDP: label, verdict, metrics
    prices: dict[str, Any] = field(default_factory=dict)  # node type -> NodePrice used
    wall_s: float = 0.0


# ----------------------------------------------------------------------------------------
# enumeration


def _powers_of_two(limit: int) -> list[int]:
    return [2**k for k in range(int(math.log2(max(1, limit))) + 1)]


def enumerate_layouts(base: Scenario, space: SearchSpace) -> Iterator[Layout]:
    """Every layout of the space for ``base``'s model and cluster (not yet validated)."""
    model, cluster, train = base.model, base.cluster, base.training
    gpn = cluster.gpus_in_node
    for nodes in space.nodes or (cluster.n_nodes,):
        world = nodes * gpn
        tps = space.tp or tuple(_powers_of_two(gpn))
        cps = space.cp or tuple(c for c in _powers_of_two(world) if model.seq_len // c >= space.min_tokens_per_cp_rank)
        pps = space.pp or tuple(_powers_of_two(min(world, model.layers)))
        for tp, cp, pp in itertools.product(tps, cps or (1,), pps):
            if world % (tp * cp * pp):
                continue
            dp = world // (tp * cp * pp)
            per_replica = train.global_batch // dp if train.global_batch % dp == 0 else 0
            mbs = space.micro_batch or tuple(m for m in _powers_of_two(space.max_micro_batch) if m <= per_replica)
            schedules = [("1f1b", 1)] + ([("interleaved", v) for v in space.virtual_stages] if pp > 1 else [])
            for mb, (schedule, v), sharding in itertools.product(mbs, schedules, space.shardings):
                if sharding != "none" and dp * cp == 1:
                    continue  # nothing to shard over
                group: int | None = None
                if sharding in ("hsdp", "mics"):
                    group = gpn // (tp * cp) if gpn % (tp * cp) == 0 else 0
                    if not 1 < group < dp or dp % group:
                        continue  # one node's replicas must be a proper divisor of dp
                yield Layout(nodes, tp, pp, cp, dp, mb, schedule, v, sharding, group)


def _scenario(base_json: dict[str, Any], layout: Layout, recompute: str) -> Scenario:
    """``base`` (as its JSON mapping) with the layout's fields set; raises ScenarioError."""
    data = copy.deepcopy(base_json)
    for path, value in layout.overrides(recompute).items():
        set_path(data, path, value)
    data["parallelism"] = drop_foreign_options(data["parallelism"])  # the base's options of another sharding
    return Scenario.model_validate(data)


def candidates(base: Scenario, space: SearchSpace, report: SearchReport) -> list[Candidate]:
    """Validated layouts, each with the lightest recompute policy the memory estimate admits
    and the heavier admitted ones as fallbacks (counts of enumerated, invalid and
    over-memory layouts go to ``report``)."""
    base_json = base.model_dump(mode="json", by_alias=True)
    out = []
    for layout in enumerate_layouts(base, space):
        report.enumerated += 1
        try:  # validity does not depend on the recompute policy
            scenarios = [(r, _scenario(base_json, layout, r)) for r in space.recompute]
        except ScenarioError:  # InfeasibleError and friends
            report.invalid += 1
            continue
        fitting = [(r, sc, mem) for r, sc in scenarios if (mem := estimate_peak_memory(sc)).fits]
        if not fitting:
            report.over_memory += 1
            continue
        recompute, scenario, memory = fitting[0]
        out.append(Candidate(layout, recompute, scenario, memory, tuple(r for r, _, _ in fitting[1:])))
    return out


# ----------------------------------------------------------------------------------------
# running


def _score(objective: Objective, ranked: Ranked) -> float:
    """Smaller is better."""
    if objective == "throughput":
        return -float(ranked.metrics["tokens_per_s"])
    if objective == "time-to-train":
        return ranked.time_to_train_s
    return ranked.cost_usd if ranked.cost_usd is not None else math.inf


def probe_micro_batches(scenario: Scenario) -> tuple[int, int] | None:
    """Micro-batch counts ``(m1, 2*m1)`` of the two short runs that predict ``scenario``'s
    step time, or None when it is cheaper to simulate it whole (``m < 3*m1``).

    ``m1`` is the smallest count that fills the pipeline as the full run does: ``pp`` for
    1F1B (``pp - stage`` micro-batches in flight at most), ``2*pp`` interleaved (its warm-up
    holds up to ``2*(pp-1) + (v-1)*pp + 1`` chunks), 1 without pipeline. Past that the step
    grows by the same time per micro-batch (steady state), so
    ``step(m) = step(m1) + (m - m1) * (step(2*m1) - step(m1)) / m1``, and the peak memory is
    the full run's. This is exact (to round-off) for DDP, ZeRO-1/2, FSDP and every pipeline
    schedule in ``tests/test_search.py``; ZeRO-3 (and MiCS, built on it), whose prefetching depends on what
    the previous micro-batch left gathered, come within a fraction of a percent (0.3 % on
    Llama 3 70B). The ranking printed is always from whole simulations.
    """
    par = scenario.parallelism
    m1 = 2 * par.pp if par.pipeline_schedule == "interleaved" else par.pp
    if scenario.micro_batches < 3 * m1:
        return None
    return m1, 2 * m1


def step_bound_s(scenario: Scenario, profile: Any = None) -> float:
    """A lower bound of the simulated step time, from the busiest pipeline stage's own work.

    Per micro-batch, a stage runs its layers' forward and backward steps
    (:meth:`WorkloadBuilder.steps`, costed as the simulator costs them; a second forward per
    layer under ``full`` recomputation, ``selective``'s replay is in the backward). The
    tensor- and context-parallel collectives between those steps that nothing overlaps are
    charged their least possible time: every rank must receive ``(n-1)/n`` of the bytes
    through its NVLink (or PCIe) port, ``(n-1)/n * nbytes / port bandwidth``. The step is at
    least ``m`` times that; with 1F1B the first stage also waits, before its first backward,
    for micro-batch 0 to go through the later stages and back, less the forwards it runs
    meanwhile. No other communication, bubble or the optimizer step: the simulated step is
    never shorter.
    """
    from simulator.cluster.mesh import Mesh
    from simulator.workload import WorkloadBuilder, compute_profile
    from simulator.workload.tensor_parallel import CommStep

    par, cluster = scenario.parallelism, scenario.cluster
    if profile is None:
        profile = compute_profile(cluster.gpu_spec, cluster.calibration)
    mesh = Mesh(par.tp, par.cp, par.pp, scenario.dp, par.shard_group_size)
    builder = WorkloadBuilder(scenario, mesh, profile, gpus_per_node=cluster.gpus_in_node, symmetric=True)
    gpu = cluster.gpu_spec
    port_bytes_per_s = max(gpu.nvlink.bandwidth_bytes_per_s if gpu.nvlink else 0.0,
                           cluster.node_type.pcie.x16_bytes_per_s)
    group = {"tp": par.tp, "cp": par.cp}

    def seconds(kind: str, phase: str) -> float:
        total = 0.0
        for timed in builder.steps(kind, phase):
            step = timed.step
            if isinstance(step, CommStep):
                n = group.get(step.axis, 1)
                if not step.overlap and n > 1:
                    total += (n - 1) / n * step.nbytes / port_bytes_per_s
            else:
                total += timed.duration_s
        return total

    fwd = {kind: seconds(kind, "fwd") for kind in ("embedding", "block", "logits")}
    bwd = {kind: seconds(kind, "bwd") for kind in ("embedding", "block", "logits")}
    if scenario.training.recompute == "full":
        bwd["block"] += fwd["block"]
    forward, backward = [], []  # per stage, one micro-batch through all its chunks
    for stage in range(par.pp):
        f = b = 0.0
        for chunk in builder.layout.chunks_of_stage(stage):
            units = [("block", len(chunk.layers)), ("embedding", int(chunk.embedding)), ("logits", int(chunk.logits))]
            f += sum(n * fwd[kind] for kind, n in units)
            b += sum(n * bwd[kind] for kind, n in units)
        forward.append(f)
        backward.append(b)
    m = scenario.micro_batches
    bound = m * max(f + b for f, b in zip(forward, backward, strict=True))
    if par.pp > 1 and par.pipeline_schedule == "1f1b":
        # stage 0 runs p forwards, then waits for micro-batch 0's forward and backward through
        # every later stage before its first backward (Narayanan et al. 2021, Fig. 4)
        wait = sum(forward[1:]) + sum(backward[1:]) - (min(par.pp, m) - 1) * forward[0]
        bound = max(bound, m * (forward[0] + backward[0]) + max(0.0, wait))
    return bound


def _with_micro_batches(scenario: Scenario, m: int) -> Scenario:
    data = scenario.model_dump(mode="json", by_alias=True)
    data["training"]["global_batch"] = m * scenario.training.micro_batch * scenario.dp
    return Scenario.model_validate(data)


@dataclass
class _Estimate:
    candidate: Candidate
    step_s: float | None = None
    oom: bool = False
    error: str | None = None
    row: dict[str, Any] | None = None  # the full run's row when it was simulated whole


def _estimate_round(cands: Sequence[Candidate], folder: str, executor: Any,
                    progress: Callable[[str, SweepProgress], None] | None, stage: str) -> list[_Estimate]:
    """Short runs (or whole ones) of every candidate, and the step time they predict."""
    points: list[Scenario] = []
    plans: list[tuple[int, ...]] = []
    for cand in cands:
        probe = probe_micro_batches(cand.scenario)
        if probe is None:
            plans.append((len(points),))
            points.append(cand.scenario)
        else:
            plans.append((len(points), len(points) + 1, *probe))
            points.extend(_with_micro_batches(cand.scenario, m) for m in probe)
    rows = _simulate(points, folder, executor, progress, stage)
    out = []
    for cand, plan in zip(cands, plans, strict=True):
        first = rows[plan[0]]
        est = _Estimate(cand)
        if len(plan) == 1:
            est.row = first
        runs = [rows[i] for i in plan[:2] if len(plan) > 1] or [first]
        if any(r.get("oom") for r in runs):
            est.oom = True
        elif any(r.get("error") for r in runs):
            est.error = next(r["error"] for r in runs if r.get("error"))
        elif len(plan) == 1:
            est.step_s = float(first["step_time_s"])
        else:
            m1, m2 = plan[2], plan[3]
            s1, s2 = float(runs[0]["step_time_s"]), float(runs[1]["step_time_s"])
            est.step_s = s1 + (cand.scenario.micro_batches - m1) * (s2 - s1) / (m2 - m1)
        out.append(est)
    return out


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
    cache_dir: str | None = None,
    progress: Callable[[str, SweepProgress], None] | None = None,
) -> SearchReport:
    """Search the layouts of ``base`` (module docstring) and return the best ``top`` ranked by
    ``objective``.

    ``tokens``: the training budget for time and cost (default: 20 tokens per parameter);
    ``prices``: the node price table (needed for ``cost``); ``batch``: candidates estimated
    per round (keep it a few times the executor's workers); ``max_estimates``: stop after
    estimating this many candidates, most promising first (0: until the bound says stop);
    ``cache_dir``: keep simulated points there (a rerun is then nearly free);
    ``progress(stage, state)`` is called as points finish.
    """
    import tempfile
    import time

    space = space or SearchSpace()
    start = time.perf_counter()
    node = base.cluster.node_type.name
    price = prices.get(node) if prices is not None else None
    if objective == "cost" and price is None:
        raise ScenarioError(f"no price for node type {node!r} in the price table; pass --prices FILE",
                            field="--objective cost")
    budget = float(tokens) if tokens is not None else chinchilla_tokens(_params(base))
    report = SearchReport(objective, budget, tokens_default=tokens is None,
                          prices={node: price} if price is not None else {})
    base_json = base.model_dump(mode="json", by_alias=True)
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

    queue = [(score(step_bound_s(c.scenario, profile), c.layout), c) for c in candidates(base, space, report)]
    report.candidates = len(queue)
    queue.sort(key=lambda item: (item[0], item[1].label))
    estimates: list[tuple[float, _Estimate]] = []
    threshold = math.inf
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
            for est in _estimate_round(round_, folder, executor, progress, f"estimate {stage}"):
                report.estimated += 1
                cand = est.candidate
                if est.oom:
                    report.simulated_oom += 1
                    if cand.fallbacks:  # the next heavier recompute policy the estimate admitted
                        report.retried += 1
                        heavier = replace(cand, recompute=cand.fallbacks[0], fallbacks=cand.fallbacks[1:],
                                          scenario=_scenario(base_json, cand.layout, cand.fallbacks[0]))
                        bisect.insort(queue, (score(step_bound_s(heavier.scenario, profile), heavier.layout),
                                              heavier), key=lambda item: (item[0], item[1].label))
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
        report.predictions = [(e.candidate.label, e.step_s) for _, e in estimates]
        best = [e.candidate for _, e in estimates[:max(1, top)]]
        rows = _simulate([c.scenario for c in best], folder, executor, progress, "confirm")
        report.simulated = len(best)
        report.baseline = _baseline(base, folder, executor, progress)

    for cand, row in zip(best, rows, strict=True):
        if row.get("error") is not None:
            report.failed += 1
            continue
        seconds = time_to_train_s(budget, float(row["tokens_per_s"]))
        cost = training_cost_usd(seconds, cand.layout.nodes, price) if price is not None else None
        report.ranked.append(Ranked(cand, row, budget, seconds, cost))
    report.ranked.sort(key=lambda r: (_score(objective, r), r.label))
    report.wall_s = time.perf_counter() - start
    return report


def _profile(base: Scenario) -> Any:
    from simulator.workload import compute_profile

    return compute_profile(base.cluster.gpu_spec, base.cluster.calibration)


def _params(base: Scenario) -> float:
    from simulator.workload.plan import ModelLayout

    return float(ModelLayout(base).counts.total)


def _simulate(scenarios: Sequence[Scenario], folder: str, executor: Any,
              progress: Callable[[str, SweepProgress], None] | None, stage: str) -> list[dict[str, Any]]:
    points = [SweepPoint(i, {}, s) for i, s in enumerate(scenarios)]
    hook = None if progress is None else (lambda state: progress(stage, state))
    return run_sweep(points, folder, executor=executor, varied=[], progress=hook).rows


def _baseline(base: Scenario, folder: str, executor: Any,
              progress: Callable[[str, SweepProgress], None] | None) -> dict[str, Any]:
    """Naive data parallelism on the base cluster: PyTorch DDP, no model parallelism, no
    recomputation, the base micro-batch. Its memory is estimated and it is simulated."""
    cluster = base.cluster
    layout = Layout(cluster.n_nodes, 1, 1, 1, cluster.world_size, base.training.micro_batch, "1f1b", 1, "none", None)
    out: dict[str, Any] = {"label": layout.label + " rc=none"}
    try:
        scenario = _scenario(base.model_dump(mode="json", by_alias=True), layout, "none")
    except ScenarioError as exc:
        out.update(verdict="invalid", reason=str(exc))
        return out
    out["estimated_peak_bytes"] = estimate_peak_memory(scenario).peak_bytes
    row = _simulate([scenario], folder, executor, progress, "baseline")[0]
    out["metrics"] = row
    out["verdict"] = "out of memory" if row.get("oom") else ("failed" if row.get("error") else "fits")
    if row.get("error"):
        out["reason"] = row["error"]
    return out


# ----------------------------------------------------------------------------------------
# explanation


_COMPONENTS = (("bubble_s", "pipeline bubble"), ("compute_s", "compute"), ("idle_s", "idle time"))


def explain(report: SearchReport) -> list[str]:
    """Sentences on why the best configuration wins, from the simulated results: its step
    against the runner-up's, the components of the step that differ most (compute, exposed
    communication by kind, bubble, idle), recomputation, memory headroom, and the naive
    data-parallel baseline's verdict."""
    if not report.ranked:
        return ["no configuration fits: every layout was invalid or out of memory"]
    best = report.ranked[0]
    b = best.metrics
    recompute = ("without activation recomputation" if best.candidate.recompute == "none"
                 else f"with {best.candidate.recompute} activation recomputation")
    lines = [f"{best.label}: {b['tokens_per_s']:,.0f} tokens/s, step {b['step_time_s']:.3f} s, "
             f"MFU {100 * b['mfu']:.1f}%; it fits {recompute}, peak {b['peak_memory_bytes'] / 2**30:.1f} GiB of "
             f"{b['gpu_memory_bytes'] / 2**30:.0f} GiB."]
    if len(report.ranked) > 1:
        second = report.ranked[1]
        lines.append(_versus(best, second, "the runner-up"))
    baseline = report.baseline or {}
    verdict = baseline.get("verdict")
    if verdict == "out of memory":
        peak = baseline["metrics"]["peak_memory_bytes"] / 2**30
        lines.append(f"Naive data parallelism ({baseline['label']}) does not fit: {peak:.0f} GiB per GPU.")
    elif verdict == "fits":
        naive = baseline["metrics"]
        gain = b["tokens_per_s"] / naive["tokens_per_s"]
        lines.append(f"Naive data parallelism ({baseline['label']}) fits at {naive['tokens_per_s']:,.0f} tokens/s; "
                     f"the best is {gain:.2f}x faster.")
    elif verdict is not None:
        lines.append(f"Naive data parallelism is {verdict}: {baseline.get('reason', '')}")
    return lines


def _versus(best: Ranked, other: Ranked, name: str) -> str:
    a, b = best.metrics, other.metrics
    step_a, step_b = float(a["step_time_s"]), float(b["step_time_s"])
    parts = []
    diffs = []
    for key, label in _COMPONENTS:
        diffs.append((float(b.get(key) or 0.0) - float(a.get(key) or 0.0), label))
    kinds = {k[len("exposed_comm_"):-2] for k in (*a, *b) if k.startswith("exposed_comm_") and k != "exposed_comm_s"}
    for kind in sorted(kinds):
        key = f"exposed_comm_{kind}_s"
        diffs.append((float(b.get(key) or 0.0) - float(a.get(key) or 0.0), f"exposed {kind} communication"))
    diffs.sort(key=lambda d: -abs(d[0]))
    for delta, label in diffs[:3]:
        if abs(delta) < 0.005 * step_b:
            continue
        parts.append(f"{'less' if delta > 0 else 'more'} {label} ({abs(delta):.3f} s {'saved' if delta > 0 else 'added'})")
    per_step = 100 * (step_b - step_a) / step_b if step_b > 0 else 0.0
    text = f"Against {name} ({other.label}): step {step_a:.3f} s vs {step_b:.3f} s ({per_step:.1f}% shorter)"
    if best.candidate.scenario.world_size != other.candidate.scenario.world_size:
        text += f" on {best.candidate.scenario.world_size} vs {other.candidate.scenario.world_size} GPUs"
    if parts:
        text += "; " + ", ".join(parts)
    rec_a, rec_b = best.candidate.recompute, other.candidate.recompute
    if rec_a != rec_b:
        order = {r: i for i, r in enumerate(RECOMPUTE_ORDER)}
        if order[rec_a] < order[rec_b]:
            text += f"; it fits with {rec_a} recomputation where {name} needs {rec_b}"
        else:
            text += f"; it recomputes ({rec_a}) and still wins"
    headroom = (float(a["memory_headroom_bytes"]) - float(b["memory_headroom_bytes"])) / 2**30
    if abs(headroom) >= 1:
        text += f"; {abs(headroom):.1f} GiB {'more' if headroom > 0 else 'less'} memory headroom"
    return text + "."
