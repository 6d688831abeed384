"""Gradient buckets: PyTorch DDP's (``sharding: none``), Megatron-Core's (``zero.bucketing:
megatron-core``, :func:`megatron_buckets`), and the parameter records they hold.

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

__all__ = ["Param", "Bucket", "assign_buckets", "megatron_buckets", "split_expert", "EXPERT_SUFFIX"]

# the name ending of the routed-expert parameters (``ModelLayout.moe_params``)
EXPERT_SUFFIX = ".experts"


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    numel: int
    unit: int  # index of the module (layer) whose backward produces its gradient


@dataclass(frozen=True)
class Bucket:
    params: tuple[Param, ...]
    nbytes: float  # bytes of its gradients as reduced (0 where the caller sizes it: Megatron's layout)
    expert: bool = False  # routed-expert parameters: reduced and sharded over the expert data-parallel group

    @property
    def elements(self) -> float:
        """Gradient (and parameter) elements in the bucket."""
        return float(sum(p.numel for p in self.params))

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


def megatron_buckets(params: list[Param], cap_elements: float | None, own_bucket: frozenset[str] = frozenset()) -> list[Bucket]:
    """Megatron-Core's gradient (and parameter) buckets of one model chunk, in bucket order.

    ``ParamAndGradBuffer.__init__`` (NVIDIA/Megatron-LM@f2e5db402c44ae309aa6448bcb4ae87e8ae0f5f4
    megatron/core/distributed/param_and_grad_buffer.py:296-345): the parameters are walked in
    reverse definition order (roughly the order backward produces their gradients); a bucket is
    closed as soon as it holds ``cap_elements`` or more (so a parameter larger than the cap
    fills a bucket alone), and a parameter named in ``own_bucket`` (the shared embedding with
    the distributed optimizer, :305-325) closes the bucket before it and gets one of its own;
    ``cap_elements=None`` (no bucketing) puts everything else in one bucket. The buckets carry
    no byte size (``nbytes`` 0): one layout serves the gradient reduce-scatter and the parameter
    all-gather, each sizing ``Bucket.elements`` by the bytes it moves."""
    buckets: list[list[Param]] = []
    current: list[Param] = []
    size = 0.0
    for p in reversed(params):
        alone = p.name in own_bucket
        if alone and current:
            buckets.append(current)
            current, size = [], 0.0
        current.append(p)
        size += p.numel
        if alone or (cap_elements is not None and size >= cap_elements):
            buckets.append(current)
            current, size = [], 0.0
    if current:
        buckets.append(current)
    return [Bucket(tuple(b), 0.0) for b in buckets]


def split_expert(params: list[Param]) -> tuple[list[Param], list[Param]]:
    """(dense, routed-expert) parameters, each in definition order. Megatron-Core keeps the
    expert-parallel parameters (``allreduce = False``) in buffers of their own, reduced over the
    expert data-parallel group (``group_params_for_buffers`` keyed by ``is_expert_parallel``;
    ``expert_parallel_buffers`` on ``intra_expt_dp_group``,
    megatron/core/distributed/distributed_data_parallel.py:191-330 at NVIDIA/Megatron-LM@d98e8a64);
    the dense buffers' bucket groups come first, the expert ones after (:361-400)."""
    dense = [p for p in params if not p.name.endswith(EXPERT_SUFFIX)]
    expert = [p for p in params if p.name.endswith(EXPERT_SUFFIX)]
    return dense, expert
