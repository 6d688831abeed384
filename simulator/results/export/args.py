"""The details of one trace row as JSON-safe event args (shared by the Chrome and HTA exports)."""

from __future__ import annotations

import math
from typing import Any

from simulator.results.ranks import format_rank_ranges
from simulator.results.rows import Row
from simulator.units import GIGA, MICROSECOND, TERA

__all__ = ["row_args"]


def _clean(value: Any) -> Any:
    """JSON-safe: finite numbers, strings, bools, None; sequences of ranks as ranges."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (tuple, list)) and all(isinstance(v, int) for v in value):
        return format_rank_ranges(value, limit=16)
    return str(value)


def row_args(row: Row) -> dict[str, Any]:
    """The details of one row as trace args (JSON-safe): category, phase, micro-batch, layer,
    virtual stage, FLOPs and achieved TFLOP/s, and for communication op, bytes, group,
    algorithm, protocol, algorithm bandwidth (GB/s) and slowdown against running alone;
    other ``meta`` keys pass through."""
    meta = dict(row.meta or {})
    args: dict[str, Any] = {"category": row.category}
    duration_s = row.duration_s
    for key, out in (("phase", "phase"), ("mb", "micro_batch"), ("layer", "layer"), ("chunk", "virtual_stage")):
        if key in meta:
            value = meta.pop(key)
            if not (key == "layer" and isinstance(value, int) and value < 0):  # -1: not a transformer layer
                args[out] = _clean(value)
    flops = meta.pop("flops", None)
    if flops:
        args["flops"] = float(flops)
        if duration_s > 0:
            args["achieved_tflop_per_s"] = round(float(flops) / duration_s / TERA, 3)
    comm = row.comm
    if comm is not None:
        nbytes = float(comm.get("bytes") or 0.0)
        count = int(comm.get("count") or 1)
        args["op"] = comm.get("op")
        args["bytes"] = nbytes
        if count != 1:
            args["count"] = count
        args["group_size"] = comm.get("ranks")
        if comm.get("group") is not None:
            args["group"] = _clean(tuple(comm["group"]))
        args["algorithm"] = comm.get("algorithm")
        args["protocol"] = comm.get("protocol")
        if duration_s > 0 and nbytes > 0:
            args["algbw_GB_per_s"] = round(nbytes * count / duration_s / GIGA, 3)
        alone_s = comm.get("alone_s")
        if alone_s:
            args["alone_us"] = round(float(alone_s) / MICROSECOND, 3)
            args["slowdown_vs_alone"] = round(duration_s / float(alone_s), 3)
    for key, value in meta.items():
        args.setdefault(str(key), _clean(value))
    return args
