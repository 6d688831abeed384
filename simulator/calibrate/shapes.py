"""What a calibration measures: the transformer block, GEMM shapes and attention shapes.

With a scenario, the shapes are the ones the simulator itself asks the profile about: the
GEMMs of :func:`simulator.workload.model.block_forward` and their backward (input- and
weight-gradient) shapes, for the scenario's micro-batch and sequence length, at tensor-
parallel splits tp = 1, 2, 4, 8 (as far as tp divides the heads and the FFN width), and its
attention core at the same splits. Without one, the block is GPT-3 Small (125M) at micro-batch
1 and the sweeps are generic (square GEMMs, FlashAttention-2's benchmark setting on GPUs:
16k tokens, hidden 2048, head dimension 64 and 128; Dao 2023 §4.1). ``--quick`` scales the
block down (:func:`scaled_down`) and trims every sweep, so a CPU run takes seconds.

No torch here: shapes are plain numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from simulator.scenario import load_scenario
from simulator.scenario.spec import ModelSpec
from simulator.workload.model import Shard, backward_of, block_forward, logits_forward

__all__ = [
    "BlockShape",
    "GemmShape",
    "AttentionShape",
    "block_shape",
    "scaled_down",
    "gemm_shapes",
    "attention_shapes",
    "DEFAULT_MODEL",
]

DEFAULT_MODEL = "gpt3-125m"

DeviceKind = Literal["cpu", "cuda"]

# --quick caps of the measured block: (hidden, sequence, tokens per micro-batch)
_QUICK_CAPS = {"cpu": (256, 256, 512), "cuda": (2048, 2048, 8192)}


@dataclass(frozen=True)
class BlockShape:
    """One transformer block as the calibration runs it: ``model`` (single device, tp = 1)
    with ``batch`` sequences of ``seq`` tokens; ``source`` says where it came from."""

    model: ModelSpec
    batch: int
    seq: int
    source: str

    def describe(self) -> str:
        m = self.model
        return (f"{m.label}: hidden {m.hidden}, {m.heads} heads ({m.n_kv_heads} kv), ffn {m.ffn} {m.mlp}, "
                f"{'causal' if m.causal else 'bidirectional'}; micro-batch {self.batch} x {self.seq} tokens")


@dataclass(frozen=True, order=True)
class GemmShape:
    """(m x k) @ (k x n)."""

    m: int
    n: int
    k: int

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k


@dataclass(frozen=True, order=True)
class AttentionShape:
    """Fused attention over ``batch`` x ``heads`` x ``seq`` x ``head_dim`` (self-attention)."""

    batch: int
    heads: int
    seq: int
    head_dim: int
    causal: bool


def block_shape(scenario: str | Path | None, *, quick: bool, device: DeviceKind) -> BlockShape:
    """The block to calibrate: the scenario's model at its micro-batch and sequence length
    (or GPT-3 Small at micro-batch 1), scaled down with ``quick``."""
    if scenario is not None:
        sc = load_scenario(scenario)
        shape = BlockShape(sc.model, sc.training.micro_batch, sc.model.seq_len, f"scenario {scenario}")
    else:
        model = ModelSpec.model_validate(DEFAULT_MODEL)
        shape = BlockShape(model, 1, model.seq_len, f"default model {DEFAULT_MODEL}")
    return scaled_down(shape, *_QUICK_CAPS[device]) if quick else shape


def _largest_divisor_at_most(n: int, limit: int) -> int:
    return max(d for d in range(1, min(n, max(1, limit)) + 1) if n % d == 0)


def scaled_down(shape: BlockShape, max_hidden: int, max_seq: int, max_tokens: int) -> BlockShape:
    """The same architecture, smaller: hidden capped at ``max_hidden`` (keeping the head
    dimension, the query/key-value head ratio as far as divisibility allows, and the FFN/hidden
    ratio), sequence at ``max_seq``, micro-batch at ``max_tokens // seq`` (at least 1)."""
    m = shape.model
    d = m.head_dim
    heads = max(1, min(m.heads, max_hidden // d))
    hidden = heads * d
    group = m.heads // m.n_kv_heads
    kv = _largest_divisor_at_most(heads, max(1, heads // group))
    ffn = max(64, round(m.ffn * hidden / m.hidden / 64) * 64)
    seq = min(shape.seq, max_seq)
    batch = max(1, min(shape.batch, max_tokens // seq))
    if (hidden, seq, batch) == (m.hidden, shape.seq, shape.batch):
        return shape
    data = m.model_dump(by_alias=True)
    data.update(preset=None, name=f"{m.label} (scaled down)", hidden=hidden, heads=heads, kv_heads=kv,
                ffn_hidden=ffn, seq_len=seq)
    return BlockShape(ModelSpec.model_validate(data), batch, seq, shape.source + ", scaled down (--quick)")


def _tp_splits(model: ModelSpec, quick: bool) -> list[int]:
    splits: tuple[int, ...] = (1, 2) if quick else (1, 2, 4, 8)
    return [t for t in splits if model.heads % t == 0 and model.n_kv_heads % t == 0 and model.ffn % t == 0]


def _model_gemms(shape: BlockShape, quick: bool, with_logits: bool) -> set[GemmShape]:
    out: set[GemmShape] = set()
    for tp in _tp_splits(shape.model, quick):
        shard = Shard(batch=shape.batch, seq=shape.seq, tp=tp)
        forward = block_forward(shape.model, shard)
        if with_logits and tp == 1:
            forward += logits_forward(shape.model, shard)
        for kernel in forward + backward_of(forward):
            if kernel.kind == "gemm" and kernel.mnk is not None:
                m, n, k = (max(1, round(v)) for v in kernel.mnk)
                out.add(GemmShape(m, n, k))
    return out


_SQUARES = {
    ("cpu", True): (64, 128, 256, 512),
    ("cpu", False): (64, 128, 256, 512, 1024, 2048),
    ("cuda", True): (256, 512, 1024, 2048, 4096),
    ("cuda", False): (128, 256, 512, 1024, 2048, 4096, 8192),
}


def gemm_shapes(shape: BlockShape, *, scenario_given: bool, quick: bool, device: DeviceKind) -> list[GemmShape]:
    """GEMMs to time, smallest first: the block's (all tp splits, forward and backward) when a
    scenario is given, else square GEMMs plus the default block's; the logits GEMM only on a
    GPU without ``quick`` (it is the largest by far)."""
    shapes = _model_gemms(shape, quick, with_logits=device == "cuda" and not quick)
    if not scenario_given:
        shapes |= {GemmShape(n, n, n) for n in _SQUARES[(device, quick)]}
    return sorted(shapes, key=lambda g: (g.flops, g))


def attention_shapes(shape: BlockShape, *, scenario_given: bool, quick: bool,
                     device: DeviceKind) -> list[AttentionShape]:
    """Attention calls to time, smallest first (see the module docstring)."""
    m = shape.model
    out = {AttentionShape(shape.batch, m.heads // tp, shape.seq, m.head_dim, m.causal)
           for tp in _tp_splits(m, quick)}
    if not scenario_given:
        if device == "cpu":
            heads, tokens = (4, 1024) if quick else (8, 4096)
            cpu_seqs: tuple[int, ...] = (128, 256, 512) if quick else (256, 512, 1024, 2048)
            out |= {AttentionShape(max(1, tokens // s), heads, s, 64, True) for s in cpu_seqs}
        else:
            seqs: tuple[int, ...] = (512, 2048, 8192) if quick else (512, 1024, 2048, 4096, 8192)
            dims: tuple[int, ...] = (128,) if quick else (64, 128)
            out |= {AttentionShape(max(1, 16384 // s), 2048 // d, s, d, causal)
                    for s in seqs for d in dims for causal in (True, False)}
    return sorted(out)
