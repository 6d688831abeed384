"""Timing one kernel: median and spread of repeated runs.

* Warm-up (both): untimed calls until the last three agree within 20% (at least
  ``warmup`` calls, at most ``max_warmup_s``). The first calls of a kernel are slow for
  reasons training does not see in steady state: oneDNN / cuBLAS / cuDNN plan selection,
  first-touch page faults, and on Linux CPUs glibc's adaptive mmap threshold, which for
  the first steps of a block returns large activations to the OS and faults them in again.
* CPU: ``torch.utils.benchmark.Timer`` with an explicit intra-op thread count,
  ``blocked_autorange`` (it picks how many calls make one measurement and repeats until
  ``min_run_time_s`` has passed).
* CUDA: ``torch.cuda.synchronize()``, then CUDA events around blocks of back-to-back calls
  (enough calls per block that a block lasts about a millisecond, so the event resolution
  and host jitter do not matter); the per-call time of each block is one sample, and
  samples are taken until ``min_run_time_s`` has passed.

A :class:`Timing` keeps the median and the interquartile range of the samples.

**Too noisy to keep** (:func:`noise_problem`): a calibration whose repeated runs disagree
measures the other processes on the machine as much as the device. Its spread is the
interquartile range of a kernel's samples over their median (:attr:`Timing.spread`); the
calibration is too noisy when the median spread over the GEMM and attention kernels (the
timings the efficiency tables are fitted on) exceeds ``NOISY_SPREAD`` = 10%, or the
closed-loop block's own spread exceeds ``NOISY_BLOCK_SPREAD`` = 20% (one long kernel
sequence, timed fewer times). These are thresholds of trust, not fitted constants: a
steady device repeats a kernel within a few percent (the middle half of its runs), so a
median spread above 10% means the timings are mostly someone else's load. ``dtsim
calibrate`` then writes no profile unless ``--force``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from simulator.calibrate.device import DeviceInfo

__all__ = ["Timing", "KernelTimer", "noise_problem", "NOISY_SPREAD", "NOISY_BLOCK_SPREAD"]

NOISY_SPREAD = 0.10  # median over the table kernels of (p75 - p25) / median above which a calibration is too noisy
NOISY_BLOCK_SPREAD = 0.20  # the same for the closed-loop block's runs


@dataclass(frozen=True)
class Timing:
    """Seconds per call: ``median_s`` and the quartiles of the samples; ``samples`` taken."""

    median_s: float
    p25_s: float
    p75_s: float
    samples: int

    @property
    def spread(self) -> float:
        """Interquartile range relative to the median (0.05 = the middle half within 5%)."""
        return (self.p75_s - self.p25_s) / self.median_s if self.median_s > 0 else 0.0

    def as_dict(self) -> dict[str, float]:
        return {"median_s": self.median_s, "p25_s": self.p25_s, "p75_s": self.p75_s, "samples": self.samples}


def noise_problem(kernels: Sequence[Timing], block: Timing | None = None) -> str | None:
    """Why these timings are too noisy to keep (see the module docstring), or None.

    ``kernels``: the GEMM and attention timings; ``block``: the closed-loop block's. With
    kernel spreads 0.02, 0.30, 0.25 the median is 0.25 > 0.10: too noisy; with 0.02, 0.30,
    0.05 it is 0.05: kept (one disturbed kernel does not condemn the run).
    """
    reasons = []
    if kernels:
        spread = statistics.median(t.spread for t in kernels)
        if spread > NOISY_SPREAD:
            reasons.append(f"the middle half of each kernel's repeated runs spreads by {100 * spread:.0f}% of its "
                           f"median (median over {len(kernels)} GEMM and attention timings; above "
                           f"{100 * NOISY_SPREAD:.0f}% the timings are mostly other processes' load)")
    if block is not None and block.spread > NOISY_BLOCK_SPREAD:
        reasons.append(f"the closed-loop block's repeated runs spread by {100 * block.spread:.0f}% of their median "
                       f"(above {100 * NOISY_BLOCK_SPREAD:.0f}%)")
    return "; ".join(reasons) or None


def _quartiles(samples: list[float]) -> tuple[float, float, float]:
    if len(samples) == 1:
        return samples[0], samples[0], samples[0]
    q1, q2, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return q2, q1, q3


class KernelTimer:
    """Times callables on one device (see the module docstring for the method)."""

    def __init__(self, torch: Any, device: DeviceInfo, *, min_run_time_s: float, warmup: int = 3,
                 max_warmup_s: float = 5.0) -> None:
        self.torch = torch
        self.device = device
        self.min_run_time_s = min_run_time_s
        self.warmup = warmup
        self.max_warmup_s = max_warmup_s

    def __call__(self, fn: Callable[[], Any]) -> Timing:
        self._warm_up(fn)
        if self.device.kind == "cuda":
            return self._cuda(fn)
        return self._cpu(fn)

    def _warm_up(self, fn: Callable[[], Any]) -> None:
        sync = self.torch.cuda.synchronize if self.device.kind == "cuda" else (lambda: None)
        times: list[float] = []
        start = time.perf_counter()
        while time.perf_counter() - start < self.max_warmup_s:
            t0 = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t0)
            last = times[-3:]
            if len(times) >= max(3, self.warmup) and max(last) <= 1.2 * min(last):
                break

    def _cpu(self, fn: Callable[[], Any]) -> Timing:
        from torch.utils import benchmark

        timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=self.device.threads or 1)
        measurement = timer.blocked_autorange(min_run_time=self.min_run_time_s)
        times = [float(t) for t in measurement.times]
        median, p25, p75 = _quartiles(times)
        return Timing(median, p25, p75, len(times))

    def _cuda(self, fn: Callable[[], Any]) -> Timing:
        cuda = self.torch.cuda
        with cuda.device(self.device.index or 0):
            cuda.synchronize()
            per_call = self._cuda_block(fn, 1)
            calls = max(1, min(1000, int(1e-3 / max(per_call, 1e-7))))
            samples: list[float] = []
            start = time.perf_counter()
            while len(samples) < 5 or (time.perf_counter() - start < self.min_run_time_s and len(samples) < 200):
                samples.append(self._cuda_block(fn, calls))
        median, p25, p75 = _quartiles(samples)
        return Timing(median, p25, p75, len(samples))

    def _cuda_block(self, fn: Callable[[], Any], calls: int) -> float:
        cuda = self.torch.cuda
        begin, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return float(begin.elapsed_time(end)) * 1e-3 / calls
