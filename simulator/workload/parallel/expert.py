"""Expert parallelism's in-layer pass: the token dispatch and combine of an MoE layer
around its routed experts' kernels, the expert-TP all-gather / reduce-scatter inside them and,
under tensor parallelism, the shared experts' sequence-parallel collectives
(:mod:`simulator.workload.moe` describes the layer and cites Megatron-Core).

Per rank, with Tn the tokens a rank routes (b*s/cp, / tp under sequence parallelism), k the
top-k, f the imbalance factor, h the hidden size and e the activation bytes:

* dispatch and combine all-to-all over the ``ep`` group: ``f x Tn x k x h x e`` each;
* expert-TP all-gather before the routed experts and reduce-scatter after them (etp > 1)
  over the ``etp`` group: the gathered tensor, ``etp x f x Tn x k x h x e``;
* the ``allgather`` dispatcher: all-gather / reduce-scatter of ``ep x etp x Tn x h x e`` over
  the ``tp_ep`` group (ep x etp ranks) instead of both;
* the ``deepep`` dispatcher: DeepEP's dispatch and combine over the ``tp_ep`` group instead of
  both (Megatron-Core's MoEFlexTokenDispatcher: one group over etp x ep ranks, top-k and experts
  x etp, token_dispatcher.py:1809-1842 at d98e8a6), ``f x Tn x B`` each, B a token's bytes
  (:func:`simulator.costs.moe.deepep_token_bytes`: fp8 with scales in the dispatch direction
  when ``fp8_dispatch``, the forward dispatch and the backward's dispatch of output gradients;
  bf16 combines, arXiv:2412.19437 §3.3.2), run as the ``deepep`` algorithm, which sends each
  token once per destination rank and node (:func:`simulator.cluster.collective_algorithms.plan_deepep`),
  and taking ``deepep_sms`` of the GPU's SMs from compute beside it
  (:func:`simulator.workload.moe.deepep_slowdown`);
* shared experts under tp > 1: all-gather of the input and reduce-scatter of the output over
  ``tp`` (``b*s/cp x h x e`` gathered), as the dense MLP; in the backward the dense MLP's
  gradient all-gather, input re-gather and input-gradient reduce-scatter;
* selective ``recompute_modules`` (``tensor_parallel.checkpoint`` re-runs a function whole,
  collectives included, tensor_parallel/random.py:635-672 at d98e8a6): shared_experts re-runs
  the shared experts' all-gather and reduce-scatter around their re-run forward when tp > 1
  (moe_layer.py:517-533); moe re-runs the whole forward above, its exchange included, before
  the layer's backward (moe_layer.py:658-713).
"""

from __future__ import annotations

from dataclasses import replace

from simulator.cluster.collective_algorithms import deepep_algorithm
from simulator.costs.moe import deepep_token_bytes, dispatch_bytes_per_token
from simulator.workload.model import Kernel, backward_of
from simulator.workload.moe import EXPERT_KERNELS, forward_name, is_moe_mlp
from simulator.workload.steps import CommStep, ComputeStep, LayerSpec, Step, block_kernels, recomputed_kernels

__all__ = ["place"]


def _is_expert(kernel: Kernel) -> bool:
    return forward_name(kernel) in EXPERT_KERNELS


def _is_shared(kernel: Kernel) -> bool:
    return forward_name(kernel).startswith("shared.")


def place(spec: LayerSpec, steps: list[Step]) -> list[Step]:
    """The expert-parallel pass: split the compute step holding the routed experts' kernels and
    put the collectives of the module docstring around them (nothing to place when ep, etp and
    tp are all 1)."""
    moe = spec.moe
    if moe is None or moe.ep * moe.etp * spec.shard.tp == 1:
        return steps
    out: list[Step] = []
    for step in steps:
        if not isinstance(step, ComputeStep) or not any(_is_expert(k) for k in step.kernels):
            out.append(step)
            continue
        ks = list(step.kernels)
        i = next(n for n, k in enumerate(ks) if _is_expert(k))
        j = max(n for n, k in enumerate(ks) if _is_expert(k)) + 1
        before, experts, after = ks[:i], ks[i:j], ks[j:]
        shared = [k for k in ks if _is_shared(k)]
        before = [k for k in before if not _is_shared(k)]
        after = [k for k in after if not _is_shared(k)]
        if spec.phase == "bwd" and _recomputed(spec):
            head, before = _rerun_moe(spec, step.name, before)
            out += head
        if before:
            out.append(ComputeStep(f"{step.name}.pre", tuple(before)))
        out += (_forward if spec.phase == "fwd" else _backward)(spec, tuple(shared), tuple(experts))
        if after:
            out.append(ComputeStep(f"{step.name}.post", tuple(after)))
    return out


def _recomputed(spec: LayerSpec, group: str = "moe") -> tuple[Kernel, ...]:
    """The forward kernels the block's backward re-runs for the selective ``recompute_modules``
    group ``group`` (moe: the MoE layer's MLP; shared_experts;
    :func:`~simulator.workload.steps.recomputed_kernels`; empty otherwise)."""
    if spec.recompute != "selective" or group not in spec.recompute_modules:
        return ()
    fwd = block_kernels(spec)
    return recomputed_kernels(fwd, backward_of(fwd), spec.recompute_modules, spec.model.mla is not None).get(group, ())


def _rerun_moe(spec: LayerSpec, name: str, before: list[Kernel]) -> tuple[list[Step], list[Kernel]]:
    """The backward's kernels before the routed experts' split into the steps that re-run the MoE
    layer's forward under the ``moe`` module, with the forward's collectives (its dispatch and
    combine, expert-TP and shared experts' TP collectives: ``tensor_parallel.checkpoint`` re-runs
    the whole ``custom_forward``, moe_layer.py:658-713 at d98e8a6), and the backward kernels left
    (the kernels before the re-run, the pre-MLP norm's re-run among them, lead the first step)."""
    again = _recomputed(spec)
    rerun = [k for k in before if k in again]
    if not rerun:
        return [], before
    # the re-run kernels carry their anchor's name (of): classify them by the forward kernel each repeats
    orig = [k for k in block_kernels(spec) if is_moe_mlp(k)]
    fwd_of = {id(k): forward_name(orig[again.index(k)]) for k in rerun}
    first = before.index(rerun[0])
    experts = [k for k in rerun if fwd_of[id(k)] in EXPERT_KERNELS]
    shared = [k for k in rerun if fwd_of[id(k)].startswith("shared.")]
    lo = rerun.index(experts[0]) if experts else len(rerun)
    hi = rerun.index(experts[-1]) + 1 if experts else len(rerun)
    pre = [*before[:first], *(k for k in rerun[:lo] if k not in shared)]
    post = [k for k in rerun[hi:] if k not in shared]
    fwd = _forward(replace(spec, phase="fwd"), tuple(shared), tuple(experts))
    steps: list[Step] = [ComputeStep(f"{name}.recompute", tuple(pre))] if pre else []
    steps += [replace(s, name=f"recompute.{s.name}") for s in fwd]
    if post:
        steps.append(ComputeStep(f"{name}.recompute.post", tuple(post)))
    return steps, [k for k in before[first:] if k not in again]


def _exchange(spec: LayerSpec) -> tuple[list[CommStep], list[CommStep]]:
    """The token exchange before and after the routed experts, in the order a forward runs it
    (in a backward pass, deepep's sizes are those of the mirrored steps: the forward combine's
    gradient goes out as a dispatch, the forward dispatch's comes back as a combine)."""
    moe, model, shard = spec.moe, spec.model, spec.shard
    assert moe is not None
    tokens = shard.norm_tokens
    if moe.dispatcher == "deepep":
        if moe.ep * moe.etp == 1:
            return [], []
        algorithm = deepep_algorithm(model.experts * moe.etp, model.top_k * moe.etp, moe.max_nodes)
        out = tokens * deepep_token_bytes(model.hidden, moe.fp8_dispatch, shard.elem) * moe.factor
        back = tokens * deepep_token_bytes(model.hidden, False, shard.elem) * moe.factor
        dispatch, combine = (out, back) if spec.phase == "fwd" else (back, out)
        slow = moe.sm_slowdown
        return ([CommStep("dispatch", "all_to_all", dispatch, axis="tp_ep", algorithm=algorithm, sm_slowdown=slow)],
                [CommStep("combine", "all_to_all", combine, axis="tp_ep", algorithm=algorithm, sm_slowdown=slow)])
    if moe.dispatcher == "allgather":
        if moe.ep * moe.etp == 1:
            return [], []
        gathered = tokens * model.hidden * shard.elem * moe.ep * moe.etp
        return ([CommStep("dispatch", "all_gather", gathered, axis="tp_ep")],
                [CommStep("combine", "reduce_scatter", gathered, axis="tp_ep")])
    a2a = tokens * dispatch_bytes_per_token(model.hidden, model.top_k, shard.elem) * moe.factor
    first: list[CommStep] = [CommStep("dispatch", "all_to_all", a2a, axis="ep")] if moe.ep > 1 else []
    last: list[CommStep] = [CommStep("combine", "all_to_all", a2a, axis="ep")] if moe.ep > 1 else []
    if moe.etp > 1:
        first.append(CommStep("etp.ag", "all_gather", a2a * moe.etp, axis="etp"))
        last.insert(0, CommStep("etp.rs", "reduce_scatter", a2a * moe.etp, axis="etp"))
    return first, last


def _forward(spec: LayerSpec, shared: tuple[Kernel, ...], experts: tuple[Kernel, ...]) -> list[Step]:
    """tp.ag.shared -> dispatch (beside the shared experts with overlap_ep_comm) -> shared experts
    -> tp.rs.shared -> etp.ag -> routed experts -> etp.rs -> combine."""
    moe, shard = spec.moe, spec.shard
    assert moe is not None
    first, last = _exchange(spec)
    d = shard.tokens * spec.model.hidden * shard.elem
    tp_shared = bool(shared) and shard.tp > 1
    out: list[Step] = []
    if tp_shared:
        out.append(CommStep("tp.ag.shared", "all_gather", d))
    if first and shared and moe.overlap:  # the first exchange step runs beside the shared experts
        first[0] = replace(first[0], overlap=True)
        out += [first[0], ComputeStep("shared_experts", shared)]
        first = first[1:]
    elif shared:
        out += [*first, ComputeStep("shared_experts", shared)]
        first = []
    if tp_shared:
        out.append(CommStep("tp.rs.shared", "reduce_scatter", d))
    return [*out, *first, ComputeStep("experts", experts), *last]


def _backward(spec: LayerSpec, shared: tuple[Kernel, ...], experts: tuple[Kernel, ...]) -> list[Step]:
    """The forward's exchange mirrored (the combine's gradient first), then the shared experts'
    backward with the dense MLP's sequence-parallel collectives when tp > 1."""
    shard = spec.shard
    fwd_first, fwd_last = _exchange(spec)
    # each collective's backward: an all-gather's is a reduce-scatter and vice versa, an all-to-all's an all-to-all
    name = {"dispatch": "dispatch.bwd", "combine": "combine.bwd", "etp.ag": "etp.rs.bwd", "etp.rs": "etp.ag.bwd"}
    inverse = {"all_gather": "reduce_scatter", "reduce_scatter": "all_gather", "all_to_all": "all_to_all"}
    first = [replace(c, name=name[c.name], op=inverse[c.op]) for c in reversed(fwd_last)]
    last = [replace(c, name=name[c.name], op=inverse[c.op]) for c in reversed(fwd_first)]
    out: list[Step] = [*first, ComputeStep("experts.bwd", experts), *last]
    if not shared:
        return out
    if shard.tp == 1:
        return [*out, ComputeStep("shared_experts.bwd", shared)]
    d = shard.tokens * spec.model.hidden * shard.elem
    again = _recomputed(spec, "shared_experts")
    if again:  # their checkpoint re-runs their forward, its input's all-gather and output's reduce-scatter too
        shared = tuple(k for k in shared if k not in again)
        out += [CommStep("recompute.tp.ag.shared", "all_gather", d), ComputeStep("recompute.shared_experts", again),
                CommStep("recompute.tp.rs.shared", "reduce_scatter", d)]
    fc1 = tuple(k for k in shared if forward_name(k) == "shared.fc1")
    dgrad = tuple(k for k in fc1 if (k.of or k.name).endswith(".dgrad"))
    wgrad = tuple(k for k in fc1 if k not in dgrad)
    rest = tuple(k for k in shared if k not in fc1)
    overlap = spec.tp_overlap
    return [*out, CommStep("tp.ag.shared.grad", "all_gather", d), ComputeStep("shared.fc2.bwd", rest),
            CommStep("tp.ag.shared.input", "all_gather", d, overlap=overlap), ComputeStep("shared.fc1.dgrad", dgrad),
            CommStep("tp.rs.shared.bwd", "reduce_scatter", d, overlap=overlap), ComputeStep("shared.fc1.wgrad", wgrad)]
