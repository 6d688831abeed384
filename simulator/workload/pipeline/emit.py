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
Only 1F1B and GPipe hold: Megatron's interleaved schedule posts the receives of
the next step in the same batch as the sends (``send_forward_backward_recv_forward_backward``,
schedules.py:819 and 1029 at f2e5db40), and DualPipe posts receives ahead of the passes that
need them (``_recv_forward`` before the pass in front, deepseek-ai/DualPipe
dualpipe/dualpipe.py ``step`` at 3da1bbea), which this per-pass emission (a receive posted when
its pass comes) does not mirror, and holding their sends would wait on receives not yet posted.

Under DualPipe (:func:`~.schedules.dualpipe`) a rank holds a chunk of each direction; the
reverse direction's transfers have queues of their own (``pp.send.act.reverse`` ...), as its
peers are the other neighbours, so neither direction waits behind the other's unmatched
transfer. A paired forward and backward (``Action.paired``: DualPipe's, and Megatron-Core's
combined 1F1B with ``parallelism.moe.overlap_a2a_1f1b``) are emitted step by step in turn
(:meth:`PipelineEmitter._forward_backward`); a zero-bubble backward's input-gradient half
(``I``) and its deferred weight gradients (``W``) are emitted as phases ``bwd_input`` and
``bwd_weight`` of :class:`~simulator.workload.layers.LayerEmitter`, the data-parallel
strategy's gradient hooks after the latter.

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

from collections.abc import Hashable, Iterator
from typing import Any, Literal

from simulator.ir import CommOp, MemDelta, TaskInfo
from simulator.scenario.spec import Scenario
from simulator.workload.data_parallel import Strategy
from simulator.workload.emitter import RankEmitter
from simulator.workload.layers import LayerEmitter
from simulator.workload.layout import Chunk, ModelLayout
from simulator.workload.pipeline.schedules import Action, pipeline_schedule

__all__ = ["PipelineEmitter"]


def _drain(tasks: Iterator[int]) -> list[int]:
    """Run a pass's emission to its end; the task what follows it waits for."""
    last = -1
    for task in tasks:
        last = task
    return [last]

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
                                     par.virtual_stages, combined=par.moe.overlap_a2a_1f1b)
        last_b = {}  # per chunk: the action that completes its weight gradients
        self._held = []
        for i, action in enumerate(schedule):
            if action.kind in ("B", "W"):
                last_b[action.chunk] = i
        kept: list[MemDelta] = []  # pp_microbatch_buffers: the outputs held until the step ends
        if self.buffers:
            emit.marker("pp.recv_buffers", [], self._recv_buffers(emit.stage))
        i = 0
        while i < len(schedule):
            action = schedule[i]
            if action.paired:  # DualPipe's F&B, combined 1F1B: the two passes interleaved step by step
                kept += self._forward_backward(emit, action, schedule[i + 1], last=(last_b.get(schedule[i + 1].chunk) == i + 1))
                i += 2
                continue
            if action.kind == "F":
                deps = self._recv_forward(emit, action)
                kept += self._send_forward(emit, action, _drain(self._forward_iter(emit, action, deps)))
            elif action.kind == "W":
                self._weights(emit, action, last=(last_b[action.chunk] == i))
            else:
                deps = self._recv_backward(emit, action)
                last = last_b.get(action.chunk) == i
                kept += self._send_backward(emit, action, _drain(self._backward_iter(emit, action, deps, last=last)))
            i += 1
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
        count = sum(m * ((not chunk.embedding) + (not chunk.logits)) for chunk in self.layout.chunks_of_stage(stage))
        return tuple(MemDelta(False, self.p2p_bytes, "buffers") for _ in range(count))

    # forward / backward of one chunk for one micro-batch -------------------------------------

    def _recv_forward(self, emit: RankEmitter[Any], action: Action) -> list[int]:
        """The held sends and the receive of the input activations a forward waits for."""
        chunk = self.layout.chunk_of(emit.stage, action.chunk)
        deps: list[int] = self._release()
        if not chunk.embedding:
            deps.append(self._p2p(emit, chunk.index - 1, chunk.index, action.microbatch, "act", sending=False, deps=None))
            if self.buffers:  # the received buffer becomes the first block's saved input
                deps = [emit.marker("pp.recv_buffer.in_use", deps, (MemDelta(True, -self.p2p_bytes, "buffers"),))]
        return deps

    def _forward_iter(self, emit: RankEmitter[Any], action: Action, deps: list[int]) -> Iterator[int]:
        chunk = self.layout.chunk_of(emit.stage, action.chunk)
        return self._run_units(emit, chunk, self.layout.units_of(chunk), "fwd", action.microbatch, deps, last=False)

    def _send_forward(self, emit: RankEmitter[Any], action: Action, deps: list[int]) -> list[MemDelta]:
        """Send a forward's output on; returns the frees of what it keeps until the step ends."""
        chunk = self.layout.chunk_of(emit.stage, action.chunk)
        mb = action.microbatch
        if not chunk.logits:
            self._hold(self._p2p(emit, chunk.index, chunk.index + 1, mb, "act", sending=True, deps=deps))
        if not self.buffers:
            return []
        output = self.logits_bytes if chunk.logits else self.p2p_bytes
        emit.marker("pp.output_chunk", deps, (MemDelta(True, output, "activations"),))
        return [MemDelta(True, -output, "activations")]

    def _recv_backward(self, emit: RankEmitter[Any], action: Action) -> list[int]:
        """The held sends and the receive of the output gradients a backward waits for."""
        chunk = self.layout.chunk_of(emit.stage, action.chunk)
        deps: list[int] = self._release()
        if not chunk.logits:
            deps.append(self._p2p(emit, chunk.index + 1, chunk.index, action.microbatch, "grad", sending=False, deps=None))
        return deps

    def _backward_iter(self, emit: RankEmitter[Any], action: Action, deps: list[int], *, last: bool) -> Iterator[int]:
        """A full backward (``B``), or its input-gradient half (``I``, weights deferred); a full
        one with ``parallelism.moe.delay_wgrad_compute`` as :meth:`_delayed_wgrad` runs it."""
        chunk = self.layout.chunk_of(emit.stage, action.chunk)
        units = list(reversed(self.layout.units_of(chunk)))
        if action.kind == "B" and self.sc.parallelism.moe.delay_wgrad_compute:
            return self._delayed_wgrad(emit, chunk, units, action.microbatch, deps, last=last)
        phase = "bwd" if action.kind == "B" else "bwd_input"
        return self._run_units(emit, chunk, units, phase, action.microbatch, deps, last=last)

    def _delayed_wgrad(self, emit: RankEmitter[Any], chunk: Chunk, units: list[int], mb: int, deps: list[int], *,
                       last: bool) -> Iterator[int]:
        """Megatron-Core's delay_wgrad_compute: a layer's weight-gradient GEMMs wait on the
        compute stream until the next layer's backward has started, so that the next layer's
        first all-to-all (its combine's backward) runs beside them rather than after them
        (``TransformerLayerSchedulePlan.run`` issues ``backward_dw`` after the input gradients,
        model_chunk_schedule_plan.py:270-301 at NVIDIA/Megatron-LM@3816e4de). Each unit's
        input-gradient half runs in the full backward's place; the previous unit's weight
        gradients (with the data-parallel gradient hooks, as after a deferred ``W``) are issued
        right after the unit's first compute step, and the last unit's at the end."""
        held: list[int] | None = None  # the units whose weight gradients wait
        for group in self._groups(emit.stage, units, "bwd", last):
            first = True
            task = -1
            for task in self._run_units(emit, chunk, group, "bwd_input", mb, deps, last=last):
                if first and held is not None:
                    _drain(self._run_units(emit, chunk, held, "bwd_weight", mb, [task], last=last))
                first = False
                yield task
            held, deps = group, [task]
        if held is not None:
            yield _drain(self._run_units(emit, chunk, held, "bwd_weight", mb, deps, last=last))[0]

    def _send_backward(self, emit: RankEmitter[Any], action: Action, deps: list[int]) -> list[MemDelta]:
        """Send a backward's input gradients on; returns the frees of what it keeps until the step ends."""
        chunk = self.layout.chunk_of(emit.stage, action.chunk)
        kept: list[MemDelta] = []
        if self.buffers and not chunk.embedding:  # the block freed its saved input: the buffer stays, with its .grad
            emit.marker("pp.recv_buffer.idle", deps, (MemDelta(True, self.p2p_bytes, "buffers"),
                                                      MemDelta(True, self.p2p_bytes, "activations")))
            kept.append(MemDelta(True, -self.p2p_bytes, "activations"))
        if not chunk.embedding:
            self._hold(self._p2p(emit, chunk.index, chunk.index - 1, action.microbatch, "grad", sending=True, deps=deps))
        return kept

    def _forward_backward(self, emit: RankEmitter[Any], fwd: Action, bwd: Action, *, last: bool) -> list[MemDelta]:
        """DualPipe's overlapped F&B chunk: both receives posted, then the forward's and the
        backward's steps alternately on the compute stream, so that each pass's collectives
        (the MoE dispatch and combine) run beside the other's compute; both outputs are sent
        once the pair is done (``_forward_backward_chunk``, deepseek-ai/DualPipe
        dualpipe/dualpipe.py at 3da1bbea)."""
        f_iter = self._forward_iter(emit, fwd, self._recv_forward(emit, fwd))
        b_iter = self._backward_iter(emit, bwd, self._recv_backward(emit, bwd), last=last)
        live = [f_iter, b_iter]
        while live:
            for it in list(live):
                if next(it, None) is None:
                    live.remove(it)
        done = [emit.last_compute]
        return self._send_forward(emit, fwd, done) + self._send_backward(emit, bwd, done)

    def _weights(self, emit: RankEmitter[Any], action: Action, *, last: bool) -> None:
        """A deferred weight-gradient pass (``W``); the strategy's gradient hooks follow it."""
        chunk = self.layout.chunk_of(emit.stage, action.chunk)
        units = list(reversed(self.layout.units_of(chunk)))
        _drain(self._run_units(emit, chunk, units, "bwd_weight", action.microbatch, self._release(), last=last))

    def _hold(self, send: int) -> None:
        """p2p_blocking: the rank's next pass waits for this send (module docstring)."""
        par = self.sc.parallelism
        if par.p2p_blocking and par.pipeline_schedule not in ("interleaved", "dualpipe"):
            self._held.append(send)

    def _release(self) -> list[int]:
        held, self._held = self._held, []
        return held

    def _run_units(self, emit: RankEmitter[Any], chunk: Chunk, units: list[int], phase: str, mb: int,
                   deps: list[int], *, last: bool) -> Iterator[int]:
        """Emit the units of one pass, fused into as few tasks as the strategy's hooks allow,
        yielding each compute task (the last one last). The weight-gradient pass of a
        zero-bubble schedule takes the strategy's backward hooks; its input-gradient pass none."""
        hooks = {"bwd_weight": "bwd", "bwd_input": "bwd_input"}.get(phase, phase)
        for group in self._groups(emit.stage, units, hooks, last):
            for unit in group:
                deps = self.strategy.before(emit, unit, hooks, mb, deps)
            task = -1
            for task in self.layers.emit_iter(emit, chunk, tuple(group), phase, mb, deps):
                yield task
            deps = [task]
            for unit in group:
                self.strategy.after(emit, unit, hooks, mb, task, last=last)

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
        return emit.mesh.with_stage(rank, self.layout.rank_of(to_chunk))

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
        if src_chunk >= self.sc.parallelism.pp and self.layout.dualpipe:  # the reverse direction's own queue
            stream += ".reverse"
        return emit.task(stream, name, "pp", comm=comm, join=join, deps=deps or [], info=info)
