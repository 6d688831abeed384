"""The details of one trace row as JSON-safe event args (shared by the Chrome and HTA exports)."""

from __future__ import annotations

import math
from typing import Any

from simulator.ir import TaskInfo
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
    the task's other typed fields (:meth:`~simulator.ir.TaskInfo.extra_args`) follow."""
    info = row.info or TaskInfo()
    args: dict[str, Any] = {"category": row.category}
    duration_s = row.duration_s
    if info.phase is not None:
        args["phase"] = info.phase
    for value, out in ((info.mb, "micro_batch"), (info.layer, "layer"), (info.chunk, "virtual_stage")):
        if value is not None and not (out == "layer" and value < 0):  # -1: not a transformer layer
            args[out] = _clean(value)
    if info.flops:
        args["flops"] = float(info.flops)
        if duration_s > 0:
            args["achieved_tflop_per_s"] = round(float(info.flops) / duration_s / TERA, 3)
    comm = row.comm
    if comm is not None:
        nbytes = float(comm.nbytes or 0.0)
        count = int(comm.count or 1)
        args["op"] = comm.op
        args["bytes"] = nbytes
        if count != 1:
            args["count"] = count
        args["group_size"] = comm.ranks
        if comm.group is not None:
            args["group"] = _clean(tuple(comm.group))
        args["algorithm"] = comm.algorithm
        args["protocol"] = comm.protocol
        if duration_s > 0 and nbytes > 0:
            args["algbw_GB_per_s"] = round(nbytes * count / duration_s / GIGA, 3)
        if comm.alone_s:
            args["alone_us"] = round(float(comm.alone_s) / MICROSECOND, 3)
            args["slowdown_vs_alone"] = round(duration_s / float(comm.alone_s), 3)
    for key, value in info.extra_args().items():
        args.setdefault(key, _clean(value))
    return args
