"""Stage 1 of the layered search: a closed-form step time of every candidate, at once.

Each candidate is reduced to a few seconds-valued terms, each from the function the
simulation itself uses (:func:`terms_of`), then every candidate's step is assembled in one
numpy expression (:func:`closed_form_s`):

* **compute**: one micro-batch's forward and backward through each pipeline stage
  (:func:`~simulator.search.bounds.stage_passes`: the layers' steps as
  :class:`~simulator.workload.layers.LayerEmitter` costs them from
  :mod:`simulator.costs.compute`, recomputation included; unhidden tensor- and
  context-parallel collectives nothing overlaps costed alone on their links, as below). With ``T_s`` that time on stage ``s``,
  ``m`` micro-batches and ``v`` virtual stages the pipeline takes
  ``m * max T + (sum T - max T) / v``: ``(m + p - 1) * T`` for a balanced 1F1B pipeline,
  the fill and drain shortened ``v`` times by interleaving (Narayanan et al. 2021, §2.2).
* **data-parallel traffic** of the fullest stage's parameters (``ModelLayout``), each
  collective costed alone on its links by NCCL's alpha-beta model with the algorithm and
  protocol its tuner picks (:func:`simulator.costs.collectives.choose_algorithm` on the
  cluster's planned shapes, as :func:`simulator.run.simulate` costs a private collective),
  in the strategy's bytes (``grad_reduce_bytes``, ``param_bytes``) and groups
  (``grad_axis``, ``shard_axis``, ``replicate_axis``):
  ZeRO-3 / FSDP / HSDP / MiCS gather every micro-batch's parameters twice (forward and
  backward) and reduce-scatter its gradients, HSDP all-reducing the gradient shard across
  replicas after every backward, MiCS once per step; ZeRO-1/2 reduce once per step (stage 1)
  or every micro-step (stage 2) and all-gather the updated parameters after the optimizer
  step; DDP all-reduces once per step.
* **overlap**, as the framework profile sets it: what the strategy runs beside compute
  (ZeRO-3 family prefetch: the whole pipeline; DDP with ``overlap``: the last backward;
  ZeRO-1/2 with ``overlap_comm``: every backward) costs
  :func:`simulator.costs.overlap.overlapped_time_s` with the measured compute slowdown beside
  NCCL kernels; the rest (ZeRO-1/2 without ``overlap_comm``, their parameter all-gather
  without ``overlap_param_gather``) adds in full.
* **optimizer step**: :meth:`Workload.optimizer_time_s <simulator.workload.builder.Workload.optimizer_time_s>`
  over the parameters a rank updates (its shard under ZeRO/FSDP).

Left out: pipeline point-to-point transfers, contention between concurrent collectives,
the last collectives after the final backward, and the parameter gathers of ZeRO-3 / FSDP
that a pipeline's waits leave exposed (the simulated step of FSDP with pp 2-4 on two p4d
nodes is up to 2.2 times the estimate); all of these make the estimate low, never high. The estimate is not a bound; what makes it
safe to prune with is its measured error (:data:`ESTIMATE_MARGIN`, checked against the
simulation in ``tests/test_search_layered.py``), and the search never prunes below the
proven :func:`~simulator.search.bounds.step_bound_s`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from simulator.scenario import Scenario
from simulator.search.bounds import bound_from_passes, stage_passes

__all__ = ["ESTIMATE_MARGIN", "Terms", "CommCoster", "terms_of", "closed_form_s"]

# How far below the closed form a simulated step may be (1 - simulated / estimate) before the
# pruning could drop a winner: the search keeps for the simulation every candidate whose
# estimate times (1 - ESTIMATE_MARGIN) could still beat the top's simulated step. Measured on
# every layout of tests/test_search_layered.py's three spaces (GPT-3 1.3B and 2.7B on 4 A10G,
# GPT-3 760M on 2 x 8 A100): the simulated step was never below the estimate (smallest ratio
# 1.00005); 5% is that with room for layouts outside the sample. Not fitted to any record.
ESTIMATE_MARGIN = 0.05


@dataclass(frozen=True)
class Terms:
    """A candidate reduced to what its closed-form step time needs (seconds)."""

    bound_s: float  # the proven lower bound (step_bound_s)
    stage_max_s: float  # one micro-batch's forward + backward on the busiest stage
    stage_sum_s: float  # the same summed over stages
    micro_batches: int
    virtual_stages: int
    window_s: float  # compute beside which the overlapped traffic runs (0: the whole pipeline)
    overlapped_comm_s: float
    exposed_comm_s: float
    optimizer_s: float


class CommCoster:
    """Collectives of one cluster costed alone on their links, as the simulation costs a
    private collective (cached by op, group and size)."""

    def __init__(self, scenario: Scenario) -> None:
        from simulator.catalog import default_catalog
        from simulator.cluster import Router, build_cluster
        from simulator.cluster.collectives import CollectivePlanner, nccl_model

        self.cluster = build_cluster(scenario.cluster, default_catalog())
        self.planner = CollectivePlanner(self.cluster, Router(self.cluster, seed=scenario.sim.seed))
        self.model = nccl_model(self.cluster.nccl)
        self._cache: dict[tuple[str, tuple[int, ...], float, str | None], float] = {}

    def __call__(self, op: str, group: tuple[int, ...], nbytes: float, algorithm: str | None = None) -> float:
        from simulator.costs.collectives import choose_algorithm

        if len(group) <= 1 or nbytes <= 0:
            return 0.0
        key = (op, group, nbytes, algorithm)
        found = self._cache.get(key)
        if found is None:
            algos = [algorithm] if algorithm else self.planner.candidates(op, group)
            shapes = [self.planner.plan(op, a, group).shape(self.cluster) for a in algos]
            found = self._cache[key] = choose_algorithm(self.model, shapes, nbytes).time_s
        return found


def terms_of(scenario: Scenario, profile: Any, comm: CommCoster, stage: int | None = None) -> Terms:
    """The closed-form terms of one candidate (module docstring); ``stage``: the pipeline stage
    whose parameters the data-parallel traffic moves (default: the one holding the most)."""
    from simulator.workload.data_parallel import BucketedZero, Zero3, grad_reduce_bytes, param_bytes

    workload, low_fwd, low_bwd = stage_passes(scenario, profile, nccl=comm.cluster.nccl)
    mesh = workload.mesh
    first = mesh.stage_representatives[0]

    def in_layer_s(step: Any, n: int) -> float:
        """A tensor- or context-parallel collective nothing overlaps, costed alone on its links."""
        return 0.0 if step.overlap or n <= 1 else comm(step.op, mesh.group(first, step.axis), step.nbytes,
                                                                   step.algorithm)

    _, forward, backward = stage_passes(scenario, profile, workload, in_layer_s)
    par = scenario.parallelism
    m = scenario.micro_batches
    per_stage = [f + b for f, b in zip(forward, backward, strict=True)]
    if stage is None:
        stage = max(range(par.pp), key=lambda s: workload.layout.params_of_stage(s))
    params = workload.layout.params_of_stage(stage)
    strategy = workload.strategy
    rep = mesh.stage_representatives[stage]
    grad_bytes, weight_bytes = params * grad_reduce_bytes(scenario), params * param_bytes(scenario)
    window, overlapped, exposed, updated = 0.0, 0.0, 0.0, params
    if isinstance(strategy, Zero3):
        n = strategy.shard_ranks
        shard = mesh.group(rep, strategy.shard_axis)
        overlapped = m * (2 * comm("all_gather", shard, weight_bytes) + comm("reduce_scatter", shard, grad_bytes))
        replicate = strategy.replicate_axis()
        if replicate is not None:
            times = 1 if par.sharding == "mics" else m
            overlapped += times * comm("all_reduce", mesh.group(rep, replicate), grad_bytes / n)
        updated = params / n
    elif isinstance(strategy, BucketedZero):
        group = mesh.group(rep, strategy.grad_axis)
        reductions = m if strategy.zero_stage == 2 else 1
        reduce = reductions * comm(strategy._reduce_op, group, grad_bytes)
        gather = comm("all_gather", group, weight_bytes)
        if strategy._overlap:
            overlapped, window = reduce, reductions * backward[stage]
        else:
            exposed = reduce
        if par.zero.overlap_param_gather:
            overlapped += gather
        else:
            exposed += gather
        updated = params / strategy.dp_ranks
    else:  # DDP
        reduce = comm("all_reduce", mesh.group(rep, strategy.grad_axis), grad_bytes)
        overlapped, window = (reduce, backward[stage]) if par.ddp.overlap else (0.0, 0.0)
        exposed = 0.0 if par.ddp.overlap else reduce
    return Terms(bound_from_passes(scenario, low_fwd, low_bwd), max(per_stage), sum(per_stage), m,
                 par.virtual_stages, window, overlapped, exposed, workload.optimizer_time_s(updated))


def closed_form_s(terms: Sequence[Terms], slowdown: float) -> np.ndarray:
    """Every candidate's estimated step time (seconds), in one vectorised expression over the
    candidates' terms (module docstring); ``slowdown``: compute beside NCCL kernels
    (:func:`simulator.workload.builder.overlap_slowdown`)."""
    from simulator.costs.overlap import overlapped_time_s

    if not terms:
        return np.zeros(0)
    col = {name: np.array([getattr(t, name) for t in terms], dtype=float) for name in Terms.__dataclass_fields__}
    pipeline = col["micro_batches"] * col["stage_max_s"] + (col["stage_sum_s"] - col["stage_max_s"]) / col["virtual_stages"]
    window = np.where(col["window_s"] > 0, np.minimum(col["window_s"], pipeline), pipeline)
    beside = np.vectorize(overlapped_time_s, otypes=[float])(window, col["overlapped_comm_s"], slowdown)
    step = pipeline - window + beside + col["exposed_comm_s"] + col["optimizer_s"]
    return np.maximum(step, col["bound_s"])
