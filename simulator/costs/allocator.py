"""PyTorch's CUDA caching allocator, replayed: the bytes it reserves for a sequence of
allocations and frees.

Every rule below is PyTorch's default configuration (no ``PYTORCH_CUDA_ALLOC_CONF``), read
from ``c10/cuda/CUDACachingAllocator.cpp`` (pytorch/pytorch@001074d25084fdb87a799823e395a50f5ec044d3):

* a request is rounded up to a multiple of 512 B (``kMinBlockSize``, ``round_size``);
* requests up to 1 MiB (``kSmallSize``) are served from the small pool, others from the
  large pool; a new segment (one ``cudaMalloc``) is 2 MiB (``kSmallBuffer``) for a small
  request, 20 MiB (``kLargeBuffer``) for one under 10 MiB (``kMinLargeAlloc``) and the
  request rounded up to 2 MiB (``kRoundLarge``) above (``get_allocation_size``);
* blocks are associated with the stream that allocated them: a freed block is cached for
  that stream only ("Once freed, blocks can be re-allocated on the same stream, but not on
  any other stream"), so each (stream, pool) is its own pool;
* a request takes the smallest cached free block of its pool that fits (best fit,
  ``get_free_block``); the block is split when the rest is at least 512 B (small pool) or more
  than 1 MiB (large pool, ``should_split``), else handed out whole; otherwise a new segment
  is allocated;
* a freed block merges with free neighbours of its own segment (``free_block`` /
  ``try_merge_blocks``), never across segments;
* when a new segment does not fit in the device's free memory, every cached segment that is
  wholly free is released (``release_cached_blocks``, all streams) and the allocation tried
  once more (``malloc``); ``release_available_cached_blocks`` does nothing while
  ``max_split_size`` is unlimited, the default.

The reserved bytes are the sum of the segments (``reserved_bytes`` statistic, what
``torch.cuda.max_memory_reserved`` reports at its peak). Expandable segments (an opt-in
configuration) are not modelled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["CachingAllocator", "Block", "round_size", "segment_size", "MIN_BLOCK_BYTES", "SMALL_SIZE_BYTES",
           "SMALL_BUFFER_BYTES", "LARGE_BUFFER_BYTES", "MIN_LARGE_ALLOC_BYTES", "ROUND_LARGE_BYTES"]

MIN_BLOCK_BYTES = 512  # kMinBlockSize
SMALL_SIZE_BYTES = 1 << 20  # kSmallSize: the largest small request
SMALL_BUFFER_BYTES = 2 << 20  # kSmallBuffer: a small-pool segment
LARGE_BUFFER_BYTES = 20 << 20  # kLargeBuffer: a segment for a request between 1 and 10 MiB
MIN_LARGE_ALLOC_BYTES = 10 << 20  # kMinLargeAlloc
ROUND_LARGE_BYTES = 2 << 20  # kRoundLarge


def round_size(nbytes: int) -> int:
    """A request rounded up to whole 512 B blocks (at least one)."""
    if nbytes < MIN_BLOCK_BYTES:
        return MIN_BLOCK_BYTES
    return MIN_BLOCK_BYTES * -(-nbytes // MIN_BLOCK_BYTES)


def segment_size(nbytes: int) -> int:
    """Bytes of the segment allocated for a (rounded) request no cached block serves."""
    if nbytes <= SMALL_SIZE_BYTES:
        return SMALL_BUFFER_BYTES
    if nbytes < MIN_LARGE_ALLOC_BYTES:
        return LARGE_BUFFER_BYTES
    return ROUND_LARGE_BYTES * -(-nbytes // ROUND_LARGE_BYTES)


@dataclass(eq=False)
class Block:
    segment: _Segment
    size: int
    allocated: bool = False
    prev: Block | None = None
    next: Block | None = None


@dataclass(eq=False)
class _Segment:
    key: tuple[str, bool]  # (stream, small pool)
    size: int
    order: int  # allocation order: stands for the address among equal sizes
    head: Block | None = None


@dataclass
class CachingAllocator:
    """One device's caching allocator. ``limit_bytes``: the device memory the allocator may
    take (the GPU's memory less what lives outside it); a segment that would exceed it makes
    the allocator release its wholly free cached segments first."""

    limit_bytes: float = math.inf
    reserved_bytes: int = 0
    allocated_bytes: int = 0
    peak_reserved_bytes: int = 0
    peak_allocated_bytes: int = 0
    over_limit: bool = False  # a segment was allocated beyond the limit even after releasing the cache
    _free: dict[tuple[str, bool], list[Block]] = field(default_factory=dict)
    _segments: list[_Segment] = field(default_factory=list)
    _made: int = 0

    def malloc(self, nbytes: float, stream: str) -> Block:
        """Allocate ``nbytes`` on ``stream``: the handle to give back to :meth:`free`."""
        size = round_size(max(0, math.ceil(nbytes)))
        key = (stream, size <= SMALL_SIZE_BYTES)
        block = self._best_fit(key, size)
        if block is None:
            block = self._new_segment(key, segment_size(size))
        self._free[key].remove(block)
        rest = block.size - size
        if rest >= MIN_BLOCK_BYTES if key[1] else rest > SMALL_SIZE_BYTES:
            tail = Block(block.segment, rest, False, block, block.next)
            if block.next is not None:
                block.next.prev = tail
            block.next, block.size = tail, size
            self._free[key].append(tail)
        block.allocated = True
        self.allocated_bytes += block.size
        self.peak_allocated_bytes = max(self.peak_allocated_bytes, self.allocated_bytes)
        return block

    def free(self, block: Block) -> None:
        """Return a block to the cache of the stream that allocated it, merged with free
        neighbours of its segment."""
        if not block.allocated:
            raise ValueError("block freed twice")
        block.allocated = False
        self.allocated_bytes -= block.size
        free = self._free[block.segment.key]
        for other in (block.prev, block.next):
            if other is not None and not other.allocated:
                free.remove(other)
                if other is block.prev:
                    other.size += block.size
                    other.next = block.next
                    if block.next is not None:
                        block.next.prev = other
                    block = other
                else:
                    block.size += other.size
                    block.next = other.next
                    if other.next is not None:
                        other.next.prev = block
        free.append(block)

    def shrink(self, block: Block, keep_bytes: float) -> None:
        """Part of an aggregate of tensors dies: an allocated block keeps its first
        ``keep_bytes`` (rounded up to 512 B) and its tail is freed."""
        keep = round_size(max(0, math.ceil(keep_bytes)))
        if keep >= block.size:
            return
        tail = Block(block.segment, block.size - keep, True, block, block.next)
        if block.next is not None:
            block.next.prev = tail
        block.next, block.size = tail, keep
        self.free(tail)

    def release_cached(self) -> None:
        """``release_cached_blocks``: give back every segment that is one free block."""
        for seg in list(self._segments):
            head = seg.head
            if head is not None and not head.allocated and head.next is None:
                self._free[seg.key].remove(head)
                self._segments.remove(seg)
                self.reserved_bytes -= seg.size

    def _best_fit(self, key: tuple[str, bool], size: int) -> Block | None:
        best: Block | None = None
        for b in self._free.setdefault(key, []):
            if b.size >= size and (best is None or (b.size, b.segment.order) < (best.size, best.segment.order)):
                best = b
        return best

    def _new_segment(self, key: tuple[str, bool], size: int) -> Block:
        if self.reserved_bytes + size > self.limit_bytes:
            self.release_cached()
            self.over_limit |= self.reserved_bytes + size > self.limit_bytes
        seg = _Segment(key, size, self._made)
        self._made += 1
        seg.head = Block(seg, size)
        self._segments.append(seg)
        self._free[key].append(seg.head)
        self.reserved_bytes += size
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)
        return seg.head
