"""The data-parallel strategy interface: how gradients are synchronised and states sharded.

One small interface (:class:`Strategy`) and a registry keyed by ``parallelism.sharding``
(:mod:`simulator.workload.data_parallel`, shared/STYLE.md #7). The pipeline emission calls the hooks
while it walks a rank's schedule, for every *unit* (0 = embedding, ``layer + 1`` =
transformer block, ``layers + 1`` = logits), through a
:class:`~simulator.workload.emitter.RankEmitter` that carries the strategy's own typed state:

* ``model_states`` / ``static_buffers``: what the rank holds from the start;
* ``start_rank``: the strategy's state for one rank;
* ``boundary_units``: units after which the strategy needs a hook of its own (the others may
  be fused into one task);
* ``before(unit, phase)``: returns the dependencies of the unit's compute (parameter
  gathering, a blocking reduction to wait for);
* ``after(unit, phase)``: the unit's compute is issued (release gathered parameters;
  gradients ready: bucketed reductions);
* ``finish_rank``: the end of the iteration (last reductions, gradient-norm all-reduce,
  tied-embedding sync, optimizer step on the local shard, parameter all-gather).

Semantics follow the frameworks' code (shared/REFERENCE.md §2-§4, §9); each strategy's module
says which.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import cached_property
from typing import Generic, TypeVar

from simulator.cluster.mesh import Mesh
from simulator.costs.dtypes import bytes_per_element, weight_bytes
from simulator.costs.fp8 import FP8_BYTES
from simulator.costs.memory import ModelStateBytes, sharded_model_state_bytes
from simulator.ir import TaskInfo
from simulator.scenario.spec import Scenario
from simulator.workload.data_parallel.buckets import Param
from simulator.workload.emitter import Collective, RankEmitter
from simulator.workload.layout import ModelLayout

__all__ = ["Strategy", "grad_reduce_bytes", "param_bytes", "gathered_bytes_per_element", "host_memory_bandwidth", "S"]

# the parameters (``ModelLayout.chunk_params`` names) of the GEMMs an fp8 run quantizes (the
# routed ``.experts`` too when they run fp8 under Transformer Engine: gathered_bytes_per_element)
FP8_GEMM_WEIGHTS = (".qkv", ".proj", ".fc1", ".fc2", ".shared_experts")
ROUTED_EXPERTS = ".experts"
LM_HEAD = "final_norm+output"

S = TypeVar("S")

# DeepSpeed's CPU Adam streams fp32 master weights, momentum, variance and the gradient in
# and out (the same 28 bytes per parameter as the GPU step); it is vectorised and memory
# bound (ZeRO-Offload, Ren et al. ATC'21 §5.1). Fraction of the host memory bandwidth it
# reaches (estimate):
CPU_ADAM_BANDWIDTH_EFFICIENCY = 0.5
CPU_ADAM_BYTES_PER_PARAM = 28.0


def grad_reduce_bytes(scenario: Scenario) -> int:
    """Bytes per gradient element on the wire: the training dtype unless overridden."""
    dtype = scenario.training.grad_reduce_dtype
    if dtype == "fp32-for-bf16":
        # fp8 runs keep bf16 parameters (--bf16 --fp8-format): their main gradients are fp32 too
        dtype = "fp32" if scenario.training.precision in ("bf16", "fp8") else "auto"
    if dtype == "auto":
        return weight_bytes(scenario.training.precision)
    return bytes_per_element(dtype)


def param_bytes(scenario: Scenario) -> int:
    """Bytes per parameter element as gathered (16-bit weights; fp32 when training in fp32)."""
    return weight_bytes(scenario.training.precision)


def gathered_bytes_per_element(scenario: Scenario, params: list[Param]) -> float:
    """Mean bytes per element of ``params`` as all-gathered from their shards: :func:`param_bytes`,
    except the fp8 GEMM weights under ``training.fp8.all_gather: fp8``, 1 byte each (torchtitan
    ``enable_fsdp_float8_all_gather``, Megatron ``--fp8-param-gather``); norms, embeddings and
    a 16-bit LM head stay 16-bit. The routed experts' weights go in fp8 when they run fp8 under
    Transformer Engine (``--fp8-param-gather`` makes every TE module's weight fp8, the grouped
    experts' included); torchao's fp8 grouped experts gather in bf16 (torchtitan
    components/quantization/float8.md:53 at b5bcd76: rowwise scaling keeps communication in high
    precision)."""
    base = float(param_bytes(scenario))
    train = scenario.training
    total = sum(p.numel for p in params)
    if train.precision != "fp8" or train.fp8.all_gather != "fp8" or total == 0:
        return base
    experts = train.fp8.routed_experts_fp8 and train.fp8.gemms == "transformer-engine"
    fp8 = sum(p.numel for p in params
              if p.name.endswith(FP8_GEMM_WEIGHTS) or (p.name == LM_HEAD and train.fp8.output_head)
              or (experts and p.name.endswith(ROUTED_EXPERTS)))
    return (base * (total - fp8) + FP8_BYTES * fp8) / total


def host_memory_bandwidth(given: float | None, sockets: int) -> float:
    """Host DRAM bandwidth of a node: the node type's figure, else 8 channels of DDR4-3200
    (25.6 GB/s each) per socket = 204.8 GB/s per socket (estimate)."""
    return given if given else 204.8e9 * sockets


@dataclass
class Strategy(ABC, Generic[S]):
    """The interface, with the behaviour shared by every strategy (no sharding, no hooks);
    a strategy owns a typed per-rank state ``S`` made by :meth:`start_rank`."""

    scenario: Scenario
    mesh: Mesh
    layout: ModelLayout

    @property
    def grad_axis(self) -> str:
        """The ranks that hold the same parameters: dp, and cp ranks with them."""
        return "dp_cp" if self.mesh.cp > 1 else "dp"

    @cached_property
    def dp_ranks(self) -> int:
        """Ranks that hold the same parameters (dp x cp); asked for after every backward task."""
        return self.mesh.dp * self.mesh.cp

    @property
    def edp_ranks(self) -> int:
        """The ranks that hold the same routed-expert parameters: the expert data-parallel group,
        world / (pp * ep * etp) (:mod:`.buckets` ``split_expert``); dp x cp for a dense model."""
        return self.scenario.edp if self.scenario.model.moe else self.dp_ranks

    def axis_of(self, expert: bool) -> str:
        """The group a bucket's gradients are reduced (and its parameters gathered) over."""
        return "edp" if expert else self.grad_axis

    def ranks_of(self, expert: bool) -> int:
        return self.edp_ranks if expert else self.dp_ranks

    @property
    def reduces(self) -> bool:
        """Some gradients are reduced: dp x cp > 1, or an expert data-parallel group > 1."""
        return self.dp_ranks > 1 or self.edp_ranks > 1

    def shard_params(self, stage: int) -> float:
        """The parameters of ``stage`` a sharded optimizer steps on: the dense ones over dp x cp,
        the routed experts over the expert data-parallel group."""
        experts = self.layout.expert_params_of_stage(stage) if self.scenario.model.moe else 0.0
        return (self.layout.params_of_stage(stage) - experts) / self.dp_ranks + experts / self.edp_ranks

    # states and buffers ----------------------------------------------------------------

    def model_states(self, stage: int, params: float, per: ModelStateBytes) -> ModelStateBytes:
        return sharded_model_state_bytes(params, per, stage=0, shard_ranks=1)

    def static_buffers(self, params: float) -> float:
        return 0.0

    # hooks -------------------------------------------------------------------------------

    @abstractmethod
    def start_rank(self, rank: int) -> S:
        """The strategy's state for one simulated rank (``None`` for a stateless strategy)."""

    def boundary_units(self, stage: int, phase: str, last: bool) -> set[int] | None:
        """Units after which the strategy needs its own hook (a task boundary); None = after
        every unit. Units in between may be fused into one task. Depends on the arguments (and
        the fixed scenario) alone: the pipeline emitter asks once per stage, phase and ``last``."""
        return set()

    def before(self, emit: RankEmitter[S], unit: int, phase: str, mb: int, deps: list[int]) -> list[int]:
        return deps

    def after(self, emit: RankEmitter[S], unit: int, phase: str, mb: int, task: int, *, last: bool) -> None:
        return None

    def finish_rank(self, emit: RankEmitter[S]) -> None:
        deps = self.end_of_backward(emit, [emit.last_compute])
        emit.optimizer(deps, self.layout.params_of_stage(emit.stage))

    # shared pieces -------------------------------------------------------------------------

    def end_of_backward(self, emit: RankEmitter[S], deps: list[int], updated: float | None = None) -> list[int]:
        """Tied-embedding gradient sync between the first and last stage (Megatron); under
        sequence parallelism the all-reduce over tp of multi-head latent attention's replicated
        down-projections' and latent norms' gradients, each TP rank having seen only its share of
        the tokens (Megatron-Core finalize_model_grads.py:416-470 at d98e8a6, parameters marked
        sequence_parallel; the layer norms' own, 2h a layer, are not modelled). Under DualPipe,
        where ranks r and pp-1-r hold the same two stages (one per direction), the two copies'
        gradients are summed: an all-reduce between the mirror ranks, after the data-parallel
        reduction, of the ``updated`` parameters' gradients (what this rank's optimizer steps on:
        the stage's, or its shard; the reference adds each rank's gradients to its mirror's,
        deepseek-ai/DualPipe examples/example_dualpipe.py at 3da1bbea)."""
        out = list(deps)
        m = self.scenario.model
        if m.mla is not None and self.mesh.tp > 1 and self.scenario.parallelism.sequence_parallel:
            layers = sum(len(c.layers) for c in self.layout.chunks_of_stage(emit.stage))
            replicated = float(layers * m.mla.replicated_params(m.hidden) * grad_reduce_bytes(self.scenario))
            out.append(emit.collective(Collective("tp.replicated_grads", "all_reduce", "tp", replicated,
                                                  stream="tp", key="step", category="tp"), deps))
        if self.mesh.pp > 1 and m.tied_embeddings and emit.stage in (0, self.mesh.pp - 1):
            nbytes = self.layout.counts.embedding / self.mesh.tp * grad_reduce_bytes(self.scenario)
            out.append(emit.collective(Collective("embedding.grad_sync", "all_reduce", "embedding", nbytes,
                                                  stream="pp", key="step", category="pp"), deps))
        if self.scenario.parallelism.pipeline_schedule == "dualpipe":
            numel = self.layout.params_of_stage(emit.stage) if updated is None else updated
            out.append(emit.collective(Collective("dualpipe.grad_sync", "all_reduce", "dualpipe_mirror",
                                                  numel * grad_reduce_bytes(self.scenario), stream="pp",
                                                  key="step", category="pp"), deps))
        return out

    def grad_norm(self, emit: RankEmitter[S], group: str, deps: list[int]) -> list[int]:
        """The gradient-norm all-reduce of sharded optimizers (with gradient clipping)."""
        if not self.scenario.training.grad_clipping:
            return deps
        return [emit.collective(Collective("grad_norm", "all_reduce", group, 8.0, stream="dp", key="norm",
                                           category="dp"), deps)]

    def offload_step(self, emit: RankEmitter[S], shard_params: float, deps: list[int]) -> list[int]:
        """ZeRO-Offload: gradient shard to the host, CPU Adam, updated 16-bit shard back."""
        grad = shard_params * grad_reduce_bytes(self.scenario)
        down = emit.host_copy("d2h.grads", "d2h", grad, deps)
        node = self.scenario.cluster.node_type
        host_bw = host_memory_bandwidth(node.host_memory_bandwidth_bytes_per_s, node.pcie.cpu_sockets)
        ranks_per_node = self.scenario.cluster.gpus_in_node
        cpu_s = shard_params * CPU_ADAM_BYTES_PER_PARAM / (host_bw * CPU_ADAM_BANDWIDTH_EFFICIENCY / ranks_per_node)
        step = emit.task("offload", "cpu_adam", "offload", duration_s=cpu_s, deps=[down],
                         info=TaskInfo(phase="optimizer", params=shard_params))
        up = emit.host_copy("h2d.params", "h2d", shard_params * param_bytes(self.scenario), [step])
        return [up]
