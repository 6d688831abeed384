"""The ``training.host`` block: host-side issue costs (:mod:`simulator.costs.host`).

Defaults are eager PyTorch's: every op the host launches costs ``op_issue`` of CPU time.
The CPU-side time of launching one CUDA op "is usually between 5-20 microseconds"
(facebookresearch/HolisticTraceAnalysis, docs/source/features/cuda_kernel_launch_stats.rst,
'Short GPU kernels'); dtsim takes 10 us, the geometric middle of that range. Cross-check:
the simplest autograd-recording op called from Python costs ~7 us of host time before any
launch (pytorch/pytorch issue #41383: 6.8 s for 1,000,000 ``2*x`` with requires_grad;
ngimel: ~2 us without autograd, half of it Python parsing).
``per_microbatch`` and ``per_step`` (data loading, logging, the scheduler) default to 0: no
published measurement separates them from the rest of a step; set them from a trace.
"""

from __future__ import annotations

from pydantic import Field

from simulator.costs.host import NO_HOST, HostCosts
from simulator.fields import Frozen, Seconds

__all__ = ["HostSpec", "EAGER_OP_ISSUE_S"]

# CPU time to issue one eager PyTorch op (module docstring for the sources)
EAGER_OP_ISSUE_S = 10e-6


class HostSpec(Frozen):
    enabled: bool = Field(True, description="model the host thread that issues each rank's kernels "
                          "(false: kernels start as soon as the GPU is free, as before)")
    op_issue_s: Seconds = Field(EAGER_OP_ISSUE_S, alias="op_issue", description="host (CPU) time to dispatch and "
                                "launch one op; a layer pass lasts max(its kernels' GPU time, its ops x op_issue). "
                                "Default 10 us: eager PyTorch (HTA: 5-20 us per launch)")
    per_microbatch_s: Seconds = Field(0.0, alias="per_microbatch", description="host work per micro-batch before "
                                      "its first kernel (data loader, input preparation), added to the host time of "
                                      "the embedding forward; default 0")
    per_step_s: Seconds = Field(0.0, alias="per_step", description="host work per step after the step's "
                                "synchronisation (logging, scheduler, zero_grad): GPU idle after the optimizer "
                                "step; default 0")

    def costs(self) -> HostCosts:
        """The costs the workload applies (all zero when ``enabled`` is false)."""
        if not self.enabled:
            return NO_HOST
        return HostCosts(self.op_issue_s, self.per_microbatch_s, self.per_step_s)
