"""``build_workload``: a scenario's per-rank task DAGs, in one short orchestrating function.

scenario + mesh + compute profile -> layout (chunks, parameters) -> strategy (registered by
``parallelism.sharding``) -> for each simulated rank (symmetry): its initial memory and its
pipeline schedule emitted through the narrow emitter -> :class:`~simulator.ir.Program`.

The search and the memory pre-estimate reuse the same pieces (:class:`Workload` without
``build``), so every estimate costs layers, memory and parameters as the simulation does.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from simulator.catalog import NcclConstants, default_catalog
from simulator.cluster.mesh import Mesh, mesh_for
from simulator.costs.compute import ComputeProfile
from simulator.costs.dispatch_buffers import DEEPEP_DISPATCH_CONFIGS, deepep_buffer_bytes
from simulator.errors import InfeasibleError
from simulator.ir import KernelInfo, Program
from simulator.scenario.spec import Scenario
from simulator.units import GiB
from simulator.workload.activations import shard_of, state_bytes_per_param
from simulator.workload.data_parallel import Strategy, expert_sharded_states, strategy_for
from simulator.workload.emitter import Emitter
from simulator.workload.fusion import CommCost, CommTime, layer_comm_private
from simulator.workload.layers import LayerEmitter
from simulator.workload.layout import ModelLayout
from simulator.workload.model import Kernel, kernels_time_s, optimizer_kernel
from simulator.workload.pipeline.emit import PipelineEmitter
from simulator.workload.steps import kernel_shape
from simulator.workload.symmetry import Symmetry

__all__ = ["Workload", "build_workload", "overlap_slowdown", "CUDA_CONTEXT_BYTES", "runtime_reserve_bytes",
           "deepep_static_bytes"]

# The runtime reserve (category "other"): memory a GPU loses outside the PyTorch caching
# allocator: the CUDA context, library workspaces and NCCL's communicator buffers (NCCL
# allocates its own, NCCL_BUFFSIZE per channel and peer). An uncited estimate (~0.5 GiB of
# context on recent drivers plus those buffers), held in one place: it counts toward the
# out-of-memory verdict, not toward Result.peak_allocated_bytes or peak_reserved_bytes (what
# torch's allocator statistics report; the reserved peak is the allocations replayed through
# the caching allocator model, simulator/results/reserved.py, whose limit is the GPU's memory
# less this reserve). DeepEP's communication buffers join it where the dispatcher is deepep
# (:func:`runtime_reserve_bytes`).
CUDA_CONTEXT_BYTES = 1.0 * GiB


def deepep_static_bytes(sc: Scenario, layout: ModelLayout, stage: int) -> float:
    """DeepEP's buffers on a rank of pipeline ``stage`` (``parallelism.moe.dispatcher: deepep``):
    one ``Buffer`` for the etp x ep group, allocated outside PyTorch's caching allocator at the
    stage's first dispatch (:func:`~simulator.costs.dispatch_buffers.deepep_buffer_bytes`); 0
    for another dispatcher or a stage without MoE blocks. A group size DeepEP has no config for
    is refused (its ``get_dispatch_config`` asserts)."""
    m, par = sc.model, sc.parallelism
    if not m.moe or par.moe.dispatcher != "deepep":
        return 0.0
    blocks = [layer for c in layout.chunks_of_stage(stage) for layer in (*c.layers, *range(m.layers, m.layers + c.mtp))]
    if not any(m.is_moe_layer(layer) for layer in blocks):
        return 0.0
    ranks = par.ep * par.expert_tp
    if ranks > 1 and ranks not in DEEPEP_DISPATCH_CONFIGS:
        raise InfeasibleError(f"DeepEP has no dispatch config for an etp x ep group of {ranks} ranks (it has "
                              f"{', '.join(map(str, DEEPEP_DISPATCH_CONFIGS))})", field="parallelism.ep")
    return float(deepep_buffer_bytes(m.hidden, shard_of(sc).elem, ranks, par.moe.deepep_sms).total)


def runtime_reserve_bytes(sc: Scenario, layout: ModelLayout, stage: int) -> float:
    """What a rank of ``stage`` holds outside the caching allocator (category ``other``): the
    CUDA context and library buffers (``CUDA_CONTEXT_BYTES``) and DeepEP's buffers."""
    return CUDA_CONTEXT_BYTES + deepep_static_bytes(sc, layout, stage)


def _check_deepep(sc: Scenario, group: tuple[int, ...], gpus_per_node: int) -> None:
    """DeepEP's internode kernels run over InfiniBand RDMA (NVSHMEM; DeepEP README "Network
    configurations": fully tested with InfiniBand): an etp x ep group across nodes needs it; its
    SMs must leave some to compute."""
    transport, sms = sc.cluster.node_type.nics.transport, sc.cluster.gpu_spec.sm_count
    if sms and sc.parallelism.moe.deepep_sms >= sms:
        raise InfeasibleError(f"deepep_sms={sc.parallelism.moe.deepep_sms} leaves none of the "
                              f"{sc.cluster.gpu_spec.name}'s {sms} SMs to compute", field="parallelism.moe.deepep_sms")
    if len({r // gpus_per_node for r in group}) > 1 and transport != "infiniband":
        raise InfeasibleError(f"the deepep dispatcher's etp x ep group {group[:4]}... spans nodes, and DeepEP's "
                              f"internode kernels need InfiniBand RDMA; {sc.cluster.node_type.name}'s NICs speak "
                              f"{transport}", field="parallelism.moe.dispatcher")


def overlap_slowdown(scenario: Scenario, nccl: NcclConstants | None = None) -> float:
    """How much slower kernels run beside a collective: ``sim.overlap_slowdown`` or the
    measured default of ``topologies/nccl.yaml`` (``nccl``: those constants, default the
    default catalog's)."""
    given = scenario.sim.overlap_slowdown
    if given is not None:
        return given
    return (nccl or default_catalog().nccl).overlap_compute_slowdown


@dataclass
class Workload:
    """Everything the workload stage derives from a scenario, and the program it builds."""

    scenario: Scenario
    mesh: Mesh
    profile: ComputeProfile
    gpus_per_node: int
    symmetric: bool
    comm_time: CommTime | None = None
    node_kind: str = "nvswitch"
    strategy_tag: str | None = None
    rank_key: Callable[[int], Hashable] | None = None
    nccl: NcclConstants | None = None
    symmetry_off: str | None = None
    layout: ModelLayout = field(init=False)
    symmetry: Symmetry = field(init=False)
    strategy: Strategy[Any] = field(init=False)
    layers: LayerEmitter = field(init=False)
    overlap_slowdown: float = field(init=False)

    def __post_init__(self) -> None:
        sc = self.scenario
        self.layout = ModelLayout(sc)
        self.symmetry = Symmetry(self.mesh, self.gpus_per_node, self.symmetric, self.rank_key, self.symmetry_off)
        self.strategy = strategy_for(sc, self.mesh, self.layout, self.strategy_tag)
        self.overlap_slowdown = overlap_slowdown(sc, self.nccl)
        # the token exchange of expert parallelism (all-to-all, expert-TP gathers) runs on the shared network
        expert_comm = sc.model.moe and self.mesh.ep * self.mesh.etp > 1
        fuse = (self.comm_time is not None and layer_comm_private(self.mesh, self.gpus_per_node, self.node_kind)
                and not expert_comm
                and self.symmetry_off is None)  # perturbed links: each group's collectives on its own links
        rep = self.mesh.stage_representatives[0]
        groups = {axis: self.mesh.group(rep, axis) for axis in ("tp", "cp", "ep", "etp", "tp_ep")}
        if sc.model.moe and sc.parallelism.moe.dispatcher == "deepep":
            _check_deepep(sc, groups["tp_ep"], self.gpus_per_node)
        self.layers = LayerEmitter(sc, self.layout, self.profile, fuse_layers=fuse,
                                   comm_time=self.comm_time or (lambda op, group, nbytes, algorithm: CommCost(0.0)), groups=groups,
                                   overlap_slowdown=self.overlap_slowdown, join_group=self.mesh.group,
                                   symmetric=self.symmetry.enabled)

    def optimizer_time_s(self, n_params: float) -> float:
        """The optimizer step (one fused memory-bound kernel, :func:`optimizer_kernel`) and,
        after it, the step's host gap: the host synchronises at the step's end (loss, gradient
        norm), runs its per-step work and only then issues the next step's first kernel
        (:mod:`simulator.costs.host`)."""
        train = self.scenario.training
        kernel = optimizer_kernel(n_params, train.precision, train.optimizer)
        return kernels_time_s(self.profile, [kernel], train.precision) + train.host.costs().step_s

    def optimizer_kernels(self, n_params: float) -> tuple[KernelInfo, ...]:
        """The optimizer step's kernel as traces show it (its time without the host gap)."""
        train = self.scenario.training
        k = optimizer_kernel(n_params, train.precision, train.optimizer)
        return (KernelInfo(k.name, k.kind, k.flops, k.nbytes, kernel_shape(k),
                           kernels_time_s(self.profile, [k], train.precision)),)

    def memory_kernel(self, name: str, nbytes: float, elements: float) -> KernelInfo:
        """A memory-bound pass of ``nbytes`` over a buffer of ``elements`` (e.g. Megatron's
        gradient-buffer zeroing), timed by the roofline's memory side."""
        k = Kernel(name, "memory", 0.0, nbytes, None, "optimizer", elements=(elements,))
        return KernelInfo(k.name, k.kind, k.flops, k.nbytes, kernel_shape(k),
                          kernels_time_s(self.profile, [k], self.scenario.training.precision))

    def initial_memory(self, rank: int) -> dict[str, float]:
        """What a rank holds at t = 0, by category: model states, static buffers, context."""
        stage = self.mesh.stage(rank)
        params = self.layout.params_of_stage(stage)
        per = state_bytes_per_param(self.scenario)
        states = expert_sharded_states(self.strategy, self.scenario, stage, params, per)
        return {"params": states.params, "grads": states.grads, "optimizer": states.optimizer,
                "buffers": self.strategy.static_buffers(params), "other": runtime_reserve_bytes(self.scenario,
                                                                                                self.layout, stage)}

    def build(self) -> Program:
        """Emit every simulated rank's iteration into one program."""
        emitter = Emitter(self.mesh, self.symmetry, self.optimizer_time_s, self.optimizer_kernels, self.memory_kernel)
        pipeline = PipelineEmitter(self.scenario, self.layout, self.layers, self.strategy)
        ranks = self.symmetry.simulated_ranks()
        for rank in ranks:
            pipeline.emit_rank(emitter.rank(rank, self.strategy.start_rank(rank)))
        initial = {r: self.initial_memory(r) for r in ranks}
        return emitter.program.build(ranks, self.symmetry.represents(ranks), initial)


def build_workload(scenario: Scenario, profile: ComputeProfile, *, gpus_per_node: int, symmetric: bool = True,
                   comm_time: CommTime | None = None, node_kind: str = "nvswitch", mesh: Mesh | None = None,
                   strategy: str | None = None, rank_key: Callable[[int], Hashable] | None = None,
                   nccl: NcclConstants | None = None, symmetry_off: str | None = None) -> Workload:
    """The workload of ``scenario`` (call ``.build()`` for its program).

    ``comm_time(op, group, nbytes)`` costs a collective alone on its links; given, layers
    whose collectives are private to their group are fused into one task each (the run uses
    the cluster's planner; the search and estimates leave it out). ``strategy`` overrides the
    registered data-parallel strategy by tag. ``rank_key(rank)`` says what makes a rank's work
    its own; ranks of a stage with different keys are all simulated (:mod:`.symmetry`).
    ``nccl``: the NCCL constants of the cluster's catalog (for the default overlap slowdown).
    ``symmetry_off``: why every rank must be simulated (a perturbed link), if so.
    """
    return Workload(scenario, mesh or mesh_for(scenario), profile, gpus_per_node, symmetric, comm_time, node_kind,
                    strategy, rank_key, nccl, symmetry_off)
