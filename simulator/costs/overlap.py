"""Compute beside communication on one GPU: kernels slow down while a collective is in flight.

NCCL kernels take SMs and memory bandwidth, so a compute kernel running beside a collective
runs ``1 + slowdown`` times slower (Lee et al. 2025 measured 18.9% on average; the default is
in ``topologies/nccl.yaml``). The engine applies :func:`compute_rate` while a rank has a
collective in flight; :func:`overlapped_time_s` is the same rule in closed form for one
kernel beside one collective that start together (the fused layer timeline uses it).
"""

from __future__ import annotations

__all__ = ["compute_rate", "overlapped_time_s", "overlapped_kernel_time_s"]


def compute_rate(slowdown: float, comm_in_flight: bool) -> float:
    """Work done per second of a compute kernel: 1 alone, ``1 / (1 + slowdown)`` beside a collective."""
    return 1.0 / (1.0 + slowdown) if comm_in_flight else 1.0


def overlapped_time_s(compute_s: float, comm_s: float, slowdown: float) -> float:
    """Wall time of a kernel of ``compute_s`` beside a collective of ``comm_s`` started with it.

    While the collective runs, the kernel advances at ``1 / (1 + slowdown)``; if it is not
    done by then (``compute_s * (1 + slowdown) > comm_s``) it finishes the remaining
    ``compute_s - comm_s / (1 + slowdown)`` at full speed; otherwise the pair takes ``comm_s``.
    Example: 10 ms kernel, 4 ms collective, slowdown 0.25: 4 + 10 - 4 / 1.25 = 10.8 ms.
    """
    if comm_s <= 0:
        return compute_s
    slow = 1.0 + slowdown
    if compute_s * slow <= comm_s:
        return comm_s
    return comm_s + compute_s - comm_s / slow


def overlapped_kernel_time_s(compute_s: float, comm_s: float, slowdown: float) -> float:
    """Wall time of the kernel alone in :func:`overlapped_time_s`'s pair: ``compute_s * (1 +
    slowdown)`` when it ends while the collective still runs, else the pair's time (it ends
    last). Example: 10 ms kernel, 4 ms collective, slowdown 0.25: 10.8 ms; 2 ms kernel: 2.5 ms."""
    if comm_s <= 0:
        return compute_s
    return min(compute_s * (1.0 + slowdown), overlapped_time_s(compute_s, comm_s, slowdown))
