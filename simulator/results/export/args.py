"""The details of one trace row as JSON-safe event args (shared by the Chrome and HTA exports)."""

from __future__ import annotations

import math
from typing import Any

from simulator.ir import KernelInfo, TaskInfo
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


def _kernel_args(kernels: tuple[KernelInfo, ...]) -> list[dict[str, Any]]:
    """Each kernel of a compute slice: name, kind, FLOPs, HBM bytes, shape (GEMMs and fused
    attention) and modelled time (us)."""
    out = []
    for k in kernels:
        entry: dict[str, Any] = {"name": k.name, "kind": k.kind, "flops": float(k.flops), "bytes": float(k.nbytes)}
        if k.shape:
            entry["shape"] = k.shape
        entry["modelled_us"] = round(k.time_s / MICROSECOND, 3)
        out.append(entry)
    return out


def row_args(row: Row) -> dict[str, Any]:
    """The details of one row as trace args (JSON-safe): category, phase, micro-batch, layer
    (``-1``: the embedding; the number of blocks: the output layer), virtual stage; for compute FLOPs, HBM bytes,
    achieved TFLOP/s and the kernels (:func:`_kernel_args`); for communication op, bytes,
    group, algorithm, protocol, algorithm bandwidth (GB/s) and slowdown against running
    alone; the task's other typed fields (:meth:`~simulator.ir.TaskInfo.extra_args`) follow."""
    info = row.info or TaskInfo()
    args: dict[str, Any] = {"category": row.category}
    duration_s = row.duration_s
    if info.phase is not None:
        args["phase"] = info.phase
    for value, out in ((info.mb, "micro_batch"), (info.layer, "layer"), (info.chunk, "virtual_stage")):
        if value is not None:
            args[out] = _clean(value)
    if info.flops is not None:
        args["flops"] = float(info.flops)
        if duration_s > 0 and info.flops:
            args["achieved_tflop_per_s"] = round(float(info.flops) / duration_s / TERA, 3)
    if info.kernels:
        args["bytes"] = float(sum(k.nbytes for k in info.kernels))
        args["kernels"] = _kernel_args(info.kernels)
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
