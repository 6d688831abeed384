"""Data types: bytes per element and which precision stands in for a missing one.

The one place these facts live (the workload, the memory formulas, the compute profile and
the search all ask here).
"""

from __future__ import annotations

__all__ = ["bytes_per_element", "activation_bytes", "weight_bytes", "nearest_precision", "NEAREST_PRECISION"]

_DTYPE_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1}

# a precision without its own table (efficiency curve, measured peak) borrows its nearest
# one's: the other 16-bit format, fp32 <-> tf32 (same storage), fp8 -> bf16
NEAREST_PRECISION: dict[str, str] = {"fp16": "bf16", "bf16": "fp16", "tf32": "fp32", "fp8": "bf16", "fp32": "tf32"}


def bytes_per_element(dtype: str) -> int:
    """Storage bytes of one element of ``dtype`` (fp32 4, tf32 4, fp16/bf16 2, fp8 1)."""
    return _DTYPE_BYTES[dtype]


def activation_bytes(precision: str) -> int:
    """Bytes per activation element when training in ``precision``: 16-bit for the 16-bit
    formats and fp8 (Transformer Engine runs GEMMs in fp8 but keeps 16-bit activations),
    4 for fp32/tf32."""
    return 2 if precision in ("bf16", "fp16", "fp8") else 4


def weight_bytes(precision: str) -> int:
    """Bytes per parameter element as stored for compute and gathered: 16-bit weights under
    mixed precision (fp8 included), fp32 when training in fp32/tf32."""
    return 4 if precision in ("fp32", "tf32") else 2


def nearest_precision(precision: str) -> str | None:
    """The precision whose table stands in for ``precision`` (None if there is none)."""
    return NEAREST_PRECISION.get(precision)
