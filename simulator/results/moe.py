"""The mixture-of-experts summary of a Result: parameters, routing imbalance and the share of
the step the expert-parallel token exchange takes (pure: reads rows and facts only)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from simulator.units import format_time

__all__ = ["MoeSummary", "moe_summary", "moe_lines"]


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
    expert_compute_s: float = Field(description="routed-expert kernel time per step of the simulated rank with the most "
                                    "expert work (its stage holds the most MoE layers)")
    all_to_all_s: float = Field(description="that rank's dispatch/combine time per step (on the ep stream)")
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


def moe_lines(summary: MoeSummary | None) -> list[tuple[str, str]]:
    """The summary's MoE rows (``dtsim run`` and the report): parameters, the expert phase, the
    all-to-all share and the imbalance cost."""
    if summary is None:
        return []
    s = summary
    return [
        ("mixture of experts", f"{s.params_total / 1e9:.1f} B parameters, {s.params_active / 1e9:.1f} B active per "
                               f"token (model FLOPs and MFU count the active ones); ep {s.ep}, expert dp {s.edp}"),
        ("  expert compute", f"{format_time(s.expert_compute_s)} routed-expert GEMMs per step (busiest stage)"),
        ("  dispatch/combine", f"{format_time(s.all_to_all_s)} in flight, {100 * s.all_to_all_share:.1f}% of the step"),
        ("  routing imbalance", f"busiest EP rank x{s.imbalance_slowdown:.3f} the balanced load (spread "
                                f"{s.imbalance_spread:.3f} over draws): {format_time(s.imbalance_s)} over perfect "
                                f"balance; {100 * s.dropped_fraction:.1f}% of routed tokens dropped"),
    ]
