"""PyTorch DDP gradient buckets (``sharding: none``), and the parameter records they hold.

Semantics (``torch/nn/parallel/distributed.py``, ``docs/source/notes/ddp.rst``;
shared/REFERENCE.md §2.1): parameters are assigned to buckets in definition order with a
first bucket of ``dist._DEFAULT_FIRST_BUCKET_BYTES`` (1 MiB) and ``bucket_cap_mb`` (25 MiB)
after it, a parameter larger than the cap filling a bucket alone; the bucket list is then
reversed, so the reducer's first bucket holds the last-defined parameters, whose gradients
backward produces first. A bucket's all-reduce is launched when every gradient in it is
ready, in bucket order, on one communication stream; the optimizer waits for all of them.
With gradient accumulation only the last micro-batch's backward communicates (``no_sync``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Param", "Bucket", "assign_buckets"]


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    numel: int
    unit: int  # index of the module (layer) whose backward produces its gradient


@dataclass(frozen=True)
class Bucket:
    params: tuple[Param, ...]
    nbytes: float

    @property
    def ready_unit(self) -> int:
        """Backward runs units in reverse: the bucket is ready after its lowest unit's backward."""
        return min(p.unit for p in self.params)


def assign_buckets(params: list[Param], elem_bytes: float, cap_bytes: float, first_cap_bytes: float) -> list[Bucket]:
    """Buckets in reduction order (reversed definition order), PyTorch's assignment."""
    buckets: list[list[Param]] = []
    current: list[Param] = []
    size = 0.0
    limit = first_cap_bytes
    for p in params:
        current.append(p)
        size += p.numel * elem_bytes
        if size >= limit:
            buckets.append(current)
            current, size, limit = [], 0.0, cap_bytes
    if current:
        buckets.append(current)
    return [Bucket(tuple(b), sum(p.numel for p in b) * elem_bytes) for b in reversed(buckets)]
