"""The caching allocator model (simulator/costs/allocator.py) and the replay of a rank's
memory timeline through it (simulator/results/reserved.py), against hand-derived values.

Rules (PyTorch's c10/cuda/CUDACachingAllocator.cpp, default configuration): requests round
up to 512 B; up to 1 MiB from 2 MiB segments, under 10 MiB from 20 MiB segments, larger ones
get a segment rounded up to 2 MiB; best fit among the free blocks of the requesting stream;
a large-pool block is split when more than 1 MiB would remain; free blocks merge within their
segment only; wholly free segments are released when a new one would not fit.
"""

from __future__ import annotations

import pytest

from simulator.costs.allocator import CachingAllocator, round_size, segment_size
from simulator.results.reserved import allocation_stream, reserved_peak
from simulator.results.rows import CommRecord, Row

KiB, MiB = 2**10, 2**20


def test_request_rounding_and_segment_sizes():
    """1 B -> 512 B, 513 B -> 1024 B; segments: 1 MiB -> 2 MiB (small), 1 MiB + 512 B and
    9 MiB -> 20 MiB, exactly 10 MiB -> 10 MiB, 11 MiB + 1 B -> 12 MiB (rounded up to 2 MiB)."""
    assert round_size(1) == 512 and round_size(512) == 512 and round_size(513) == 1024
    assert segment_size(MiB) == 2 * MiB
    assert segment_size(MiB + 512) == 20 * MiB and segment_size(9 * MiB) == 20 * MiB
    assert segment_size(10 * MiB) == 10 * MiB
    assert segment_size(11 * MiB + 512) == 12 * MiB


def test_small_requests_pack_into_2_mib_segments():
    """500 KiB = 512,000 B (a multiple of 512): four fill 2,048,000 of a 2,097,152 B segment;
    the 49,152 B left cannot hold a fifth, which opens a second segment: 4 MiB reserved."""
    a = CachingAllocator()
    for _ in range(4):
        a.malloc(500 * KiB, "s")
    assert a.reserved_bytes == 2 * MiB
    a.malloc(500 * KiB, "s")
    assert a.reserved_bytes == 4 * MiB and a.allocated_bytes == 5 * 500 * KiB


def test_medium_requests_share_a_20_mib_segment():
    """3 MiB requests: the first opens 20 MiB; each split leaves 17, 14, 11, 8, 5, 2 MiB (more
    than 1 MiB: split again), so six fit; the seventh opens a second 20 MiB segment."""
    a = CachingAllocator()
    for _ in range(6):
        a.malloc(3 * MiB, "s")
    assert a.reserved_bytes == 20 * MiB
    a.malloc(3 * MiB, "s")
    assert a.reserved_bytes == 40 * MiB


def test_large_request_gets_its_own_rounded_segment():
    """100 MiB + 1 B rounds to 100 MiB + 512 B (allocated) in a 102 MiB segment; the 2 MiB - 512 B
    left is more than 1 MiB, so it is split off and cached."""
    a = CachingAllocator()
    a.malloc(100 * MiB + 1, "s")
    assert a.reserved_bytes == 102 * MiB and a.allocated_bytes == 100 * MiB + 512


def test_blocks_are_cached_per_stream():
    """A 100 MiB block freed on stream a serves a on its next request but not b: 200 MiB
    reserved for 100 MiB ever allocated at once."""
    a = CachingAllocator()
    a.free(a.malloc(100 * MiB, "a"))
    b = a.malloc(100 * MiB, "b")
    assert a.reserved_bytes == 200 * MiB
    a.free(b)
    a.malloc(100 * MiB, "a")
    assert a.reserved_bytes == 200 * MiB and a.peak_allocated_bytes == 100 * MiB


def test_free_blocks_do_not_merge_across_segments():
    """Two free 100 MiB segments cannot serve 150 MiB: a third segment, 350 MiB reserved."""
    a = CachingAllocator()
    x, y = a.malloc(100 * MiB, "s"), a.malloc(100 * MiB, "s")
    a.free(x)
    a.free(y)
    a.malloc(150 * MiB, "s")
    assert a.reserved_bytes == 350 * MiB and a.allocated_bytes == 150 * MiB


def test_free_blocks_merge_within_a_segment():
    """Two 3 MiB blocks of a 20 MiB segment freed merge with the 14 MiB rest into 20 MiB, which
    serves 19 MiB whole (1 MiB left is not more than 1 MiB: no split): nothing new reserved."""
    a = CachingAllocator()
    x, y = a.malloc(3 * MiB, "s"), a.malloc(3 * MiB, "s")
    a.free(y)
    a.free(x)
    a.malloc(19 * MiB, "s")
    assert a.reserved_bytes == 20 * MiB and a.allocated_bytes == 20 * MiB


def test_best_fit_splits_the_smallest_block_that_fits():
    """Free 100 MiB and 50 MiB blocks: 40 MiB takes the 50 MiB one (10 MiB left, split), then
    90 MiB fits the 100 MiB one: still 150 MiB reserved; a further 20 MiB opens a new segment."""
    a = CachingAllocator()
    x, y = a.malloc(100 * MiB, "s"), a.malloc(50 * MiB, "s")
    a.free(x)
    a.free(y)
    a.malloc(40 * MiB, "s")
    a.malloc(90 * MiB, "s")
    assert a.reserved_bytes == 150 * MiB
    a.malloc(20 * MiB, "s")
    assert a.reserved_bytes == 170 * MiB


def test_cached_segments_are_released_when_the_device_is_full():
    """Limit 250 MiB: a cached free 100 MiB segment plus a new 200 MiB one would need 300 MiB,
    so the cache is released first: the reserved peak is 200 MiB, within the limit. A 100 MiB
    request then needs 300 MiB with nothing free to release: over the limit."""
    a = CachingAllocator(limit_bytes=250 * MiB)
    a.free(a.malloc(100 * MiB, "a"))
    a.malloc(200 * MiB, "b")
    assert (a.reserved_bytes, a.peak_reserved_bytes, a.over_limit) == (200 * MiB, 200 * MiB, False)
    a.malloc(100 * MiB, "b")
    assert a.over_limit and a.reserved_bytes == 300 * MiB


def test_shrink_frees_the_tail_of_a_block():
    """A 100 MiB block keeping 40 MiB frees a 60 MiB tail that serves a 60 MiB request."""
    a = CachingAllocator()
    x = a.malloc(100 * MiB, "s")
    a.shrink(x, 40 * MiB)
    assert a.allocated_bytes == 40 * MiB
    a.malloc(60 * MiB, "s")
    assert a.reserved_bytes == 100 * MiB and a.allocated_bytes == 100 * MiB


def test_double_free_is_an_error():
    a = CachingAllocator()
    x = a.malloc(MiB, "s")
    a.free(x)
    with pytest.raises(ValueError):
        a.free(x)


def _row(stream: str, t: float, delta: float, category: str, op: str | None = None) -> Row:
    comm = CommRecord(op=op, nbytes=delta) if op else None
    kind = "marker" if stream == "mem" else "compute" if op is None else "shard"
    return Row(0, stream, "task", kind, t, t, mem=((t, delta, category),), comm=comm)


def test_replay_keeps_each_streams_cache_apart():
    """Model states 100 MiB (the 1 GiB runtime reserve stays outside). t=0.5: the all-gather
    stream gets 30 MiB (buffers); t=1: compute 50 MiB (activations); t=1.5: a marker frees the
    buffers (back to the all-gather stream's cache); t=2: the activations are freed; t=3: compute
    asks 80 MiB: its only free block is 50 MiB, and the 30 MiB is the other stream's, so a new
    80 MiB segment: reserved 100 + 30 + 50 + 80 = 260 MiB, while at most 180 MiB is allocated."""
    rows = [_row("shard", 0.5, 30 * MiB, "buffers", "all_gather"), _row("compute", 1.0, 50 * MiB, "activations"),
            _row("mem", 1.5, -30 * MiB, "buffers"), _row("compute", 2.0, -50 * MiB, "activations"),
            _row("compute", 3.0, 80 * MiB, "activations")]
    initial = {"params": 100 * MiB, "other": 2**30}
    assert reserved_peak(initial, rows, 80e9) == 260 * MiB
    assert [allocation_stream(r) for r in rows[:3]] == ["shard:all_gather", "compute", "compute"]


def test_gradient_reduction_inputs_are_allocated_on_the_default_stream():
    """FSDP2 copies a reduce-scatter's input in on the default stream (pytorch#129721): 40 MiB
    of gradients on the reduce-scatter task, freed, then 40 MiB of activations reuse that block:
    40 MiB reserved, not 80."""
    rows = [_row("shard", 1.0, 40 * MiB, "grads", "reduce_scatter"), _row("shard", 2.0, -40 * MiB, "grads", "reduce_scatter"),
            _row("compute", 3.0, 40 * MiB, "activations")]
    assert allocation_stream(rows[0]) == "compute"
    assert reserved_peak({}, rows, 80e9) == 40 * MiB


def test_replay_frees_the_most_recent_allocations_of_a_category():
    """Two layers save 10 MiB and 20 MiB; backward frees 20 MiB (the exact match), then 25 MiB:
    the 10 MiB block and nothing more is live, so all of it goes; a 30 MiB request then fits
    neither 10 nor 20 MiB segment (no merging across segments): 10 + 20 + 30 = 60 MiB reserved."""
    rows = [_row("compute", 1.0, 10 * MiB, "activations"), _row("compute", 2.0, 20 * MiB, "activations"),
            _row("compute", 3.0, -20 * MiB, "activations"), _row("compute", 4.0, -25 * MiB, "activations"),
            _row("compute", 5.0, 30 * MiB, "activations")]
    assert reserved_peak({}, rows, 80e9) == 60 * MiB
