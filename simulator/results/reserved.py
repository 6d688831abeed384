"""A rank's memory timeline replayed through the caching allocator: its reserved peak.

dtsim's memory changes are aggregates (a layer's saved activations, a unit's gathered
parameters, a bucket's gradients), each replayed as one allocation on the stream that makes
it (:mod:`simulator.costs.allocator`):

* the model states at t = 0 (each category one allocation) and every task's changes in time
  order (frees first at equal times, as the allocated timeline applies them);
* an allocation is made on the stream of the task that carries it, a gathering collective's
  on a stream of its own per kind: FSDP2 allocates the all-gather output on its copy-in
  stream, apart from the default stream ("avoid inter-stream fragmentation from using
  separate unshard streams", ``torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py``,
  ``FSDPCommContext.lazy_init``, pytorch@002a76fbfea0ac0f199e4b8e2a0691074796c908), and its
  copy-out allocates the unsharded parameter tensors on the default stream (a marker, see
  :mod:`simulator.workload.data_parallel.fsdp`); the
  input of a gradient reduction (reduce-scatter, all-reduce) is copied in on the default
  stream before the collective's stream waits on it (``foreach_reduce`` in
  ``_fsdp_collectives.py``, pytorch@010ae4a89516fa3be548ab16dff711414ec12d0b; since
  pytorch/pytorch#129721, June 2024, "to avoid fragmenting that memory across stream memory
  pools"), and a
  zero-time marker (a release, a gradient accumulation) stands for default-stream work;
* a free of a category returns that category's live allocations, most recent first (backward
  frees what forward saved in reverse order): an allocation of exactly the freed size first,
  else as many as the size covers, the last one in part (:meth:`CachingAllocator.shrink`);
* the runtime reserve (category ``other``) lives outside the allocator: the allocator's limit
  is the GPU's memory less it.

What the aggregates hide, the replay cannot show: the rounding of each real tensor (at most
512 B each, or 2 MiB for one above 10 MiB in its own segment) and the fragmentation between
tensors of one aggregate. The reserved peak is therefore the allocator's behaviour at dtsim's
granularity: segment rounding, per-stream caches and the splitting of cached blocks.
"""

from __future__ import annotations

from collections import defaultdict

from simulator.costs.allocator import Block, CachingAllocator
from simulator.results.rows import Row

__all__ = ["reserved_peak", "allocation_stream", "DEFAULT_STREAM"]

DEFAULT_STREAM = "compute"
_OUTSIDE = "other"  # the runtime reserve: not the caching allocator's
_REDUCTIONS = frozenset({"reduce_scatter", "all_reduce"})  # their input is copied in on the default stream


def allocation_stream(row: Row) -> str:
    """The stream whose cache an allocation of ``row`` lands in."""
    if row.category == "marker" or row.stream == "mem":
        return DEFAULT_STREAM
    if row.comm is not None:
        return DEFAULT_STREAM if row.comm.op in _REDUCTIONS else f"{row.stream}:{row.comm.op}"
    return row.stream


def reserved_peak(initial: dict[str, float], rows: list[Row], capacity_bytes: float) -> float:
    """Peak bytes the caching allocator of one rank reserves over its timeline."""
    allocator = CachingAllocator(limit_bytes=capacity_bytes - initial.get(_OUTSIDE, 0.0))
    live: dict[str, list[tuple[float, Block]]] = defaultdict(list)
    for category, nbytes in initial.items():
        if category != _OUTSIDE and nbytes > 0:
            live[category].append((nbytes, allocator.malloc(nbytes, DEFAULT_STREAM)))
    events = sorted((t, d, c, i) for i, r in enumerate(rows) for (t, d, c) in r.mem if c != _OUTSIDE and d != 0)
    for _t, delta, category, i in events:
        if delta > 0:
            live[category].append((delta, allocator.malloc(delta, allocation_stream(rows[i]))))
        else:
            _release(allocator, live[category], -delta)
    return float(allocator.peak_reserved_bytes)


def _release(allocator: CachingAllocator, blocks: list[tuple[float, Block]], nbytes: float) -> None:
    """Free ``nbytes`` of a category (``blocks``: its live allocations, requested bytes and
    handle): one of exactly that size if live, else the most recent ones, the last in part."""
    for j in range(len(blocks) - 1, -1, -1):
        if abs(blocks[j][0] - nbytes) <= 0.5:
            allocator.free(blocks.pop(j)[1])
            return
    while nbytes > 0.5 and blocks:
        requested, block = blocks[-1]
        if requested <= nbytes + 0.5:
            nbytes -= requested
            allocator.free(blocks.pop()[1])
        else:
            allocator.shrink(block, requested - nbytes)
            blocks[-1] = (requested - nbytes, block)
            return
