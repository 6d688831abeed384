"""Megatron tensor (and sequence) parallelism: where the TP collectives sit in each layer.

Registered as the ``tp`` pass of :mod:`simulator.workload.parallel`; sequence parallelism is
its variant (``shard.sequence_parallel``), since it moves the same collectives.

A layer becomes a list of *steps*: compute steps (kernels on the compute stream) and
collectives on the TP group (shared/REFERENCE.md §5; Shoeybi et al. 2019 §3, Korthikanti
et al. 2022 §4.2.2, Megatron-LM ``core/tensor_parallel/layers.py``). D = b*s*h*e bytes
(s/cp tokens under context parallelism), the full (gathered) tensor:

* TP only, forward: compute, AR(D) after the attention projection, compute, AR(D) after
  fc2. Backward: AR of the input gradient after the fc1 and qkv input-gradient GEMMs,
  each overlapped with that layer's weight-gradient GEMM (``tp_overlap``).
* TP + SP, forward: AG before qkv, RS after proj, AG before fc1, RS after fc2.
  Backward: AG of the output gradient before fc2 and proj (RS's backward), the extra AG
  that re-gathers the saved input for the fc1/qkv weight gradient (overlapped with the
  input-gradient GEMM), RS of the input gradient (overlapped with the weight gradient):
  4 AG + 2 RS per layer.
* Full recomputation replays the forward, collectives included (6 ARs per layer, ZeRO §8);
  Megatron-Core's selective ``mlp`` module re-runs the MLP's forward collectives (AG + RS, AR
  without SP) with its kernels before the MLP's backward.
* ``tp_comm_overlap`` (Megatron-Core ``--tp-comm-overlap``, Transformer Engine userbuffers;
  Wang et al. 2023, "Overlap communication with dependent computation via decomposition"):
  each all-gather is split into tp chunks pipelined with the GEMM that consumes it, and
  each reduce-scatter with the GEMM that produces it. A collective then runs beside its
  GEMM: the pair takes max(GEMM slowed by the shared SMs, collective), not their sum.
* Multi-head latent attention (:mod:`simulator.workload.mla`): the replicated down-projections
  run with ln1 before the attention's gather, the up-projections take qkv's place after it,
  and the attention's input collectives move the latents instead of the hidden state: the
  forward all-gather and the backward reduce-scatter T x (r_q + r_kv + rope) x e, the
  backward's re-gather of the saved input and, without sequence parallelism, the input
  gradient's all-reduce T x (r_q + r_kv) x e.
"""

from __future__ import annotations

from dataclasses import replace

from simulator.scenario.spec import ModelSpec
from simulator.workload.mla import mla_tp_bytes, mla_tp_names
from simulator.workload.model import Kernel, Shard, backward_of, block_forward, embedding_forward, logits_forward
from simulator.workload.moe import is_moe_mlp
from simulator.workload.steps import (
    CommStep,
    ComputeStep,
    LayerSpec,
    Step,
    attention_core,
    block_kernels,
    recompute_steps,
    recomputed_kernels,
    selective_backward,
)

__all__ = ["block_steps", "embedding_steps", "logits_steps", "place"]


def place(spec: LayerSpec, steps: list[Step]) -> list[Step]:
    """Tensor (and sequence) parallelism's pass over one layer: with tp > 1 the layer's
    kernels are regrouped around the TP collectives; with tp = 1 the steps stay as they are."""
    if spec.shard.tp == 1:
        return steps
    if spec.kind == "block":
        return block_steps(spec.model, spec.shard, spec.phase, tp_overlap=spec.tp_overlap,
                           recompute=spec.recompute, recompute_modules=spec.recompute_modules,
                           comm_overlap=spec.comm_overlap,
                           fwd=block_kernels(spec) if spec.moe is not None or spec.model.mla is not None else None)
    if spec.kind == "embedding":
        return embedding_steps(spec.model, spec.shard, spec.phase)
    return logits_steps(spec.model, spec.shard, spec.phase)


def _pick(kernels: list[Kernel], *names: str) -> tuple[Kernel, ...]:
    """The named kernels in their order, with the fp8 casts feeding them."""
    wanted = set(names)
    return tuple(k for k in kernels if k.name in wanted or k.of in wanted)


def _moe_mlp(kernels: list[Kernel], name: str) -> list[Step] | None:
    """An MoE layer's MLP as one step (its kernels in order), or None in a dense block."""
    moe = tuple(k for k in kernels if is_moe_mlp(k))
    return [ComputeStep(name, moe)] if moe else None


def _tensor_bytes(model: ModelSpec, shard: Shard) -> float:
    return shard.tokens * model.hidden * shard.elem


class _AttnInput:
    """The attention's input side under TP: ``pre`` the kernels before the gather of its input
    (ln1; MLA's replicated down-projections too), ``cols`` the column-parallel GEMMs consuming
    the gathered input (qkv; MLA's up-projections), ``gathered`` the bytes of the forward
    gather and of the backward's input-gradient reduce-scatter, ``saved`` those of the
    backward's re-gather of the saved input and of the input gradient's all-reduce without
    sequence parallelism (both T x h x e for the dense block; module docstring for MLA)."""

    pre: tuple[str, ...]
    cols: tuple[str, ...]

    def __init__(self, model: ModelSpec, shard: Shard) -> None:
        if model.mla is None:
            self.pre, self.cols = ("ln1",), ("qkv",)
            self.gathered = self.saved = _tensor_bytes(model, shard)
        else:
            self.pre, self.cols = mla_tp_names(model)
            latents, rope = mla_tp_bytes(model, shard)
            self.gathered, self.saved = latents + rope, latents

    def bwd(self, names: tuple[str, ...], *suffixes: str) -> list[str]:
        """Backward kernel names of ``names``: ln1.bwd, q_down.dgrad, q_down.wgrad, ..."""
        return [f"{n}{x}" for n in names for x in (suffixes or ((".bwd",) if n == "ln1" else (".dgrad", ".wgrad")))]


def block_steps(model: ModelSpec, shard: Shard, phase: str, *, tp_overlap: bool = True,
                recompute: str = "none", comm_overlap: bool = False, fwd: list[Kernel] | None = None,
                recompute_modules: frozenset[str] = frozenset({"core_attn"})) -> list[Step]:
    """Steps of one transformer block: phase ``fwd`` or ``bwd`` (``recompute`` selective: re-run
    the core in the attention backward; selective-op: a recompute step first, whose TP
    collectives, re-run by torchtitan's policy (it saves no all-gather output), are not
    modelled). ``fwd``: the block's forward kernels when they are not the dense block's (an
    MoE layer, :func:`~simulator.workload.steps.block_kernels`); its MLP stays one step without
    TP collectives, which the expert pass places (sequence parallelism only, as Megatron-Core
    requires with MoE: scenario/moe.py)."""
    fwd = block_forward(model, shard) if fwd is None else fwd
    core = attention_core(fwd)
    core_names = [k.name for k in core]
    steps: list[Step]
    if phase == "fwd":
        if shard.tp == 1:
            steps = [ComputeStep("fwd", tuple(fwd))]
        elif comm_overlap and shard.sequence_parallel:
            steps = _fwd_sp_pipelined(model, shard, fwd, core_names)
        else:
            steps = _fwd_tp(model, shard, fwd, core_names)
    else:
        core_again, bwd = selective_backward(fwd, recompute, recompute_modules, model.mla is not None)
        mlp_again = recomputed_kernels(fwd, backward_of(fwd), recompute_modules, model.mla is not None).get(
            "mlp", ()) if recompute == "selective" and shard.tp > 1 else ()
        bwd = [k for k in bwd if k not in mlp_again]
        if shard.tp == 1:
            steps = [ComputeStep("bwd", core_again + tuple(bwd))]
        elif comm_overlap and shard.sequence_parallel:
            steps = _bwd_sp_pipelined(model, shard, bwd, core_names, core_again)
        else:
            steps = _bwd_tp(model, shard, bwd, core_names, core_again, tp_overlap)
        if mlp_again:
            at = next((i + 1 for i, st in enumerate(steps) if st.name == "out.bwd"), 0)  # after the residual's
            names = [k.of or k.name for k in fwd if replace(k, of=mlp_again[0].of) in mlp_again]
            steps = [*steps[:at], *_mlp_again(model, shard, list(zip(names, mlp_again, strict=True)), comm_overlap),
                     *steps[at:]]
        steps = [*recompute_steps(fwd, model, recompute), *steps]
    return steps


def _mlp_again(model: ModelSpec, shard: Shard, again: list[tuple[str, Kernel]], pipelined: bool) -> list[Step]:
    """A dense MLP's forward re-run by the selective ``mlp`` module with its TP collectives: its
    checkpoint (``tensor_parallel.checkpoint``, transformer_layer.py:992-1012 at d98e8a6) re-runs
    the whole MLP, TE's fused norm-linear gathering its input under sequence parallelism and fc2
    reducing its output (random.py:635-672): the forward's AG and RS (beside fc1 and fc2 with
    ``comm_overlap``), or its AR without sequence parallelism; before the MLP's backward.
    ``again``: each re-run kernel with the forward kernel it repeats (its GEMM for a cast)."""
    d = _tensor_bytes(model, shard)

    def of(*names: str) -> tuple[Kernel, ...]:
        return tuple(k for name, k in again if name in names)

    if not shard.sequence_parallel:
        return [ComputeStep("recompute.mlp", of("ln2", "fc1", "act", "fc2")),
                CommStep("recompute.tp.ar.mlp", "all_reduce", d)]
    if pipelined:
        return [ComputeStep("recompute.ln2", of("ln2")),
                CommStep("recompute.tp.ag.mlp", "all_gather", d, overlap=True),
                ComputeStep("recompute.fc1", of("fc1")), ComputeStep("recompute.act", of("act")),
                CommStep("recompute.tp.rs.mlp", "reduce_scatter", d, overlap=True),
                ComputeStep("recompute.fc2", of("fc2"))]
    return [ComputeStep("recompute.ln2", of("ln2")), CommStep("recompute.tp.ag.mlp", "all_gather", d),
            ComputeStep("recompute.mlp", of("fc1", "act", "fc2")), CommStep("recompute.tp.rs.mlp", "reduce_scatter", d)]


def _fwd_tp(model: ModelSpec, shard: Shard, fwd: list[Kernel], core: list[str]) -> list[Step]:
    d = _tensor_bytes(model, shard)
    a = _AttnInput(model, shard)
    if not shard.sequence_parallel:
        return [
            ComputeStep("attn", _pick(fwd, *a.pre, *a.cols, *core, "proj")),
            CommStep("tp.ar.attn", "all_reduce", d),
            ComputeStep("mlp", _pick(fwd, "residual1", "ln2", "fc1", "act", "fc2")),
            CommStep("tp.ar.mlp", "all_reduce", d),
            ComputeStep("out", _pick(fwd, "residual2")),
        ]
    mlp: list[Step] = _moe_mlp(fwd, "mlp") or [
        CommStep("tp.ag.mlp", "all_gather", d),
        ComputeStep("mlp", _pick(fwd, "fc1", "act", "fc2")),
        CommStep("tp.rs.mlp", "reduce_scatter", d),
    ]
    return [
        ComputeStep("ln1", _pick(fwd, *a.pre)),
        CommStep("tp.ag.attn", "all_gather", a.gathered),
        ComputeStep("attn", _pick(fwd, *a.cols, *core, "proj")),
        CommStep("tp.rs.attn", "reduce_scatter", d),
        ComputeStep("ln2", _pick(fwd, "residual1", "ln2")),
        *mlp,
        ComputeStep("out", _pick(fwd, "residual2")),
    ]


def _bwd_tp(model: ModelSpec, shard: Shard, bwd: list[Kernel], core: list[str], recompute: tuple[Kernel, ...],
            overlap: bool) -> list[Step]:
    d = _tensor_bytes(model, shard)
    a = _AttnInput(model, shard)
    core_bwd = [n + ".bwd" for n in core] + [n + ".dgrad" for n in core] + [n + ".wgrad" for n in core]
    if not shard.sequence_parallel:
        return [
            ComputeStep("mlp.bwd", _pick(bwd, "residual2.bwd", "fc2.dgrad", "fc2.wgrad", "act.bwd", "fc1.dgrad")),
            CommStep("tp.ar.mlp.bwd", "all_reduce", d, overlap=overlap),
            ComputeStep("fc1.wgrad", _pick(bwd, "fc1.wgrad")),
            ComputeStep("attn.bwd", recompute + _pick(bwd, "ln2.bwd", "residual1.bwd", "proj.dgrad", "proj.wgrad",
                                                      *core_bwd, *a.bwd(a.cols, ".dgrad"))),
            CommStep("tp.ar.attn.bwd", "all_reduce", a.saved, overlap=overlap),
            ComputeStep("qkv.wgrad", _pick(bwd, *a.bwd(a.cols, ".wgrad"))),
            ComputeStep("ln1.bwd", _pick(bwd, *a.bwd(a.pre))),
        ]
    mlp: list[Step] = _moe_mlp(bwd, "mlp.bwd") or [
        CommStep("tp.ag.mlp.grad", "all_gather", d),
        ComputeStep("fc2.bwd", _pick(bwd, "fc2.dgrad", "fc2.wgrad", "act.bwd")),
        CommStep("tp.ag.mlp.input", "all_gather", d, overlap=overlap),
        ComputeStep("fc1.dgrad", _pick(bwd, "fc1.dgrad")),
        CommStep("tp.rs.mlp.bwd", "reduce_scatter", d, overlap=overlap),
        ComputeStep("fc1.wgrad", _pick(bwd, "fc1.wgrad")),
    ]
    return [
        ComputeStep("out.bwd", _pick(bwd, "residual2.bwd")),
        *mlp,
        ComputeStep("ln2.bwd", _pick(bwd, "ln2.bwd", "residual1.bwd")),
        CommStep("tp.ag.attn.grad", "all_gather", d),
        ComputeStep("attn.bwd", recompute + _pick(bwd, "proj.dgrad", "proj.wgrad", *core_bwd)),
        CommStep("tp.ag.attn.input", "all_gather", a.saved, overlap=overlap),
        ComputeStep("qkv.dgrad", _pick(bwd, *a.bwd(a.cols, ".dgrad"))),
        CommStep("tp.rs.attn.bwd", "reduce_scatter", a.gathered, overlap=overlap),
        ComputeStep("qkv.wgrad", _pick(bwd, *a.bwd(a.cols, ".wgrad"))),
        ComputeStep("ln1.bwd", _pick(bwd, *a.bwd(a.pre))),
    ]


def _fwd_sp_pipelined(model: ModelSpec, shard: Shard, fwd: list[Kernel], core: list[str]) -> list[Step]:
    """Forward under TP + SP with every collective beside its GEMM: AG with qkv and fc1 (the
    GEMMs consuming the gathered input), RS with proj and fc2 (the GEMMs producing it)."""
    d = _tensor_bytes(model, shard)
    a = _AttnInput(model, shard)
    mlp: list[Step] = _moe_mlp(fwd, "mlp") or [
        CommStep("tp.ag.mlp", "all_gather", d, overlap=True),
        ComputeStep("fc1", _pick(fwd, "fc1")),
        ComputeStep("act", _pick(fwd, "act")),
        CommStep("tp.rs.mlp", "reduce_scatter", d, overlap=True),
        ComputeStep("fc2", _pick(fwd, "fc2")),
    ]
    return [
        ComputeStep("ln1", _pick(fwd, *a.pre)),
        CommStep("tp.ag.attn", "all_gather", a.gathered, overlap=True),
        ComputeStep("qkv", _pick(fwd, *a.cols)),
        ComputeStep("core", _pick(fwd, *core)),
        CommStep("tp.rs.attn", "reduce_scatter", d, overlap=True),
        ComputeStep("proj", _pick(fwd, "proj")),
        ComputeStep("ln2", _pick(fwd, "residual1", "ln2")),
        *mlp,
        ComputeStep("out", _pick(fwd, "residual2")),
    ]


def _bwd_sp_pipelined(model: ModelSpec, shard: Shard, bwd: list[Kernel], core: list[str],
                      recompute: tuple[Kernel, ...]) -> list[Step]:
    """Backward under TP + SP with every collective beside a GEMM: the output-gradient AG
    with the dgrad GEMM consuming it, the input re-gather with the dgrad GEMM, the input-
    gradient RS with the wgrad GEMM (Megatron-Core's bulk overlaps and split pipelines)."""
    d = _tensor_bytes(model, shard)
    a = _AttnInput(model, shard)
    core_bwd = [n + ".bwd" for n in core] + [n + ".dgrad" for n in core] + [n + ".wgrad" for n in core]
    mlp: list[Step] = _moe_mlp(bwd, "mlp.bwd") or [
        CommStep("tp.ag.mlp.grad", "all_gather", d, overlap=True),
        ComputeStep("fc2.dgrad", _pick(bwd, "fc2.dgrad")),
        ComputeStep("fc2.wgrad", _pick(bwd, "fc2.wgrad", "act.bwd")),
        CommStep("tp.ag.mlp.input", "all_gather", d, overlap=True),
        ComputeStep("fc1.dgrad", _pick(bwd, "fc1.dgrad")),
        CommStep("tp.rs.mlp.bwd", "reduce_scatter", d, overlap=True),
        ComputeStep("fc1.wgrad", _pick(bwd, "fc1.wgrad")),
    ]
    return [
        ComputeStep("out.bwd", _pick(bwd, "residual2.bwd")),
        *mlp,
        ComputeStep("ln2.bwd", _pick(bwd, "ln2.bwd", "residual1.bwd")),
        CommStep("tp.ag.attn.grad", "all_gather", d, overlap=True),
        ComputeStep("proj.dgrad", _pick(bwd, "proj.dgrad")),
        ComputeStep("attn.bwd", recompute + _pick(bwd, "proj.wgrad", *core_bwd)),
        CommStep("tp.ag.attn.input", "all_gather", a.saved, overlap=True),
        ComputeStep("qkv.dgrad", _pick(bwd, *a.bwd(a.cols, ".dgrad"))),
        CommStep("tp.rs.attn.bwd", "reduce_scatter", a.gathered, overlap=True),
        ComputeStep("qkv.wgrad", _pick(bwd, *a.bwd(a.cols, ".wgrad"))),
        ComputeStep("ln1.bwd", _pick(bwd, *a.bwd(a.pre))),
    ]


def embedding_steps(model: ModelSpec, shard: Shard, phase: str) -> list[Step]:
    """Vocab-parallel embedding: AR (RS under SP) of its output in forward; backward local."""
    fwd = embedding_forward(model, shard)
    if phase == "bwd":
        return [ComputeStep("embedding.bwd", tuple(backward_of(fwd)))]
    steps: list[Step] = [ComputeStep("embedding", tuple(fwd))]
    if shard.tp > 1:
        op = "reduce_scatter" if shard.sequence_parallel else "all_reduce"
        steps.append(CommStep("tp.embedding", op, _tensor_bytes(model, shard)))
    return steps


def logits_steps(model: ModelSpec, shard: Shard, phase: str) -> list[Step]:
    """Output layer and vocab-parallel cross entropy (three tiny ARs of b*s fp32 values)."""
    fwd = logits_forward(model, shard)
    d = _tensor_bytes(model, shard)
    small = 3 * shard.tokens * 4.0
    if phase == "fwd":
        steps: list[Step] = []
        if shard.tp > 1 and shard.sequence_parallel:
            steps += [ComputeStep("final_ln", _pick(fwd, "final_ln")), CommStep("tp.ag.logits", "all_gather", d),
                      ComputeStep("logits", _pick(fwd, "logits", "cross_entropy"))]
        else:
            steps.append(ComputeStep("logits", tuple(fwd)))
        if shard.tp > 1:
            steps.append(CommStep("tp.ar.loss", "all_reduce", small))
        return steps
    bwd = backward_of(fwd)
    if shard.tp == 1:
        return [ComputeStep("logits.bwd", tuple(bwd))]
    op = "reduce_scatter" if shard.sequence_parallel else "all_reduce"
    return [
        ComputeStep("logits.bwd", _pick(bwd, "cross_entropy.bwd", "logits.dgrad")),
        CommStep("tp.logits.bwd", op, d, overlap=True),
        ComputeStep("logits.wgrad", _pick(bwd, "logits.wgrad", "final_ln.bwd")),
    ]
