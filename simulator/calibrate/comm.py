"""Collectives between N local processes (``dtsim calibrate --comm N``).

N processes are spawned with ``torch.multiprocessing`` and joined in a ``torch.distributed``
process group (rendezvous through a file in a temporary folder, so no port can clash): NCCL with one GPU per process when the calibration
runs on CUDA (N GPUs needed), gloo on the CPU otherwise. Each process times all-reduce,
all-gather and reduce-scatter over a range of sizes, nccl-tests style (``D`` = the vector for
all-reduce, the total output for all-gather, the total input for reduce-scatter; float32
elements): warm-up calls, then ``trials`` samples of ``iters`` back-to-back calls between
barriers, each sample the slowest rank's mean time per call (an all-reduce MAX of the
per-rank times; CUDA work is synchronised before the clock stops). The number of calls per
sample is agreed by all ranks from the slowest rank's first call.

:func:`fit_comm` turns the medians into ``t = alpha + D * beta`` per collective
(:func:`simulator.calibrate.fit.fit_alpha_beta`), the profile's ``comm`` section, which
``cluster.calibration`` then applies to the intra-node links
(:mod:`simulator.cluster.comm_profile`).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from simulator import units
from simulator.calibrate.device import CalibrationError, DeviceInfo, import_torch
from simulator.calibrate.fit import fit_alpha_beta
from simulator.calibrate.timing import Timing
from simulator.catalog.profiles import COMM_OPS
from simulator.costs.collectives import bus_bandwidth_factor

__all__ = ["COMM_OPS", "CommPoint", "CommMeasurement", "comm_sizes", "check_ranks", "measure_collectives",
           "fit_comm"]

ELEMENT_BYTES = 4  # float32


@dataclass(frozen=True)
class CommPoint:
    op: str
    nbytes: float
    timing: Timing


@dataclass(frozen=True)
class CommMeasurement:
    ranks: int
    backend: str
    points: tuple[CommPoint, ...]


def comm_sizes(backend: str, quick: bool) -> list[int]:
    """Message sizes D in bytes, x4 apart: 4 KiB..4 MiB (gloo, quick) up to 64 KiB..1 GiB (NCCL)."""
    lo, hi = {("gloo", True): (12, 22), ("gloo", False): (10, 26),
              ("nccl", True): (16, 28), ("nccl", False): (13, 30)}[(backend, quick)]
    return [2**e for e in range(lo, hi + 1, 2)]


def check_ranks(ranks: int, device: DeviceInfo, torch: Any) -> str:
    """The backend for ``ranks`` processes on ``device`` (gloo on a CPU, NCCL with one GPU
    each on CUDA), or :class:`CalibrationError` when this machine cannot host them."""
    if ranks < 2:
        raise CalibrationError(f"--comm {ranks}: needs at least 2 processes")
    if device.kind == "cpu":
        return "gloo"
    count = torch.cuda.device_count()
    if count < ranks:
        raise CalibrationError(f"--comm {ranks} on CUDA needs {ranks} GPUs (NCCL, one per process); this "
                               f"machine has {count}. Use --device cpu to measure gloo on the CPU")
    return "nccl"


def measure_collectives(ranks: int, device: DeviceInfo, *, quick: bool, timeout_s: float = 600.0) -> CommMeasurement:
    """Time the collectives over ``ranks`` local processes (see the module docstring)."""
    torch = import_torch()
    backend = check_ranks(ranks, device, torch)
    sizes = comm_sizes(backend, quick)
    trials, target_s = (5, 0.005) if quick else (10, 0.02)
    with tempfile.TemporaryDirectory(prefix="dtsim-comm-") as tmp:
        result = Path(tmp) / "result.json"
        args = (ranks, backend, f"file://{Path(tmp) / 'rendezvous'}", sizes, trials, target_s, str(result))
        import torch.multiprocessing as mp

        context = mp.start_processes(_worker, args=args, nprocs=ranks, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        try:
            while not context.join(timeout=1.0):
                if time.monotonic() > deadline:
                    raise CalibrationError(f"--comm {ranks}: the {backend} processes did not finish within "
                                           f"{timeout_s:.0f} s")
        except mp.ProcessRaisedException as exc:
            last = str(exc).strip().splitlines()[-1] if str(exc).strip() else repr(exc)
            raise CalibrationError(f"--comm {ranks}: a {backend} process failed: {last}") from None
        except mp.ProcessExitedException as exc:
            raise CalibrationError(f"--comm {ranks}: a {backend} process exited: {exc}") from None
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.terminate()
        rows = json.loads(result.read_text())
    points = []
    for op, nbytes, samples in rows:
        q1, q2, q3 = (statistics.quantiles(samples, n=4, method="inclusive") if len(samples) > 1
                      else (samples[0],) * 3)
        points.append(CommPoint(op, float(nbytes), Timing(q2, q1, q3, len(samples))))
    return CommMeasurement(ranks, backend, tuple(points))


def fit_comm(measurement: CommMeasurement) -> dict[str, dict[str, Any]]:
    """The profile's ``comm`` section: per collective alpha, beta, ranks, backend, bus bandwidth."""
    out: dict[str, dict[str, Any]] = {}
    for op in COMM_OPS:
        pts = [p for p in measurement.points if p.op == op]
        if len(pts) < 2:
            continue
        alpha, beta = fit_alpha_beta([p.nbytes for p in pts], [p.timing.median_s for p in pts])
        entry: dict[str, Any] = {"alpha": units.format_time(alpha, 5), "beta": beta, "ranks": measurement.ranks,
                                 "backend": measurement.backend}
        if beta > 0:
            entry["bus_bandwidth"] = units.format_rate(bus_bandwidth_factor(op, measurement.ranks) / beta, 5)
        out[op] = entry
    return out


# ----------------------------------------------------------------------------------------
# the worker process


def _collective_call(op: str, all_reduce: Any, all_gather: Any, reduce_scatter: Any, full: Any,
                     part: Any) -> Any:
    """A no-argument call of ``op`` on D = ``full`` bytes (``part`` = one rank's D/N)."""
    if op == "all_reduce":
        return lambda: all_reduce(full)
    if op == "all_gather":
        return lambda: all_gather(full, part)
    return lambda: reduce_scatter(part, full)


def _worker(rank: int, ranks: int, backend: str, init_method: str, sizes: list[int], trials: int, target_s: float,
            result_path: str) -> None:
    import torch
    import torch.distributed as dist

    if backend == "nccl":
        torch.cuda.set_device(rank)
        dev = f"cuda:{rank}"
    else:
        torch.set_num_threads(1)
        dev = "cpu"
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=ranks,
                            timeout=timedelta(seconds=120))
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    def sync() -> None:
        if backend == "nccl":
            torch.cuda.synchronize()

    def slowest(seconds: float) -> float:
        t = torch.tensor([seconds], dtype=torch.float64, device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    rows: list[tuple[str, int, list[float]]] = []
    try:
        for op in COMM_OPS:
            for nbytes in sizes:
                elems = max(ranks, nbytes // ELEMENT_BYTES // ranks * ranks)
                full = torch.ones(elems, dtype=torch.float32, device=dev)
                part = torch.ones(elems // ranks, dtype=torch.float32, device=dev)
                call = _collective_call(op, dist.all_reduce, all_gather, reduce_scatter, full, part)
                call()
                call()
                sync()
                t0 = time.perf_counter()
                call()
                sync()
                first = slowest(time.perf_counter() - t0)
                iters = max(1, min(200, int(target_s / max(first, 1e-7))))
                samples = []
                for _ in range(trials):
                    dist.barrier()
                    sync()
                    t0 = time.perf_counter()
                    for _ in range(iters):
                        call()
                    sync()
                    samples.append(slowest((time.perf_counter() - t0) / iters))
                rows.append((op, elems * ELEMENT_BYTES, samples))
        if rank == 0:
            Path(result_path).write_text(json.dumps(rows))
        dist.barrier()
    finally:
        dist.destroy_process_group()
