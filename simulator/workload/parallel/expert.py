"""Expert parallelism's in-layer pass: the token dispatch and combine of an MoE layer
around its routed experts' kernels (:mod:`simulator.workload.moe` describes the layer)."""

from __future__ import annotations

from simulator.costs.moe import dispatch_bytes_per_token
from simulator.workload.model import Kernel
from simulator.workload.moe import EXPERT_KERNELS
from simulator.workload.steps import CommStep, ComputeStep, LayerSpec, Step

__all__ = ["place"]


def _is_expert(kernel: Kernel) -> bool:
    return kernel.name.split(".dgrad")[0].split(".wgrad")[0].split(".bwd")[0] in EXPERT_KERNELS


def place(spec: LayerSpec, steps: list[Step]) -> list[Step]:
    """The expert-parallel pass: split the compute step holding the routed experts' kernels and
    put the dispatch before them and the combine after them (ep > 1), each an all-to-all over
    the ``ep`` group (or all-gather / reduce-scatter for the allgather dispatcher)."""
    moe = spec.moe
    if moe is None or moe.ep == 1:
        return steps
    model, shard = spec.model, spec.shard
    if moe.dispatcher == "allgather":
        gathered = shard.tokens * model.hidden * shard.elem * moe.ep
        first, last = ("all_gather", gathered), ("reduce_scatter", gathered)
    else:
        a2a = shard.tokens * dispatch_bytes_per_token(model.hidden, model.top_k, shard.elem) * moe.factor
        first, last = ("all_to_all", a2a), ("all_to_all", a2a)
    out: list[Step] = []
    for step in steps:
        if not isinstance(step, ComputeStep) or not any(_is_expert(k) for k in step.kernels):
            out.append(step)
            continue
        ks = list(step.kernels)
        i = next(n for n, k in enumerate(ks) if _is_expert(k))
        j = max(n for n, k in enumerate(ks) if _is_expert(k)) + 1
        before, experts, after = ks[:i], ks[i:j], ks[j:]
        shared = [k for k in before if k.name.startswith("shared.")] if spec.phase == "fwd" else []
        before = [k for k in before if k not in shared]
        if before:
            out.append(ComputeStep(f"{step.name}.pre", tuple(before)))
        name = "dispatch" if spec.phase == "fwd" else "combine.bwd"
        overlap = moe.overlap and bool(shared)
        out.append(CommStep(name, first[0], first[1], overlap=overlap, axis="ep"))
        if shared:
            out.append(ComputeStep("shared_experts", tuple(shared)))
        out.append(ComputeStep("experts" if spec.phase == "fwd" else "experts.bwd", tuple(experts)))
        out.append(CommStep("combine" if spec.phase == "fwd" else "dispatch.bwd", last[0], last[1], axis="ep"))
        if after:
            out.append(ComputeStep(f"{step.name}.post", tuple(after)))
    return out
