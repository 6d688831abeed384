"""A layer as a list of steps: compute steps (kernels on the compute stream) and the
collectives that in-layer parallelisms insert between them.

:func:`base_steps` is a layer with no in-layer parallelism: one compute step holding all its
kernels. The passes of :mod:`simulator.workload.parallel` (tensor, context) each rewrite the
step list; :class:`LayerSteps` caches the result per (unit kind, phase), timed with the
compute profile.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from simulator.costs.compute import ComputeProfile
from simulator.costs.host import NO_HOST, HostCosts, host_time_s, issue_bound_time_s
from simulator.costs.memory import op_policy_saved_matmuls
from simulator.ir import KernelInfo
from simulator.scenario.spec import ModelSpec
from simulator.workload.mla import with_mla
from simulator.workload.model import (
    Kernel,
    Shard,
    backward_of,
    block_forward,
    embedding_forward,
    kernel_time_s,
    logits_forward,
)
from simulator.workload.moe import MOE_MLP_KERNELS, MoeShape, is_moe_mlp, with_moe_mlp

__all__ = ["ComputeStep", "CommStep", "Step", "LayerSpec", "TimedStep", "kernel_shape", "base_steps", "attention_core", "split_casts",
           "op_policy_recompute", "recompute_steps", "block_kernels", "split_weight_grads", "selective_backward",
           "recomputed_kernels"]

Phase = Literal["fwd", "bwd"]


@dataclass(frozen=True)
class ComputeStep:
    name: str
    kernels: tuple[Kernel, ...]


@dataclass(frozen=True)
class CommStep:
    name: str
    op: str
    nbytes: float
    overlap: bool = False  # runs concurrently with the next compute step
    axis: str = "tp"  # the mesh group: tp, cp (context parallelism's key/value exchange) or ep (MoE dispatch)
    algorithm: str | None = None  # a forced algorithm (DeepEP's dispatch / combine); None: NCCL's choice
    sm_slowdown: float | None = None  # compute slowdown beside it when its own (DeepEP's SMs); None: the run's


Step = ComputeStep | CommStep


@dataclass(frozen=True)
class LayerSpec:
    """What an in-layer pass needs to know about the layer it rewrites."""

    model: ModelSpec
    shard: Shard
    kind: str  # embedding | block | logits
    phase: str  # fwd | bwd
    tp_overlap: bool = True
    comm_overlap: bool = False
    recompute: str = "none"  # the block backward's recomputation policy (full replays the forward as its own pass)
    recompute_modules: frozenset[str] = frozenset({"core_attn"})  # selective: Megatron-Core's recompute_modules
    cp_comm: str = "ring-p2p"  # parallelism.cp_comm: how context parallelism moves K/V (ring-p2p | allgather)
    cp_kv_heads: str = "grouped"  # parallelism.cp_kv_heads: K/V heads the attention call sees (grouped | repeated)
    moe: MoeShape | None = None  # an MoE layer (workload/moe.py): its experts replace the dense MLP


@dataclass(frozen=True)
class TimedStep:
    """A step with its time and FLOPs, and for a compute step its kernels as traces show them."""

    step: Step
    duration_s: float = 0.0
    flops: float = 0.0
    kernels: tuple[KernelInfo, ...] = ()


def kernel_shape(kernel: Kernel) -> str:
    """A kernel's shape as traces show it: ``MxNxK`` for a GEMM ([M, K] x [K, N]), the block
    sequence length, head dim and masked share of a fused attention call, the tensor a
    memory-bound kernel sweeps (``TxH elements``), "" for a kernel with no shape."""
    if kernel.mnk is not None:
        return "x".join(f"{v:.10g}" for v in kernel.mnk)
    if kernel.attn is not None:
        a = kernel.attn
        return f"seq {a.seq:.10g}, head_dim {a.head_dim:.10g}, masked {a.causal_fraction:.10g}"
    if kernel.elements is not None:  # a memory-bound kernel: the tensor it sweeps, e.g. "8192x4096 elements"
        return "x".join(f"{v:.10g}" for v in kernel.elements) + " elements"
    return ""


def attention_core(fwd: list[Kernel]) -> list[Kernel]:
    """The attention core's kernels (fused attention, or scores/softmax/attn_v unfused)."""
    return [k for k in fwd if k.kind == "attention" or k.name in ("scores", "softmax", "attn_v")]


# the matmuls of each dtsim GEMM kernel (QKV and SwiGLU's gate/up run as one GEMM each)
_GEMM_MATMULS = {"qkv": ("wq", "wk", "wv"), "proj": ("wo",), "fc1": ("w1", "w3"), "fc2": ("w2",)}
_GELU_MATMULS = {"qkv": ("wq", "wk", "wv"), "proj": ("wo",), "fc1": ("fc1",), "fc2": ("fc2",)}


def op_policy_recompute(fwd: list[Kernel], model: ModelSpec) -> list[Kernel]:
    """The forward kernels torchtitan's op policy re-runs in a block's backward
    (:func:`simulator.costs.memory.op_policy_saved_matmuls`): every kernel but the fused
    attention and the saved matmuls' share of their GEMM (by output width), up to the MLP's
    product. Non-reentrant checkpointing stops recomputing once the last tensor the backward
    needs is rebuilt (early stop, on by default: pytorch torch/utils/checkpoint.py
    ``_enable_checkpoint_early_stop = True``); nothing after the down projection's input is
    needed, so the down projection and the last residual are not re-run. With SwiGLU and bf16:
    wk (``kv/(a+2kv)`` of the QKV GEMM), wo and w3 (half of the gate/up GEMM), i.e. every
    second matmul."""
    d = model.head_dim
    widths = {"wq": model.heads * d, "wk": model.n_kv_heads * d, "wv": model.n_kv_heads * d,
              "wo": 1.0, "w1": 1.0, "w3": 1.0, "w2": 1.0, "fc1": 1.0, "fc2": 1.0}
    parts = _GEMM_MATMULS if model.mlp == "swiglu" else _GELU_MATMULS
    saved = op_policy_saved_matmuls(model.mlp)
    core = {id(k) for k in attention_core(fwd)}
    out: list[Kernel] = []
    for k in fwd:
        if (k.of or k.name) == "fc2":
            break
        if id(k) in core:
            continue
        if k.kind == "gemm" and k.name in parts:
            names = parts[k.name]
            share = sum(widths[n] for n in names if n not in saved) / sum(widths[n] for n in names)
            if share <= 0.0:
                continue
            if share < 1.0 and k.mnk is not None:
                m, n, kk = k.mnk
                k = replace(k, flops=k.flops * share, nbytes=k.nbytes * share, mnk=(m, n * share, kk))
        out.append(k)
    return out


def recompute_steps(fwd: list[Kernel], model: ModelSpec, policy: str) -> list[Step]:
    """The step a block backward starts with: the op policy's recomputed forward (empty for
    the other policies; selective's attention core runs inside the backward steps)."""
    if policy != "selective-op":
        return []
    kernels = op_policy_recompute(fwd, model)
    return [ComputeStep("recompute", tuple(kernels))] if kernels else []


def _first_core_backward(bwd: list[Kernel], fwd: list[Kernel]) -> str:
    names = {k.name for k in attention_core(fwd)}
    return next((k.of or k.name for k in bwd if (k.of or k.name).split(".")[0] in names), "")


def selective_backward(fwd: list[Kernel], recompute: str, modules: frozenset[str], mla: bool
                       ) -> tuple[tuple[Kernel, ...], list[Kernel]]:
    """A block's backward under ``recompute``: (the attention core re-run at the start of the
    attention backward under selective recomputation with core_attn, Korthikanti et al. 2022 §5;
    the backward kernels with the forward kernels the other ``recompute_modules`` re-run, each
    group inserted before the backward kernel Megatron-Core re-runs it at and tagged with it
    (``of``), so the passes that regroup a backward keep it there). Megatron-Core registers each
    output-discarding recomputation as a gradient hook of the tensor its module's output
    feeds (``CheckpointWithoutOutput.discard_output_and_register_recompute``,
    megatron/core/tensor_parallel/random.py at NVIDIA/Megatron-LM@d98e8a64ddf34856e74b24714e3bedb2f5a39553)
    and a checkpointed module re-runs when the backward reaches its output:

    * layernorm: an MoE layer's pre-MLP norm before the MLP's backward (its hook on the MLP
      output, transformer_layer.py:1088-1093); MLA's input norm before the output projection's
      backward (its hook on the attention output, :683-688);
    * mla_up_proj: MLA's up-projections before the attention core's backward (their hook on the
      core's output, multi_latent_attention.py:455-458);
    * moe_act: the routed experts' activation before their fc2's backward (experts.py:1019-1030);
    * shared_experts: the shared experts' forward before their backward (moe_layer.py:517-533);
    * mlp: a dense layer's MLP, its norm fused into fc1, before its backward
      (transformer_layer.py:992-1012);
    * moe: an MoE layer's whole MLP (router, permutation, shared and routed experts) before its
      backward, after the pre-MLP norm's re-run that rebuilds its input (moe_layer.py:658-713;
      ``CheckpointFunction.backward`` re-runs the function when autograd reaches its output,
      tensor_parallel/random.py:635-672).

    The collectives a re-run module repeats are placed by the passes that place the forward's
    (:mod:`simulator.workload.parallel`), around the re-run kernels (:func:`recomputed_kernels`)."""
    bwd = backward_of(fwd)
    if recompute != "selective":
        return (), bwd
    core = tuple(attention_core(fwd)) if "core_attn" in modules else ()
    for again in recomputed_kernels(fwd, bwd, modules, mla).values():
        at = next((i for i, k in enumerate(bwd) if (k.of or k.name) == again[0].of), None)
        if at is not None:
            bwd = [*bwd[:at], *again, *bwd[at:]]
    return core, bwd


def recomputed_kernels(fwd: list[Kernel], bwd: list[Kernel], modules: frozenset[str], mla: bool
                       ) -> dict[str, tuple[Kernel, ...]]:
    """The forward kernels each selective ``recompute_modules`` group re-runs, as
    :func:`selective_backward` inserts them into ``bwd`` (the block's backward without them):
    tagged (``of``) with the backward kernel they run before, keyed by group (``layernorm.input``
    and ``layernorm.pre_mlp`` for the two norms), in insertion order."""
    moe_block = any(is_moe_mlp(k) for k in fwd)
    moe_anchor = next((k.of or k.name for k in bwd if is_moe_mlp(k)), "")
    groups: list[tuple[str, bool, tuple[str, ...], str]] = [
        ("layernorm.input", "layernorm" in modules and mla, ("ln1",), "proj.dgrad"),
        ("mla_up_proj", "mla_up_proj" in modules and mla, ("q_up", "kv_up", "q_proj"), _first_core_backward(bwd, fwd)),
        # before the norm's group, which then goes in front of it (it rebuilds the checkpoint's input)
        ("moe", "moe" in modules and moe_block, MOE_MLP_KERNELS, moe_anchor),
        ("layernorm.pre_mlp", "layernorm" in modules and moe_block, ("ln2",), moe_anchor),
        ("shared_experts", "shared_experts" in modules and moe_block, ("shared.fc1", "shared.act", "shared.fc2"),
         "shared.fc2.dgrad"),
        ("moe_act", "moe_act" in modules and moe_block, ("experts.act",), "experts.fc2.dgrad"),
        ("mlp", "mlp" in modules and not moe_block, ("ln2", "fc1", "act", "fc2"), "fc2.dgrad")]
    out: dict[str, tuple[Kernel, ...]] = {}
    for group, on, names, anchor in groups:
        again = tuple(replace(k, of=anchor) for k in fwd if (k.of or k.name) in names)
        if on and again and any((k.of or k.name) == anchor for k in bwd):
            out[group] = again
    return out


def block_kernels(spec: LayerSpec) -> list[Kernel]:
    """A block's forward kernels on one rank: the dense block's, with multi-head latent
    attention's projections and an MoE layer's MLP in place of the dense ones where the model has them."""
    model, shard = spec.model, spec.shard
    fwd = block_forward(model, shard)
    if model.mla is not None:
        fwd = with_mla(fwd, model, shard)
    if spec.moe is not None:
        fwd = with_moe_mlp(fwd, model, shard, spec.moe)
    return fwd


def base_steps(spec: LayerSpec) -> list[Step]:
    """The layer with no in-layer parallelism: one compute step of all its kernels."""
    model, shard = spec.model, spec.shard
    if spec.kind == "block":
        fwd = block_kernels(spec)
        if spec.phase == "fwd":
            return [ComputeStep("fwd", tuple(fwd))]
        core, bwd = selective_backward(fwd, spec.recompute, spec.recompute_modules, model.mla is not None)
        return [*recompute_steps(fwd, model, spec.recompute), ComputeStep("bwd", core + tuple(bwd))]
    if spec.kind == "embedding":
        fwd = embedding_forward(model, shard)
        return [ComputeStep("embedding", tuple(fwd))] if spec.phase == "fwd" else [
            ComputeStep("embedding.bwd", tuple(backward_of(fwd)))]
    fwd = logits_forward(model, shard)
    return [ComputeStep("logits", tuple(fwd))] if spec.phase == "fwd" else [
        ComputeStep("logits.bwd", tuple(backward_of(fwd)))]


def split_casts(steps: list[Step]) -> list[Step]:
    """Each run of fp8 cast kernels in a compute step becomes a step of its own, named after the
    GEMM pass it feeds (``qkv.fp8_cast``, ``fc2.dgrad.fp8_cast``), so the casts show as tasks and
    in fused timelines. A step that an overlapped collective runs beside is kept whole (the
    collective overlaps all of it, as before)."""
    out: list[Step] = []
    for i, step in enumerate(steps):
        beside = i > 0 and isinstance(steps[i - 1], CommStep) and steps[i - 1].overlap  # type: ignore[union-attr]
        if not isinstance(step, ComputeStep) or beside or all(k.kind != "cast" for k in step.kernels):
            out.append(step)
            continue
        runs: list[list[Kernel]] = []
        for k in step.kernels:
            if runs and (runs[-1][0].kind == "cast") == (k.kind == "cast"):
                runs[-1].append(k)
            else:
                runs.append([k])
        for run in runs:
            name = f"{run[0].of}.fp8_cast" if run[0].kind == "cast" else step.name
            out.append(ComputeStep(name, tuple(run)))
    return out


def timed(steps: list[Step], profile: ComputeProfile, precision: str, attention_kernel: str,
          host: HostCosts = NO_HOST, extra_host_s: float = 0.0) -> list[TimedStep]:
    """Each compute step of one layer pass with its time and FLOPs; collectives untimed (the
    network's).

    The pass's compute lasts max(roofline time of all its kernels, host time to issue them)
    (:func:`~simulator.costs.host.issue_bound_time_s`; one op per kernel at ``host.op_s``
    plus ``extra_host_s`` of fixed host work): when the host is the slower stage, every
    compute step is stretched by the same factor, so the pass's time does not depend on how
    an in-layer pass splits it into steps.
    """
    compute = [s for s in steps if isinstance(s, ComputeStep)]
    each = {id(s): [kernel_time_s(profile, k, precision, attention_kernel) for k in s.kernels] for s in compute}
    gpu = {key: sum(times) for key, times in each.items()}
    gpu_s = sum(gpu.values())
    host_s = host_time_s(sum(len(s.kernels) for s in compute), host, extra_host_s)
    stretch = issue_bound_time_s(gpu_s, host_s) / gpu_s if gpu_s > 0 else 1.0
    out = []
    for step in steps:
        if isinstance(step, ComputeStep):
            kernels = tuple(KernelInfo(k.name, k.kind, k.flops, k.nbytes, kernel_shape(k), t * stretch)
                            for k, t in zip(step.kernels, each[id(step)], strict=True))
            out.append(TimedStep(step, gpu[id(step)] * stretch, sum(k.flops for k in step.kernels), kernels))
        else:
            out.append(TimedStep(step))
    return out


def _is_weight_grad(kernel: Kernel) -> bool:
    """A weight-gradient GEMM (``qkv.wgrad``, ``experts.fc1.wgrad``) or an fp8 cast feeding one."""
    return (kernel.of or kernel.name).endswith(".wgrad")


def split_weight_grads(steps: list[TimedStep]) -> tuple[list[TimedStep], list[TimedStep]]:
    """A timed backward split for zero-bubble schedules (Qi et al., "Zero Bubble Pipeline
    Parallelism", arXiv:2401.10241 §2; DualPipe's ``WeightGradStore``): the input-gradient pass
    (every step without its weight-gradient kernels; a compute step left empty is dropped, its
    collectives kept) and the weight-gradient pass (those kernels as one compute step, possibly
    empty, run later with nothing to wait for on the network). Each kernel keeps its modelled
    time, so the two passes add up to the backward."""
    first: list[TimedStep] = []
    weights: list[tuple[Kernel, KernelInfo]] = []
    for t in steps:
        if not isinstance(t.step, ComputeStep):
            first.append(t)
            continue
        pairs = list(zip(t.step.kernels, t.kernels, strict=True))
        keep = [(k, info) for k, info in pairs if not _is_weight_grad(k)]
        weights += [(k, info) for k, info in pairs if _is_weight_grad(k)]
        if keep:
            first.append(_timed_of(ComputeStep(t.step.name, tuple(k for k, _ in keep)), keep))
    return first, [_timed_of(ComputeStep("wgrad", tuple(k for k, _ in weights)), weights)]


def _timed_of(step: ComputeStep, kernels: list[tuple[Kernel, KernelInfo]]) -> TimedStep:
    return TimedStep(step, sum(info.time_s for _, info in kernels), sum(k.flops for k, _ in kernels),
                     tuple(info for _, info in kernels))
