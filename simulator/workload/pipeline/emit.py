"""Walking one rank's pipeline schedule: forward and backward passes of its chunks, the
point-to-point transfers between stages, and the data-parallel strategy's hooks.

For every action of the schedule (:mod:`.schedules`) the rank receives its input
(activations forward, gradients backward) from the neighbouring stage, runs the chunk's units
(:class:`~simulator.workload.layers.LayerEmitter`; the strategy's ``before``/``after`` hooks
around each), and sends its output on. A receive is posted when the rank's previous compute
is issued (``last_compute``); the sender and receiver join on one key, so the transfer starts
when both are ready. With ``parallelism.p2p_blocking`` a send holds its rank: the rank's next
pass starts only once the transfer is done (Megatron's ``_communicate`` waits on the batched
isend/irecv and then calls ``torch.cuda.synchronize``, megatron/core/pipeline_parallel/
p2p_communication.py:350-371 at NVIDIA/Megatron-LM@f2e5db402c44ae309aa6448bcb4ae87e8ae0f5f4;
megatron/p2p_communication.py:131-136 at 77efcccb); otherwise it runs beside the next compute.
Only the non-interleaved schedules hold: Megatron's interleaved schedule posts the receives of
the next step in the same batch as the sends (``send_forward_backward_recv_forward_backward``,
schedules.py:819 and 1029 at f2e5db40), which this per-pass emission (a receive posted when its
pass comes) does not mirror, and holding its sends would wait on receives not yet posted.

With ``parallelism.pp_microbatch_buffers`` (torch.distributed.pipelining, what torchtitan runs)
a stage's memory follows ``PipelineStage`` (torch/distributed/pipelining/stage.py at
pytorch/pytorch@88fa1e7170b48d369c6b00d545a89e97fb9e2e43): ``_prepare_forward_infra`` makes one
receive buffer per micro-batch for the input of every non-first stage, ``_create_grad_recv_info``
(called per micro-batch by ``_prepare_backward_infra``) one for the output gradient of every
non-last stage, both allocated once and reused every step; ``forward_one_chunk`` appends each
micro-batch's output to ``output_chunks``, cleared only when the next step starts
(``clear_runtime_states``). So every (virtual) stage holds ``m`` input and ``m`` gradient
buffers of its boundary activation (``norm_tokens * h`` elements) from the start, and from a
micro-batch's forward to the step's end its output: that activation again, or on the last
stage the logits (``tokens * V / tp`` elements in the activation dtype, vocab-sharded by
torchtitan's loss parallelism). A received input is the tensor the stage's first block saves
for its backward (the same storage), so while its micro-batch is in flight it is counted with
the block's stored activations and not again as a buffer. The stage's backward
(``torch.autograd.backward`` with the input as a leaf) leaves the input gradient on the
buffer's ``.grad``, cleared only by ``clear_runtime_states``: held, like the outputs, from
the micro-batch's backward to the step's end. When its micro-batches are done, the schedule's
``step`` returns the last stage's outputs merged (``_merge_outputs(self._stage.output_chunks)``
in ``PipelineScheduleSingle.step`` and ``PipelineScheduleMulti.step``,
torch/distributed/pipelining/schedules.py; ``merge_chunks`` concatenates each tensor output
along the batch dimension with ``torch.cat``, torch/distributed/pipelining/microbatch.py at
pytorch/pytorch@001e746388a1b6ae3b9af08a2707ff82961cdb03; torch 2.13 the same, its
``return_outputs`` defaulting to True): one new tensor of all ``m`` outputs, ``m`` logits,
made while ``output_chunks`` still holds them. torchtitan drops it at once (``pp_schedule.step(
target=labels, losses=losses)`` keeps no result, pytorch/torchtitan@9dec370ad26b5f8e9a7333a0e36165018262644b
train.py:287-292): a copy kernel after the last backward, its output allocated at its start and freed
at its end (on Llama 3.1 405B at tp 8, 8 micro-batches of 32,768 tokens: 8 * 32768 * 128256 / 8
* 2 B = 8,405,385,216 B).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, Literal

from simulator.ir import CommOp, MemDelta, TaskInfo
from simulator.scenario.spec import Scenario
from simulator.workload.data_parallel import Strategy
from simulator.workload.emitter import RankEmitter
from simulator.workload.layers import LayerEmitter
from simulator.workload.layout import Chunk, ModelLayout
from simulator.workload.pipeline.schedules import Action, pipeline_schedule

__all__ = ["PipelineEmitter"]

# a transfer task's stream and name, by direction and what it carries (one string each)
_P2P_NAMES = {(kind, what): (f"pp.{kind}.{what}", f"{kind}.{what}") for kind in ("send", "recv")
              for what in ("act", "grad")}


class PipelineEmitter:
    """Emits a rank's whole iteration (see the module docstring)."""

    def __init__(self, scenario: Scenario, layout: ModelLayout, layers: LayerEmitter, strategy: Strategy[Any]) -> None:
        self.sc = scenario
        self.layout = layout
        self.layers = layers
        self.strategy = strategy
        shard = layers.shard
        self.p2p_bytes = shard.norm_tokens * scenario.model.hidden * shard.elem
        self.buffers = scenario.parallelism.pp_microbatch_buffers and scenario.parallelism.pp > 1
        self.logits_bytes = shard.tokens * scenario.model.vocab / shard.tp * shard.elem
        self._held: list[int] = []  # p2p_blocking: the send the rank's next pass waits for
        self._p2p_ops: dict[tuple[int, int, int, bool], tuple[int, int, CommOp, int]] = {}
        self._group_runs: dict[tuple[int, tuple[int, ...], str, bool], list[list[int]]] = {}

    def emit_rank(self, emit: RankEmitter[Any]) -> None:
        par = self.sc.parallelism
        schedule = pipeline_schedule(par.pipeline_schedule, par.pp, emit.stage, self.sc.micro_batches,
                                     par.virtual_stages)
        last_b = {}
        self._held = []
        for i, action in enumerate(schedule):
            if action.kind == "B":
                last_b[action.chunk] = i
        kept: list[MemDelta] = []  # pp_microbatch_buffers: the outputs held until the step ends
        if self.buffers:
            emit.marker("pp.recv_buffers", [], self._recv_buffers(emit.stage))
        for i, action in enumerate(schedule):
            if action.kind == "F":
                kept += self._forward(emit, action)
            else:
                kept += self._backward(emit, action, last=(last_b[action.chunk] == i))
        if self.buffers and any(c.logits for c in self.layout.chunks_of_stage(emit.stage)):
            self._merge_outputs(emit)
        self.strategy.finish_rank(emit)
        if kept:
            emit.marker("pp.output_chunks.clear", [emit.last_compute], tuple(kept))
        emit.finished = True

    def _merge_outputs(self, emit: RankEmitter[Any]) -> None:
        """The last stage's ``step`` returns its micro-batches' outputs merged: one tensor of all
        ``m`` logits, concatenated while ``output_chunks`` still holds them (module docstring),
        and dropped at once by torchtitan; a copy kernel reading and writing it."""
        merged = self.sc.micro_batches * self.logits_bytes
        make = emit.emitter.memory_kernel
        kernel = make("pp.merge_outputs", 2 * merged, merged / self.layers.shard.elem) if make is not None else None
        if kernel is None or kernel.time_s <= 0:  # no time to hold it in: nothing to replay
            return
        emit.compute("pp.merge_outputs", kernel.time_s, [emit.last_compute],
                     mem=(MemDelta(False, merged, "activations"), MemDelta(True, -merged, "activations")),
                     info=TaskInfo(kernels=(kernel,)))

    def _recv_buffers(self, stage: int) -> tuple[MemDelta, ...]:
        """The receive buffers of a rank's stages, one allocation each (module docstring)."""
        m = self.sc.micro_batches
        count = sum(m * ((chunk.index > 0) + (not chunk.logits)) for chunk in self.layout.chunks_of_stage(stage))
        return tuple(MemDelta(False, self.p2p_bytes, "buffers") for _ in range(count))

    # forward / backward of one chunk for one micro-batch -------------------------------------

    def _forward(self, emit: RankEmitter[Any], action: Action) -> list[MemDelta]:
        """Emit one forward; returns the frees of what it keeps until the step ends."""
        chunk = self.layout.chunk_of(emit.stage, action.chunk)
        mb = action.microbatch
        deps: list[int] = self._release()
        if chunk.index > 0:
            deps.append(self._p2p(emit, chunk.index - 1, chunk.index, mb, "act", sending=False, deps=None))
            if self.buffers:  # the received buffer becomes the first block's saved input
                deps = [emit.marker("pp.recv_buffer.in_use", deps, (MemDelta(True, -self.p2p_bytes, "buffers"),))]
        deps = self._run_units(emit, chunk, self.layout.units_of(chunk), "fwd", mb, deps, last=False)
        if not chunk.logits:
            self._hold(self._p2p(emit, chunk.index, chunk.index + 1, mb, "act", sending=True, deps=deps))
        if not self.buffers:
            return []
        output = self.logits_bytes if chunk.logits else self.p2p_bytes
        emit.marker("pp.output_chunk", deps, (MemDelta(True, output, "activations"),))
        return [MemDelta(True, -output, "activations")]

    def _backward(self, emit: RankEmitter[Any], action: Action, *, last: bool) -> list[MemDelta]:
        """Emit one backward; returns the frees of what it keeps until the step ends."""
        chunk = self.layout.chunk_of(emit.stage, action.chunk)
        mb = action.microbatch
        deps: list[int] = self._release()
        if not chunk.logits:
            deps.append(self._p2p(emit, chunk.index + 1, chunk.index, mb, "grad", sending=False, deps=None))
        units = list(reversed(self.layout.units_of(chunk)))
        deps = self._run_units(emit, chunk, units, "bwd", mb, deps, last=last)
        kept: list[MemDelta] = []
        if self.buffers and chunk.index > 0:  # the block freed its saved input: the buffer stays, with its .grad
            emit.marker("pp.recv_buffer.idle", deps, (MemDelta(True, self.p2p_bytes, "buffers"),
                                                      MemDelta(True, self.p2p_bytes, "activations")))
            kept.append(MemDelta(True, -self.p2p_bytes, "activations"))
        if not chunk.embedding:
            self._hold(self._p2p(emit, chunk.index, chunk.index - 1, mb, "grad", sending=True, deps=deps))
        return kept

    def _hold(self, send: int) -> None:
        """p2p_blocking: the rank's next pass waits for this send (module docstring)."""
        par = self.sc.parallelism
        if par.p2p_blocking and par.pipeline_schedule != "interleaved":
            self._held.append(send)

    def _release(self) -> list[int]:
        held, self._held = self._held, []
        return held

    def _run_units(self, emit: RankEmitter[Any], chunk: Chunk, units: list[int], phase: str, mb: int,
                   deps: list[int], *, last: bool) -> list[int]:
        """Emit the units of one pass, fused into as few tasks as the strategy's hooks allow."""
        for group in self._groups(emit.stage, units, phase, last):
            for unit in group:
                deps = self.strategy.before(emit, unit, phase, mb, deps)
            task = self.layers.emit(emit, chunk, tuple(group), phase, mb, deps)
            deps = [task]
            for unit in group:
                self.strategy.after(emit, unit, phase, mb, task, last=last)
        return deps

    def _groups(self, stage: int, units: list[int], phase: str, last: bool) -> list[list[int]]:
        """Runs of units with no strategy hook between them (one unit each without fusion); the
        same for every rank and micro-batch of a stage (a strategy's boundaries depend on the
        stage, phase and ``last`` alone), so made once for each and shared (read only)."""
        key = (stage, tuple(units), phase, last)
        found = self._group_runs.get(key)
        if found is not None:
            return found
        if not self.layers.fuse_layers:
            found = [[u] for u in units]
        else:
            cut = self.strategy.boundary_units(stage, phase, last)
            groups: list[list[int]] = [[]]
            for unit in units:
                groups[-1].append(unit)
                if cut is None or unit in cut:
                    groups.append([])
            found = [g for g in groups if g]
        self._group_runs[key] = found
        return found

    # point-to-point ----------------------------------------------------------------------------

    def _peer(self, emit: RankEmitter[Any], rank: int, to_chunk: int) -> int:
        return emit.mesh.with_stage(rank, to_chunk % self.sc.parallelism.pp)

    def _p2p_op(self, emit: RankEmitter[Any], src_chunk: int, dst_chunk: int,
                sending: bool) -> tuple[int, int, CommOp, int]:
        """Source, destination, operation and pipeline (its stage-0 rank) of a rank's transfer
        between two chunks: the same for every micro-batch, made once per rank and direction."""
        rank = emit.rank
        key = (rank, src_chunk, dst_chunk, sending)
        found = self._p2p_ops.get(key)
        if found is None:
            if sending:
                src, dst = rank, self._peer(emit, rank, dst_chunk)
                pairs = tuple((x, self._peer(emit, x, dst_chunk)) for x in emit.siblings())
            else:
                src, dst = self._peer(emit, rank, src_chunk), rank
                pairs = tuple((self._peer(emit, x, src_chunk), x) for x in emit.siblings())
            comm = CommOp("p2p", (src, dst), self.p2p_bytes, "pp", pairs, "direct")
            found = self._p2p_ops[key] = (src, dst, comm, emit.mesh.with_stage(src, 0))
        return found

    def _p2p(self, emit: RankEmitter[Any], src_chunk: int, dst_chunk: int, mb: int, what: str, *, sending: bool,
             deps: list[int] | None) -> int:
        """A send (after ``deps``) or a receive (posted after the rank's last compute)."""
        if not sending:
            deps = [emit.last_compute] if emit.last_compute >= 0 else []
        src, dst, comm, position = self._p2p_op(emit, src_chunk, dst_chunk, sending)
        join: Hashable = ("pp", what, mb, src_chunk, dst_chunk, position)
        kind: Literal["send", "recv"] = "send" if sending else "recv"
        info = TaskInfo(mb=mb, src=src, dst=dst, src_chunk=src_chunk, dst_chunk=dst_chunk, role=kind)
        stream, name = _P2P_NAMES[kind, what]
        return emit.task(stream, name, "pp", comm=comm, join=join, deps=deps or [], info=info)
