"""Host-side issue cost: the CPU thread that launches a rank's kernels.

In eager PyTorch one host thread per rank walks the program (Python, the dispatcher, autograd
recording, ``cudaLaunchKernel``) and enqueues each kernel on its CUDA stream; the launch is
asynchronous, so the host runs ahead of the GPU until something synchronises it
(``loss.item()``, a gradient-norm ``.item()``, an event the host waits on). Each launched
op costs the host ``op_s``; a kernel cannot start before it was issued.

Model (first principles: a two-stage pipeline, host then GPU). Between synchronisations the
host and the GPU form a tandem queue; its throughput is set by the slower stage, so a run of
kernels whose GPU time is ``gpu_s`` and whose host time is ``host_s`` lasts

    issue_bound_time_s = max(gpu_s, host_s)

in steady state. dtsim applies it per layer pass (one layer's forward or backward): a
GPU-bound pass keeps its roofline time (the host's lead hides its issue cost); an issue-bound
pass (short kernels: small hidden size, micro-batch 1, short sequences) lasts as long as the
host takes to issue it, the GPU starving in between, and its compute steps (the pieces TP
splits it into) are stretched alike, so within a pass the host's lead carries over from
long kernels to short ones. Exact at both ends (every pass GPU-bound, every pass
host-bound); between them it ignores the lead a host carries from one pass into the next
(pessimistic when host-bound passes follow GPU-bound ones or an exposed collective), and the
start-up transient after a synchronisation (one op).

The host time of a pass is ``n_ops * op_s`` plus any fixed host work riding on it
(:func:`host_time_s`): ``n_ops`` is the number of kernels in dtsim's kernel list (each listed
kernel is at least one dispatched, launched op; the backward's list mirrors the forward's as
autograd does, one backward node per forward op, two GEMMs per linear).

Fixed work that cannot hide behind the GPU because a synchronisation precedes it (per step:
the host waits on ``loss.item()`` / the gradient norm, then runs the step's Python before
issuing the next kernel) is a GPU-idle gap of ``HostCosts.step_s`` each step.

Not modelled: framework hooks' host work (FSDP pre/post-forward/backward hooks, DDP bucket
hooks; no published per-hook time), the host waits of FSDP's ``limit_all_gathers`` rate
limiter, a lead carried across tasks. An issue-bound task counts as compute in the breakdown
(its GPU gaps are not split out) and is slowed beside a collective like any compute task.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HostCosts", "host_time_s", "issue_bound_time_s", "NO_HOST"]


@dataclass(frozen=True)
class HostCosts:
    """Host-side costs of one rank (seconds).

    ``op_s``: host time to issue one op (dispatch + launch); ``microbatch_s``: host work per
    micro-batch before its first kernel (data loader, input preparation); ``step_s``: host
    work per step after the step's synchronisation (logging, scheduler, ``zero_grad``).
    """

    op_s: float = 0.0
    microbatch_s: float = 0.0
    step_s: float = 0.0

    def __post_init__(self) -> None:
        if min(self.op_s, self.microbatch_s, self.step_s) < 0:
            raise ValueError("host costs are durations: they cannot be negative")


NO_HOST = HostCosts()


def host_time_s(n_ops: int, costs: HostCosts, extra_s: float = 0.0) -> float:
    """Host time to issue ``n_ops`` ops plus ``extra_s`` of fixed host work: n * op_s + extra."""
    return n_ops * costs.op_s + extra_s


def issue_bound_time_s(gpu_s: float, host_s: float) -> float:
    """A task's time when its kernels take ``gpu_s`` on the GPU and ``host_s`` to issue:
    the slower stage of the host -> GPU pipeline (module docstring)."""
    return max(gpu_s, host_s)

