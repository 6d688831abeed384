"""Context parallelism: the attention core as a ring of per-step attention calls, with the
key/value exchange each framework's implementation runs beside them.

Each rank holds s/cp tokens. Under a causal mask both implementations below cut the sequence
into 2*cp chunks and give rank r chunks r and 2cp-1-r, so every ring step costs the same: step
0 is the rank's own s/cp x s/cp block under the mask; each of the other cp-1 steps is one
unmasked call on half that area (all local queries against the first half of the visiting
keys, or the second half of the queries against all of them: s/cp x s/(2cp)). Every step is a
kernel call of its own, timed at the table's rate for its block (its length: the shorter
side), and every step after the first merges its partial output into the running one by the
log-sum-exp rule (one pass over the local queries' output: the block's 16-bit output read, the
fp32 accumulator read and written); the backward accumulates dQ over the steps and dK/dV per
visiting block likewise. Without a mask every step is a full unmasked s/cp x s/cp call.
Sources: Transformer Engine ``AttnFuncWithCPAndKVP2P`` (transformer_engine/pytorch/attention/
dot_product_attention/context_parallel.py); PyTorch ``_templated_ring_attention`` and
``_templated_ring_attention_backward`` (torch/distributed/tensor/experimental/_attention.py:
the "Context parallelism load balance algorithm" note, ``_is_causal_behavior``, ``_SDPAMerger``
with ``convert_to_f32 = True``, fp32 ``grad_query``/``grad_key``/``grad_value``).

How keys and values move (``parallelism.cp_comm``):

* ``ring-p2p`` (Transformer Engine, Megatron-Core ``--cp-comm-type p2p``): before step i the
  rank posts the send of the K/V it holds to the next rank and the receive of step i+1's, both
  double-buffered, so transfer i runs beside step i. Backward: the buffers hold K/V and the
  dK/dV accumulated so far, in the K/V dtype (``p2p_comm_buffers``: ``(2, *kv.shape)``,
  ``dtype=kv.dtype``); step 0 sends K/V only, the middle steps both, the last dK/dV only, each
  beside its step.
* ``allgather`` (PyTorch's experimental ``context_parallel``, torchtitan's default
  ``context_parallel_rotate_method = 'allgather'``): ``_AllGatherRotater`` issues one
  all-gather of every rank's K/V at step 0 and waits for it at step 1, so it runs beside step 0
  only. Backward gathers K/V the same way and rotates the fp32 dK/dV to the next rank after
  every step (``_AllToAllRotater``, ``permute_tensor``), waited for after the next step; the
  last rotation, after the last step, is waited for at once.

A ring step's transfer is one hop to the neighbour: costed as the all-gather over the cp group
whose per-rank received bytes are that one block (block * cp/(cp-1) gathered), i.e. one step of
the ring all-gather. The K/V exchanged have the model's kv heads, or the query heads when the
model repeats grouped K/V before its attention call (``parallelism.cp_kv_heads: repeated``).
Memory: with ``allgather`` the ring's backward holds the gathered K/V and fp32 dQ/dK/dV
(:func:`backward_workspace_bytes`, added to the block's backward workspace by
:class:`~simulator.workload.activations.ActivationSizes`). Registered as the ``cp`` pass of
:mod:`simulator.workload.parallel`.
"""

from __future__ import annotations

from dataclasses import replace

from simulator.costs.attention import AttentionShape
from simulator.workload.model import Kernel
from simulator.workload.steps import CommStep, ComputeStep, LayerSpec, Step

__all__ = ["place", "kv_elements", "ring_blocks", "merge_bytes", "backward_workspace_bytes", "ACCUMULATOR_BYTES"]

# Bytes per element of the accumulators the ring merges into: the forward output (both keep it
# in fp32: PyTorch's convert_to_f32; Transformer Engine corrects its fp32 ``out``), and the
# backward dQ/dK/dV (PyTorch fp32; Transformer Engine its p2p buffers in the K/V dtype, None).
FP32_BYTES = 4.0
ACCUMULATOR_BYTES: dict[str, tuple[float, float | None]] = {"ring-p2p": (FP32_BYTES, None),
                                                            "allgather": (FP32_BYTES, FP32_BYTES)}


def _core(k: Kernel) -> bool:
    return k.kind == "attention" or k.name.startswith(("scores", "softmax", "attn_v"))


def _backward(k: Kernel) -> bool:
    return k.name.endswith(".bwd") or ".dgrad" in k.name or ".wgrad" in k.name


def kv_elements(spec: LayerSpec) -> float:
    """Elements of the keys and values of one rank's s/cp tokens: 2 * b * (s/cp) * (kv/t) * d
    (query heads instead of kv heads when the model repeats them before attention)."""
    model, shard = spec.model, spec.shard
    heads = model.heads if spec.cp_kv_heads == "repeated" else model.n_kv_heads
    return 2.0 * shard.batch * shard.seq / shard.cp * heads / shard.tp * model.head_dim


def _query_elements(spec: LayerSpec) -> float:
    model, shard = spec.model, spec.shard
    return shard.batch * shard.seq / shard.cp * model.heads / shard.tp * model.head_dim


def backward_workspace_bytes(spec: LayerSpec) -> float:
    """Bytes the ring's backward holds beside the block's own workspace (``allgather`` only; 0
    without context parallelism or with ``ring-p2p``, whose double buffers are not counted):
    the all-gathered K/V of every rank (``_AllGatherRotater._aggregated_buffer``, kept for the
    whole ring loop: ``cp * kv`` elements in the K/V dtype), the fp32 ``grad_query`` and
    ``grad_key``/``grad_value`` accumulators, and the fp32 dK/dV in flight to the next rank
    (``next_grad_kv``): ``q * 4 + 2 * kv * 4``. Source:
    pytorch/pytorch@f2127dbdb01fc9319ce42b92d60344d19cbd0137
    torch/distributed/tensor/experimental/_attention.py (``_AllGatherRotater``,
    ``_templated_ring_attention_backward``)."""
    cp = spec.shard.cp
    if cp == 1 or spec.cp_comm != "allgather":
        return 0.0
    _, bwd_acc = ACCUMULATOR_BYTES["allgather"]
    acc = bwd_acc or spec.shard.elem
    kv = kv_elements(spec)
    return cp * kv * spec.shard.elem + (_query_elements(spec) + 2 * kv) * acc


def merge_bytes(spec: LayerSpec, *, backward: bool) -> float:
    """HBM bytes of merging one ring step's result into the accumulators (steps after the first):
    forward the output over the local queries (block e read, accumulator read and written);
    backward dQ over the queries and dK/dV over the visiting block, plus (PyTorch) the fp32 copy
    into the buffer it sends."""
    e = spec.shard.elem
    fwd_acc, bwd_acc = ACCUMULATOR_BYTES[spec.cp_comm]
    if not backward:
        return _query_elements(spec) * (e + 2 * fwd_acc)
    acc = e if bwd_acc is None else bwd_acc
    send_copy = 2 * acc if bwd_acc is not None else 0.0
    return (_query_elements(spec) + kv_elements(spec)) * (e + 2 * acc) + kv_elements(spec) * send_copy


def ring_blocks(core: list[Kernel], cp: int, causal: bool) -> list[list[Kernel]]:
    """The core's kernels as ``cp`` ring steps, each 1/cp of the FLOPs and bytes; a fused
    kernel's table shape per step: the masked s/cp block first, then unmasked s/cp x s/(2cp)
    blocks (causal), or unmasked s/cp blocks throughout (no mask)."""
    steps: list[list[Kernel]] = []
    for i in range(cp):
        step = []
        for k in core:
            base = k.name.removesuffix(".bwd")
            name = f"{base}.ring{i}" + (".bwd" if k.name.endswith(".bwd") else "")
            shape = k.attn
            if shape is not None:
                local = shape.seq  # s/cp
                shape = AttentionShape(local if i == 0 or not causal else local / 2, shape.head_dim,
                                       1.0 if i == 0 and causal else 0.0)
            step.append(replace(k, name=name, flops=k.flops / cp, nbytes=k.nbytes / cp, attn=shape))
        steps.append(step)
    return steps


def _hop(name: str, block_bytes: float, cp: int, *, overlap: bool = True) -> CommStep:
    """One ring hop of ``block_bytes`` per rank: one step of the ring all-gather (see the module)."""
    return CommStep(name, "all_gather", block_bytes * cp / (cp - 1), overlap=overlap, axis="cp")


def _ring(spec: LayerSpec, core: list[Kernel]) -> list[Step]:
    """The steps of one attention core under context parallelism (see the module docstring)."""
    cp, e = spec.shard.cp, spec.shard.elem
    backward = any(_backward(k) for k in core)
    blocks = ring_blocks(core, cp, spec.model.causal)
    merge = merge_bytes(spec, backward=backward)
    tag = "bwd." if backward else ""
    computes = [ComputeStep(f"attention.{tag}ring{i}", tuple(block) + (
        (Kernel(f"attention.{tag}merge{i}", "memory", 0.0, merge, None, block[0].section,
                elements=(_query_elements(spec),)),) if i else ()))
        for i, block in enumerate(blocks)]
    kv = kv_elements(spec) * e
    out: list[Step] = []
    if spec.cp_comm == "allgather":
        _, bwd_acc = ACCUMULATOR_BYTES["allgather"]
        dkv = kv_elements(spec) * (bwd_acc or e)
        out += [CommStep(f"cp.kv.allgather{'.bwd' if backward else ''}", "all_gather", kv * cp, overlap=True,
                         axis="cp"), computes[0]]
        for i in range(1, cp):
            if backward:
                out.append(_hop(f"cp.dkv.rotate{i - 1}", dkv, cp))
            out.append(computes[i])
        if backward:
            out.append(_hop(f"cp.dkv.rotate{cp - 1}", dkv, cp, overlap=False))
        return out
    for i in range(cp):
        if not backward and i < cp - 1:
            out.append(_hop(f"cp.kv.p2p{i}", kv, cp))
        elif backward:
            carried = (kv if i < cp - 1 else 0.0) + (kv if i > 0 else 0.0)  # K/V onward, dK/dV so far
            out.append(_hop(f"cp.kv_dkv.p2p{i}", carried, cp))
        out.append(computes[i])
    return out


def place(spec: LayerSpec, steps: list[Step]) -> list[Step]:
    """Replace each attention core of a block (a run of core kernels inside a compute step) by
    its ring of per-step calls and their K/V exchange; other layers and cp = 1 are left alone."""
    if spec.shard.cp == 1 or spec.kind != "block":
        return steps
    out: list[Step] = []
    for step in steps:
        if not isinstance(step, ComputeStep) or not any(_core(k) for k in step.kernels):
            out.append(step)
            continue
        pending: list[Kernel] = []
        core: list[Kernel] = []
        for k in (*step.kernels, None):
            if k is not None and _core(k) and (not core or _backward(k) == _backward(core[0])):
                if pending:
                    out.append(ComputeStep(step.name, tuple(pending)))
                    pending = []
                core.append(k)
                continue
            if core:
                out += _ring(spec, core)
                core = []
            if k is not None:
                if _core(k):
                    core.append(k)
                else:
                    pending.append(k)
        if pending:
            out.append(ComputeStep(step.name, tuple(pending)))
    return out
