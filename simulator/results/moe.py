"""The mixture-of-experts summary of a Result: parameters, routing imbalance and the share of
the step the expert-parallel token exchange takes (pure: reads rows and facts only)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["MoeSummary", "moe_summary"]


class MoeSummary(BaseModel):
    """What routing and the expert-parallel all-to-all cost (``Result.moe``; null for dense models)."""

    model_config = ConfigDict(frozen=True)

    params_total: int = Field(description="every parameter, all experts included")
    params_active: int = Field(description="parameters one token's forward uses (top-k routed and shared experts); "
                               "model FLOPs and MFU count these (6 x active matmul parameters per token)")
    ep: int
    edp: int = Field(description="expert data-parallel size, world / (pp*ep*etp)")
    imbalance_slowdown: float = Field(
        description="busiest EP rank's routed tokens over the balanced share, mean over the routing draws: the factor "
        "by which the routed experts' GEMMs and the all-to-all messages exceed perfect balance")
    imbalance_spread: float = Field(description="standard deviation of that factor over the draws (micro-batches)")
    dropped_fraction: float = Field(description="routed tokens dropped above the capacity factor (0 when dropless)")
    expert_compute_s: float = Field(description="the critical rank's routed-expert kernels per step")
    all_to_all_s: float = Field(description="the critical rank's dispatch/combine time per step (on the ep stream)")
    all_to_all_share: float = Field(description="all_to_all_s over the step time")
    imbalance_s: float = Field(description="expert compute and dispatch/combine time above perfect balance: "
                               "(expert_compute_s + all_to_all_s) x (1 - 1/imbalance_slowdown)")


def moe_summary(*, params_total: int, params_active: int, ep: int, edp: int, factor: float, spread: float,
                dropped: float, expert_compute_s: float, all_to_all_s: float, step_time_s: float) -> MoeSummary:
    excess = (expert_compute_s + all_to_all_s) * (1.0 - 1.0 / factor) if factor > 0 else 0.0
    return MoeSummary(params_total=params_total, params_active=params_active, ep=ep, edp=edp,
                      imbalance_slowdown=factor, imbalance_spread=spread, dropped_fraction=dropped,
                      expert_compute_s=expert_compute_s, all_to_all_s=all_to_all_s,
                      all_to_all_share=all_to_all_s / step_time_s if step_time_s > 0 else 0.0, imbalance_s=excess)
