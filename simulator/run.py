"""``simulate(scenario) -> Result``: the whole flow in one short function.

scenario -> cluster graph + mesh -> compute profile -> workload program -> engine -> rows -> result
"""

from __future__ import annotations

import gc
import math
import numbers
from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

from simulator.catalog import Catalog, default_catalog
from simulator.cluster import Router, build_cluster
from simulator.cluster.cache import ClusterSetup, cluster_setup
from simulator.cluster.collectives import CollectivePlanner, nccl_model
from simulator.cluster.faults import apply_link_faults
from simulator.costs.collectives import choose_algorithm
from simulator.costs.flops import model_flops_per_token, op_policy_recomputed_params, recompute_flops_per_token
from simulator.costs.nccl_env import NcclTuning
from simulator.engine import CommResolver, EngineRun, LinkClasses, run_program
from simulator.engine.comm import LoweringMemo
from simulator.errors import ScenarioError
from simulator.ir import MemDelta, op_name
from simulator.perturbation import faults_summary, run_iterations, symmetry_inputs
from simulator.results import LinkStat, Result, Row, RunFacts, compute_result
from simulator.results.moe import MoeSummary, moe_summary
from simulator.results.rows import CommRecord, LazyMemRow
from simulator.results.simulation import Simulation
from simulator.scenario import ClusterSpec, Scenario
from simulator.scenario.training import recompute_modules_of
from simulator.version import __version__
from simulator.workload import CommOp, Program, ProgramBuilder, Workload, build_workload, compute_profile
from simulator.workload.activations import recomputed_matmul_params
from simulator.workload.fusion import CommCost

__all__ = ["simulate", "run_simulation", "Simulation", "simulate_collective", "collective_choice", "FLOPS_CONVENTION"]

FLOPS_CONVENTION = (
    "model FLOPs = (6*N + 12*L*h*s) per token (PaLM appendix B; N = parameters in matmuls, no causal discount); "
    "hardware FLOPs add recomputation (full: 2*N_layers + 4*L*h*s, selective: 4*L*h*s per token)"
)
MOE_FLOPS_NOTE = ("; mixture of experts: N and N_layers count the active parameters (top-k routed and shared "
                  "experts, router), the routing imbalance's extra expert work is not model FLOPs")


def simulate(scenario: Scenario, *, record_series: bool = False) -> Result:
    """Simulate one training iteration of ``scenario``: its :class:`~simulator.results.Result`."""
    return run_simulation(scenario, record_series=record_series).result


def run_simulation(scenario: Scenario, *, record_series: bool = False) -> Simulation:
    """Simulate one iteration and keep what traces and figures need: the Result, the engine's
    rows, the run's facts and, with ``record_series``, the link loads over time."""
    with _collector_paused():
        return _run(scenario, record_series)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a run builds and executes its program.

    A run allocates hundreds of thousands of small, acyclic objects (tasks, events, rows)
    that are freed by reference counting; the collector would rescan all of them again and
    again (about 40% of a symmetry-off run). It is switched back on (if it was on) when the
    run ends, however it ends.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if not gc.get_freeze_count():
                # what the run allocated and keeps (its rows, result) goes straight to the oldest
                # generation: else the first collection after ``enable`` scans every one of them
                # (~2 s for 545k rows), finding nothing to free; a cycle is still found by the
                # next full collection
                gc.freeze()
                gc.unfreeze()
            gc.enable()


def _run(scenario: Scenario, record_series: bool) -> Simulation:
    catalog = default_catalog()  # read once: every lookup of this run sees the same data
    if scenario.faults.links:  # a perturbed cluster is this run's alone: built fresh, never cached
        setup = None
        cluster = build_cluster(scenario.cluster, catalog)
        perturbed = apply_link_faults(cluster, scenario.faults.links)
        planner = CollectivePlanner(cluster, Router(cluster, seed=scenario.sim.seed))
    else:
        setup = cluster_setup(scenario.cluster, catalog, scenario.sim.seed)  # kept for the next point on this cluster
        cluster, planner = setup.graph, setup.planner
        perturbed = []
    profile = compute_profile(cluster.gpu, scenario.cluster.calibration, catalog)
    symmetric = scenario.sim.symmetry == "auto"
    model = nccl_model(cluster.nccl)

    costs: dict[tuple[str, tuple[int, ...], float, str | None], CommCost] = {}

    def comm_time(op: str, group: tuple[int, ...], nbytes: float, algorithm: str | None = None) -> CommCost:
        """A collective alone on its links: what a private (unshared) collective costs, and the
        algorithm (the forced one, else NCCL's tuner's) and protocol it runs with (kept for
        this run: the workload asks again and again, 579 times for 2 distinct ones in GPT-3 tp8 pp8)."""
        if len(group) <= 1 or nbytes <= 0:
            return CommCost(0.0)
        key = (op, group, nbytes, algorithm)
        found = costs.get(key)
        if found is None:
            algos = [algorithm] if algorithm else planner.candidates(op, group)
            shapes = [planner.plan(op, a, group).shape(cluster) for a in algos]
            choice = choose_algorithm(model, shapes, nbytes)
            found = costs[key] = CommCost(choice.time_s, choice.shape.algorithm, choice.protocol)
        return found

    rank_key, symmetry_off = symmetry_inputs(scenario, cluster.gpus_per_node)
    workload = build_workload(scenario, profile, gpus_per_node=cluster.gpus_per_node, symmetric=symmetric,
                              comm_time=comm_time, node_kind=cluster.node_type.intra_node.kind, nccl=cluster.nccl,
                              rank_key=rank_key, symmetry_off=symmetry_off)
    program = workload.build()
    block = workload.symmetry.block_ranks
    block_nodes = None if block is None else block // cluster.gpus_per_node
    if setup is None:
        classes, memo = LinkClasses(cluster, block_nodes), None
    else:
        classes, memo = _link_classes(setup, block_nodes)
    resolver = CommResolver(cluster, planner, classes, model, block_ranks=block, memo=memo)
    run, samples = run_iterations(scenario, program, resolver, cluster.gpus_per_node, mode=scenario.sim.network,
                                  record_series=record_series, overlap_slowdown=workload.overlap_slowdown)
    measured = profile.calibrated or scenario.cluster.calibration is not None  # a user's profile is never "built-in"
    facts = _facts(scenario, workload, program, run, profile.name, measured, cluster.gpu)
    rows = _rows(program, run)
    result = compute_result(rows, facts, _link_stats(classes, run))
    if scenario.model.moe:
        result = result.model_copy(update={"moe": _moe(scenario, workload, rows, result)})
    summary = faults_summary(scenario, program, workload.symmetry.reason, cluster, perturbed, samples)
    if summary is not None:
        result = result.model_copy(update={"faults": summary})
    return Simulation(result, rows, facts, _link_series(classes, run) if record_series else None)


def _link_classes(setup: ClusterSetup, block_nodes: int | None) -> tuple[LinkClasses, LoweringMemo]:
    """The cluster's link classes for blocks of ``block_nodes`` and the lowerings folded onto
    them, kept with the cluster for the next run on it."""
    key = ("link_classes", block_nodes)
    found = setup.derived.get(key)
    if found is None:
        found = setup.derived[key] = (LinkClasses(setup.graph, block_nodes), LoweringMemo())
    return found


def _moe(scenario: Scenario, workload: Workload, rows: list[Row], result: Result) -> MoeSummary:
    """The MoE summary of the simulated rank whose routed experts and all-to-alls take longest
    (a pipeline stage of dense layers only, e.g. DeepSeek-V3's first, has none)."""
    from simulator.workload.moe import imbalance_of, imbalance_over_seeds

    experts_of: dict[int, float] = {}
    a2a_of: dict[int, float] = {}
    for r in rows:
        if r.stream in ("ep", "tp_ep"):  # the all-to-alls, or the allgather / deepep dispatcher's exchange
            a2a_of[r.rank] = a2a_of.get(r.rank, 0.0) + r.duration_s
        elif r.name.endswith((".experts", ".experts.bwd")) or (r.name.endswith(".fp8_cast") and "experts.fc" in r.name):
            # the routed experts' GEMMs, and under fp8 the casts split off before them (steps.split_casts)
            experts_of[r.rank] = experts_of.get(r.rank, 0.0) + r.duration_s
    rank = max(sorted({*experts_of, *a2a_of}), key=lambda k: experts_of.get(k, 0.0) + a2a_of.get(k, 0.0),
               default=result.breakdown.rank)
    experts, a2a = experts_of.get(rank, 0.0), a2a_of.get(rank, 0.0)
    imb, counts = imbalance_of(scenario), workload.layout.counts
    return moe_summary(params_total=counts.total, params_active=counts.active, ep=scenario.parallelism.ep,
                       edp=scenario.edp, factor=imb.factor, spread=imb.spread, dropped=imb.dropped_fraction,
                       expert_compute_s=experts, all_to_all_s=a2a, step_time_s=result.step_time_s,
                       seeds=imbalance_over_seeds(scenario))


def _rows(program: Program, run: EngineRun) -> list[Row]:
    """The engine's rows, one per task; consumes ``program.tasks`` (each task is let go once its
    row is made, so a run without symmetry never holds all tasks and all rows at once)."""
    rows = []
    starts, ends = run.start_s.tolist(), run.end_s.tolist()
    resolved_of = run.resolved
    joins: dict[Hashable, str] = {}  # the tasks of one transfer share a key: one repr each
    # by the builder's join numbers when it gave them (no hashing of join keys per task)
    join_of = program.join_of
    join_text: list[str | None] = [None] * len(program.join_sizes or ())
    # tasks share operations (a stage pair's p2p): one record per operation and resolution,
    # keyed by identity (the operation is kept in the entry, so its id is not reused meanwhile)
    records: dict[tuple[int, int], tuple[Any, CommRecord]] = {}
    # tasks share a handful of memory-change tuples: each one's offsets, bytes and categories
    # split out once (keyed by identity; the tuple lives in its task until its row is made, and
    # in the form itself after that, so an id is never reused while the form is kept)
    forms: dict[int, tuple[Any, ...]] = {}
    tasks = program.tasks
    tasks.reverse()
    while tasks:
        task = tasks.pop()
        start, end = starts[task.id], ends[task.id]
        mem: tuple[tuple[float, float, str], ...] = ()
        changes = None
        if task.mem:
            form = forms.get(id(task.mem))
            if form is None:
                form = forms[id(task.mem)] = _mem_form(task.mem)
            if form[0] is not None:  # made when read (LazyMemRow), from the shared offsets
                changes = form[:3]
            else:
                mem = tuple((end if d.at_end else start + d.offset_s, d.nbytes, d.category) for d in task.mem)
        comm = None
        if task.comm is not None:
            resolved = resolved_of.get(task.id)
            record = records.get((id(task.comm), id(resolved)))
            if record is None or record[0] is not task.comm:
                op = task.comm
                record = records[id(op), id(resolved)] = (op, CommRecord(
                    op.op, op.nbytes, op.count, len(op.group), op.group, resolved.algorithm if resolved else None,
                    resolved.protocol if resolved else None, resolved.alone_s if resolved else None))
            comm = record[1]
        join = None
        if task.join is not None:
            if join_of is not None:
                number = join_of[task.id]
                join = join_text[number]
                if join is None:
                    join = join_text[number] = repr(task.join)
            else:
                join = joins.get(task.join)
                if join is None:
                    join = joins[task.join] = repr(task.join)
        if changes is None:
            rows.append(Row(task.rank, task.stream, task.name, task.category, start, end, task.info, mem, comm, join))
        else:
            rows.append(LazyMemRow.at(task.rank, task.stream, task.name, task.category, start, end, task.info, changes,
                                      comm, join))
    return rows


def _mem_form(mem: tuple[MemDelta, ...]) -> tuple[Any, ...]:
    """A task's memory changes as (offsets after its start, bytes, categories), from which its
    row makes them when read (``start + offset`` for each); offsets ``None`` when a change is
    tied to the task's end (the row's changes are then made at once). The last element keeps
    ``mem`` alive."""
    at_start = not any(d.at_end for d in mem)
    return (tuple(d.offset_s for d in mem) if at_start else None, tuple(d.nbytes for d in mem),
            tuple(d.category for d in mem), mem)


def _link_series(classes: LinkClasses, run: EngineRun) -> dict[str, Any]:
    """Load of every link class over time (bytes/s on one link of the class), for plots and traces."""
    cluster = classes.cluster
    return {
        "samples": run.network.series,  # [(time_s, class indices, load bytes/s)]
        "labels": [classes.label(i) for i in range(len(classes))],
        "kinds": [cluster.links[m[0]].kind for m in classes.members],
        "tiers": [cluster.links[m[0]].tier for m in classes.members],
        "capacity": classes.capacity.tolist(),
    }


def _link_stats(classes: LinkClasses, run: EngineRun) -> list[LinkStat]:
    carried = run.network.bytes_carried
    assert carried is not None
    out = []
    cluster = classes.cluster
    for index in range(len(classes)):
        if carried[index] <= 0:
            continue
        link = cluster.links[classes.members[index][0]]
        out.append(LinkStat(classes.label(index), link.kind, link.tier, float(classes.capacity[index]),
                            float(carried[index]), len(classes.members[index])))
    return out


def _facts(scenario: Scenario, workload: Workload, program: Program, run: EngineRun, profile: str,
           calibrated: bool, gpu: Any) -> RunFacts:
    m, train = scenario.model, scenario.training
    counts = workload.layout.counts
    tokens = scenario.tokens_per_step
    model_flops = model_flops_per_token(counts.matmul, m.layers, m.heads * m.head_dim, m.seq_len) * tokens
    op_params = op_policy_recomputed_params(hidden=m.hidden, q_width=m.heads * m.head_dim,
                                            kv_width=m.n_kv_heads * m.head_dim, ffn_hidden=m.ffn, mlp=m.mlp)
    # an MoE model's layers average their active parameters (dense and MoE layers differ)
    layer_params = counts.per_layer + round(counts.moe_layers * counts.moe_active_extra / m.layers)
    extra = recompute_flops_per_token(train.recompute, layer_params, m.layers, m.hidden, m.seq_len,
                                      op_policy_params=op_params, core_attn="core_attn" in recompute_modules_of(train),
                                      selective_params=recomputed_matmul_params(scenario)) * tokens
    calibration = profile if calibrated else f"uncalibrated (built-in efficiency tables for {gpu.name})"
    return RunFacts(
        scenario_name=scenario.name or f"{m.label} on {scenario.cluster.n_nodes} x {scenario.cluster.node_type.name}",
        scenario_hash=scenario.content_hash(),
        simulator_version=__version__,
        calibration=calibration,
        world_size=scenario.world_size,
        tp=scenario.parallelism.tp,
        pp=scenario.parallelism.pp,
        cp=scenario.parallelism.cp,
        dp=scenario.dp,
        virtual_stages=scenario.parallelism.virtual_stages,
        micro_batches=scenario.micro_batches,
        global_batch=train.global_batch,
        seq_len=m.seq_len,
        params=counts.total,
        model_flops_per_step=model_flops,
        hardware_flops_per_step=model_flops + extra,
        peak_flops_per_s=gpu.peak_flops_per_s(train.precision),
        precision=train.precision,
        gpu=gpu.name,
        gpu_memory_bytes=gpu.memory_bytes,
        represents=program.represents,
        stage_of={r: workload.mesh.stage(r) for r in program.ranks},
        initial_memory=program.initial_memory,
        flops_convention=FLOPS_CONVENTION + (MOE_FLOPS_NOTE if m.moe else ""),
        sharding=scenario.parallelism.sharding,
        schedule=scenario.parallelism.pipeline_schedule,
        engine_events=run.events,
        network_entities=run.network.entities_started,
        network_recomputations=run.network.recomputations,
        symmetry=scenario.sim.symmetry,
        network_mode=scenario.sim.network,
        gpus_per_node=workload.gpus_per_node,
    )


def _collective_setup(spec: ClusterSpec, tuning: NcclTuning | None = None) -> tuple[Any, CommResolver]:
    """The graph and resolver of a cluster, kept while the catalog's files are unchanged."""
    return _collective_setup_in(spec, default_catalog(), tuning)


@lru_cache(maxsize=8)
def _collective_setup_in(spec: ClusterSpec, catalog: Catalog, tuning: NcclTuning | None) -> tuple[Any, CommResolver]:
    graph = build_cluster(spec, catalog)
    planner = CollectivePlanner(graph, Router(graph))
    return graph, CommResolver(graph, planner, LinkClasses(graph, None), nccl_model(graph.nccl), block_ranks=None,
                               tuning=tuning)


def _as_spec(cluster: dict[str, Any] | ClusterSpec) -> ClusterSpec:
    return cluster if isinstance(cluster, ClusterSpec) else ClusterSpec.model_validate(cluster)


def simulate_collective(
    cluster: dict[str, Any] | ClusterSpec,
    op: str,
    nbytes: float,
    algorithm: str | None = None,
    *,
    ranks: tuple[int, ...] | None = None,
    network: str = "flow",
    tuning: NcclTuning | None = None,
) -> float:
    """Seconds of one collective over all GPUs of ``cluster`` (or ``ranks``), nccl-tests style.

    ``nbytes`` follows nccl-tests: the vector size for all-reduce, the total output for
    all-gather, the total input for reduce-scatter. ``algorithm`` None lets the NCCL-like
    tuner choose (ring, tree, NVLS) by size and topology, within what ``tuning``
    (``NCCL_ALGO`` / ``NCCL_PROTO``) enables. An algorithm or tuning the topology cannot run
    raises :class:`ValueError`.
    """
    nbytes = _checked_bytes(nbytes)
    graph, resolver = _collective_setup(_as_spec(cluster), tuning)
    group = ranks or tuple(range(graph.world_size))
    pb = ProgramBuilder()
    pb.add(group[0], "comm", op, "dp", comm=CommOp(op_name(op), group, float(nbytes), "dp", (group,), algorithm))
    program = pb.build((group[0],), {group[0]: 1}, {group[0]: {}})
    run = run_program(program, resolver, mode=network)
    return float(run.makespan_s)


def _checked_bytes(nbytes: Any) -> float:
    """``nbytes`` as a float, or a :class:`ScenarioError` (a ``ValueError`` too) for a negative,
    non-finite or non-numeric byte count."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Real):
        raise _BadBytes(f"must be a number of bytes, got {nbytes!r}", field="nbytes")
    value = float(nbytes)
    if not math.isfinite(value) or value < 0:
        raise _BadBytes(f"must be a finite number of bytes >= 0, got {nbytes!r}", field="nbytes")
    return value


class _BadBytes(ScenarioError, ValueError):
    """A bad byte count given to the Python API: both bad input and a ValueError."""


def collective_choice(cluster: dict[str, Any] | ClusterSpec, op: str, nbytes: float,
                      algorithm: str | None = None, *, tuning: NcclTuning | None = None) -> str:
    """The algorithm and protocol the tuner picks, e.g. ``"tree/Simple"``."""
    nbytes = _checked_bytes(nbytes)
    graph, resolver = _collective_setup(_as_spec(cluster), tuning)
    group = tuple(range(graph.world_size))
    choice = resolver.choose(CommOp(op_name(op), group, float(nbytes), "dp", (group,), algorithm))
    return f"{choice.shape.algorithm}/{choice.protocol}"
