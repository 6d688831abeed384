"""What running a GEMM in fp8 costs besides the GEMM: the casts, as memory-bound kernels.

Each fp8 GEMM ``[M, K] x [K, N]`` quantizes three tensors: the input (``M*K``) and the
weight (``K*N``) for the forward, the output gradient (``M*N``) for the backward's two
GEMMs. A cast reads the bf16 tensor (2 bytes per element) and writes fp8 (1 byte), once per
memory layout a GEMM needs (fp8 GEMMs on Hopper take the second operand column-major, so
the backward needs transposed copies); dynamic scaling reads the tensor once more for its
amax first. The bytes per element of every kernel follow torchao's own roofline model of
float8 training, ``torchao/testing/training/roofline_utils.py`` (pytorch/ao@36027d82,
``get_tensor_memory_traffic_ovhd_s`` :126-297, ``get_blockwise_float8_mem_sympy`` :449-510):

* ``tensorwise`` (dynamic per-tensor): input and output gradient: amax (read 2), one cast
  writing both layouts (2 + 1 + 1); weight: amax (2), a cast per pass (2 + 1 forward,
  2 + 1 backward). Transformer Engine's current scaling is costed the same.
* ``rowwise``: input and output gradient: a cast writing fp8 and a transposed bf16 copy
  (2 + 1 + 2), a cast of the copy (2 + 1); weight: cast (3) forward, transpose (2 + 2) and
  cast (3) backward.
* ``delayed`` (Transformer Engine DelayedScaling): the scale comes from the amax history and
  the cast records the new amax as it goes (no amax pass); TE's fused cast-transpose writes
  both layouts: 2 + 1 + 1 for every tensor, the weight's once for both passes.
* ``blockwise`` (1x128 activation and gradient blocks, 128x128 weight blocks): a
  quantization per operand layout, each 2 + 1 plus a 4-byte scale per block (:432-510).
* ``mxfp8``: a cast per layout, 2 + 1 plus one e8m0 scale byte per 32 elements (:274-297).

A cast fused into the kernel that produced the tensor (TE's ``LayerNormLinear``: the norm
writes fp8) drops the first kernel's bf16 read (the roofline's ``fuse_with_prev``).

Weights: torchao casts them in every micro-batch's forward and backward; Transformer Engine
caches the fp8 weight and its transpose for the step (Megatron passes
``is_first_microbatch``), so its weight casts are spread over the micro-batches. With an fp8
parameter all-gather the weight is cast on its shard before the gather (torchao
``WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather``; Megatron ``--fp8-param-gather``
casts the updated shard), ``1/shards`` of the bytes, with one amax all-reduce per step
(``precompute_float8_dynamic_scale_for_fsdp``) whose latency is not modelled, and the
backward transposes the gathered fp8 weight (1 + 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Fp8Casting", "CastKernel", "cast_kernels", "weight_cache_bytes", "Role", "Pass", "FP8_BYTES", "HP_BYTES"]

FP8_BYTES = 1.0  # e4m3 / e5m2
HP_BYTES = 2.0  # the bf16 tensor a cast reads

Role = Literal["input", "weight", "grad_output"]
Pass = Literal["fwd", "bwd"]

_H, _F = HP_BYTES, FP8_BYTES
_AMAX = ("amax", _H)  # read the bf16 tensor for its absolute maximum
_CAST_BOTH = ("cast", _H + 2 * _F)  # read bf16, write fp8 row- and column-major
_CAST = ("cast", _H + _F)
_BLOCK = 128.0
_MX = 32.0

# (pass, kernel name, bytes per element of the tensor) for each role, per recipe
_TABLE: dict[str, dict[str, tuple[tuple[str, str, float], ...]]] = {
    "tensorwise": {
        "input": (("fwd", *_AMAX), ("fwd", *_CAST_BOTH)),
        "weight": (("fwd", *_AMAX), ("fwd", *_CAST), ("bwd", *_CAST)),
        "grad_output": (("bwd", *_AMAX), ("bwd", *_CAST_BOTH)),
    },
    "rowwise": {
        "input": (("fwd", "cast", _H + _F + _H), ("bwd", "cast.t", _H + _F)),
        "weight": (("fwd", *_CAST), ("bwd", "transpose", 2 * _H), ("bwd", "cast.t", _H + _F)),
        "grad_output": (("bwd", "cast", _H + _F + _H), ("bwd", "cast.t", _H + _F)),
    },
    "delayed": {
        "input": (("fwd", *_CAST_BOTH),),
        "weight": (("fwd", *_CAST_BOTH),),
        "grad_output": (("bwd", *_CAST_BOTH),),
    },
    "blockwise": {
        "input": (("fwd", "quant", _H + _F + 4 / _BLOCK), ("bwd", "quant.t", _H + _F + 4 / _BLOCK)),
        "weight": (("fwd", "quant.t", _H + _F + 4 / _BLOCK**2), ("bwd", "quant", _H + _F + 4 / _BLOCK**2)),
        "grad_output": (("bwd", "quant", _H + _F + 4 / _BLOCK), ("bwd", "quant.t", _H + _F + 4 / _BLOCK)),
    },
    "mxfp8": {
        "input": (("fwd", "cast", _H + _F + 1 / _MX), ("bwd", "cast.t", _H + _F + 1 / _MX)),
        "weight": (("fwd", "cast", _H + _F + 1 / _MX), ("bwd", "cast.t", _H + _F + 1 / _MX)),
        "grad_output": (("bwd", "cast", _H + _F + 1 / _MX), ("bwd", "cast.t", _H + _F + 1 / _MX)),
    },
}

# torchao's fp8 all-gather: the gathered fp8 weight is transposed for the backward (read 1, write 1)
_FP8_TRANSPOSE = ("bwd", "transpose", 2 * _F)


@dataclass(frozen=True)
class Fp8Casting:
    """How one fp8 run casts (bound once from the scenario's ``training.fp8`` block).

    ``recipe``: tensorwise | rowwise | delayed | blockwise | mxfp8; ``cached_weights``: the
    fp8 weights are kept for the step (Transformer Engine) instead of cast per micro-batch
    (torchao); ``micro_batches``: per step, what cached weight casts are spread over;
    ``weight_shards``: > 1 when the weight is cast on its shard before an fp8 all-gather;
    ``fused_norm_input``: the norm before the QKV and MLP-up GEMMs writes their fp8 input
    (TE ``LayerNormLinear``); ``saves_fp8_inputs``: the linears keep their fp8 input for the
    backward instead of the 16-bit one (TE); ``output_head``: the LM head runs in fp8 too.
    """

    recipe: str = "tensorwise"
    cached_weights: bool = False
    micro_batches: int = 1
    weight_shards: int = 1
    fused_norm_input: bool = False
    saves_fp8_inputs: bool = False
    output_head: bool = False

    def __post_init__(self) -> None:
        if self.recipe not in _TABLE:
            raise ValueError(f"unknown fp8 recipe {self.recipe!r}; known: {', '.join(_TABLE)}")
        if self.micro_batches < 1 or self.weight_shards < 1:
            raise ValueError("micro_batches and weight_shards must be >= 1")


@dataclass(frozen=True)
class CastKernel:
    """One cast (or amax, transpose) kernel: its name suffix, the bytes it moves and the elements
    of the operand it sweeps."""

    name: str
    nbytes: float
    numel: float = 0.0


def _weight_entries(casting: Fp8Casting) -> list[tuple[str, str, float]]:
    """The weight's kernels per micro-batch: cast on the shard under an fp8 all-gather (plus
    the backward transpose of the gathered fp8 weight), spread over the step when cached."""
    entries = list(_TABLE[casting.recipe]["weight"])
    if casting.weight_shards > 1:
        forward = [(p, name, b / casting.weight_shards) for p, name, b in entries if p == "fwd"]
        entries = [*forward, _FP8_TRANSPOSE]
    if casting.cached_weights:
        entries = [(p, name, b / casting.micro_batches) for p, name, b in entries]
    return entries


def cast_kernels(casting: Fp8Casting, role: Role, numel: float, phase: Pass, *,
                 fused_read: bool = False) -> list[CastKernel]:
    """The kernels casting one GEMM operand of ``numel`` elements in pass ``phase``, in order.

    ``fused_read``: the producer of the tensor emits it in fp8 (only the input of a fused
    norm-linear), so the first kernel does not read the bf16 tensor.
    """
    entries = _weight_entries(casting) if role == "weight" else list(_TABLE[casting.recipe][role])
    out: list[CastKernel] = []
    for i, (p, name, per_element) in enumerate(entries):
        if fused_read and i == 0:
            per_element -= HP_BYTES
        if p == phase and per_element > 0:
            out.append(CastKernel(f"{name}_{role}", per_element * numel, numel))
    return out


def weight_cache_bytes(casting: Fp8Casting) -> float:
    """Bytes per parameter an fp8 run keeps beside its 16-bit weights for the whole step.

    torchao casts in every forward and backward and keeps nothing: 0 (the fp8 weight is a
    transient; under an fp8 all-gather the gathered buffer is already counted at 1 byte).
    Transformer Engine caches the fp8 weight and its transpose for the step: 1 + 1 = 2;
    with fp8 parameters (Megatron ``--fp8-param-gather``: ``fp8_param``, the shards gathered
    in fp8) the model's weight itself is fp8, so the 1-byte weight plus its 1-byte transpose
    take the 2 bytes of the bf16 weight: 2 - 2 = 0. Counted on every parameter (the
    embedding and norms, a few percent of a large model, have none: an overestimate).
    """
    if not casting.cached_weights:
        return 0.0
    return 0.0 if casting.weight_shards > 1 else 2.0 * FP8_BYTES
