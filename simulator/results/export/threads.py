"""Trace time and thread layout shared by the Chrome and HTA exports.

Timestamps are microseconds with nanosecond resolution (``round(t_s * 1e6, 3)``). Each
stream (``compute``, ``tp``, ``dp``, ``pp.send.act`` ...) gets a thread, in
:data:`STREAM_ORDER`; rows that would overlap on one thread without nesting (concurrent
operations on one stream) go to extra threads ``dp #2``, ``dp #3`` ... (:func:`assign_lanes`),
so every thread's slices nest properly. Thread ids start after :data:`ITERATION_TID`, the
thread of the ``ProfilerStep#N`` slice.
"""

from __future__ import annotations

from collections import defaultdict

from simulator.results.rows import Row
from simulator.units import MICROSECOND

__all__ = ["STREAM_ORDER", "ITERATION_TID", "to_us", "span_us", "assign_lanes", "stream_threads"]

STREAM_ORDER = ("compute", "tp", "cp", "ep", "shard", "dp", "pp", "offload")
ITERATION_TID = 1

# -- time ---------------------------------------------------------------------------------


def to_us(t_s: float) -> float:
    """Seconds -> trace microseconds, rounded to the nanosecond so equal instants stay equal."""
    return round(t_s / MICROSECOND, 3)


def span_us(row: Row) -> tuple[float, float]:
    start = to_us(row.start_s)
    return start, max(0.0, to_us(row.end_s) - start)


# -- threads ------------------------------------------------------------------------------


def _stream_key(stream: str) -> tuple[int, str]:
    head = stream.split(".", 1)[0]
    return (STREAM_ORDER.index(head) if head in STREAM_ORDER else len(STREAM_ORDER), stream)


def assign_lanes(spans: list[tuple[float, float]]) -> list[int]:
    """Lane of each ``(start, end)`` span so that spans on one lane never overlap.

    Greedy interval partitioning in start order: a span goes to the first lane whose last
    span ended at or before its start, else to a new lane. Spans that only touch share a
    lane. Returns one lane index per input span (0 = the stream's own thread).
    """
    order = sorted(range(len(spans)), key=lambda i: (spans[i][0], spans[i][1]))
    lane_end: list[float] = []
    lanes = [0] * len(spans)
    for i in order:
        start, end = spans[i]
        for lane, free_at in enumerate(lane_end):
            if free_at <= start:
                lanes[i] = lane
                lane_end[lane] = end
                break
        else:
            lanes[i] = len(lane_end)
            lane_end.append(end)
    return lanes


def stream_threads(rows: list[Row]) -> tuple[dict[tuple[str, int], int], list[tuple[int, str]], list[int]]:
    """Thread id of each (stream, lane), the (tid, name) list, and each row's tid."""
    by_stream: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        by_stream[r.stream].append(i)
    row_tid = [0] * len(rows)
    tids: dict[tuple[str, int], int] = {}
    names: list[tuple[int, str]] = []
    next_tid = ITERATION_TID + 1
    for stream in sorted(by_stream, key=_stream_key):
        idx = by_stream[stream]
        spans = [span_us(rows[i]) for i in idx]
        lanes = assign_lanes([(s, s + d) for s, d in spans])
        for lane in sorted(set(lanes)):
            tids[(stream, lane)] = next_tid
            names.append((next_tid, stream if lane == 0 else f"{stream} #{lane + 1}"))
            next_tid += 1
        for i, lane in zip(idx, lanes, strict=True):
            row_tid[i] = tids[(stream, lane)]
    return tids, names, row_tid
