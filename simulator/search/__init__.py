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
   Sharding is left out where there is only one data-parallel rank. For MoE models, ep (the
   powers of two dividing the experts) and etp (the default, tp, and the other powers of two
   up to a node) too.
2. **Prune invalid layouts**: whatever :class:`~simulator.scenario.Scenario` validation
   rejects (:class:`~simulator.errors.InfeasibleError`: tp does not divide the heads, pp*v
   does not split the layers, the batch does not split, ZeRO-2/3 with pipelines, ...).
3. **Prune out-of-memory ones** with :func:`~simulator.workload.memory_estimate.estimate_peak_memory`,
   a lower estimate: what it rejects cannot fit. Recomputation only trades time for memory,
   so each layout starts with the lightest policy (none, selective, full) the estimate admits;
   a heavier one is simulated only if the lighter one runs out of memory in the simulation.
4. **Stage 1: estimate every candidate in closed form**
   (:mod:`~simulator.search.estimate`): each candidate is reduced to a few terms taken from
   the simulator's own cost functions (its layers' kernels, NCCL's alpha-beta model of its
   collectives, the strategy's traffic and the framework's overlaps, the optimizer step) and
   every step is assembled in one numpy expression over all candidates. Each also gets a
   proven lower bound of its step (:func:`~simulator.search.bounds.step_bound_s`: its own
   compute and unhidden tensor-parallel traffic at their least).
5. **Stage 2: simulate, best first, what could still win** (branch and bound): a candidate's
   simulated step cannot be below its bound nor below its estimate less
   :data:`~simulator.search.estimate.ESTIMATE_MARGIN` (the estimate's measured error,
   checked against the simulation in the tests); candidates are taken in order of the larger
   of the two, a ``batch`` at a time, and each one's step time is predicted from two short
   simulations instead of a whole one (:func:`~simulator.search.prediction.probe_micro_batches`):
   past the pipeline's fill every further micro-batch adds the same time, so runs with ``m1``
   and ``2*m1`` micro-batches give the step with ``m`` (and the same peak memory: the same
   micro-batches are in flight); candidates with few micro-batches are simulated whole. The
   stage stops when the next candidate's lower value cannot beat the ``top``-th best
   prediction: nothing left can enter the top. A candidate that runs out of memory in the
   simulation goes back in the queue with its next heavier recompute policy.
6. **Stage 3: confirm and rank**: the ``top`` best predictions are simulated whole (every
   point goes through :func:`simulator.sweep.run_sweep`: any executor, cached in
   ``cache_dir`` when given) and ranked by the objective: ``throughput`` (tokens/s),
   ``time-to-train`` (hours for ``tokens``) or ``cost`` (dollars for ``tokens`` at the node
   type's hourly price). On one cluster the three orders agree (time and cost are both
   proportional to 1 / throughput); they differ when several ``nodes`` counts are searched.
   The report says how many candidates each stage kept and the margin and cut-off that
   justified the pruning.

A naive data-parallel baseline (PyTorch DDP, no model parallelism) is simulated beside, and
:func:`explain` says why the best wins from the simulated breakdowns.

The package, one concept per module: :mod:`~simulator.search.space` (step 1, the layouts),
:mod:`~simulator.search.pruning` (steps 2 and 3, spread over the executor),
:mod:`~simulator.search.estimate` and :mod:`~simulator.search.bounds` (step 4),
:mod:`~simulator.search.prediction` (step 5), :mod:`~simulator.search.driver` (:func:`search`,
steps 4 to 6), :mod:`~simulator.search.explanation`, :mod:`~simulator.search.report` (what a
search returns) and :mod:`~simulator.search.pricing` (node prices and token budgets).
"""

from __future__ import annotations

from simulator.search.bounds import step_bound_s
from simulator.search.driver import search
from simulator.search.explanation import explain
from simulator.search.prediction import probe_micro_batches
from simulator.search.pruning import candidates
from simulator.search.report import Candidate, Ranked, SearchReport
from simulator.search.space import RECOMPUTE_ORDER, Layout, Objective, SearchSpace, enumerate_layouts

__all__ = ["SearchSpace", "Layout", "Candidate", "Ranked", "SearchReport", "search", "explain", "Objective",
           "RECOMPUTE_ORDER", "enumerate_layouts", "candidates", "probe_micro_batches", "step_bound_s"]
