"""The mixture-of-experts summary of a Result: parameters, routing imbalance and the share of
the step the expert-parallel token exchange takes (pure: reads rows and facts only)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from simulator.costs.moe import SeedSpread
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
    expert_compute_s: float = Field(description="routed-expert kernel time (GEMMs, activation and fp8 casts) per step of the simulated rank with the most "
                                    "expert work (its stage holds the most MoE layers)")
    all_to_all_s: float = Field(description="that rank's dispatch/combine time per step (on the ep stream)")
    all_to_all_share: float = Field(description="all_to_all_s over the step time")
    imbalance_s: float = Field(description="expert compute and dispatch/combine time above perfect balance: "
                               "(expert_compute_s + all_to_all_s) x (1 - 1/imbalance_slowdown)")
    imbalance_seeds: int = Field(1, description="routing draws with seeds seed .. seed+seeds-1 "
                                 "(training.moe_routing.seeds) behind the spread over seeds below")
    imbalance_slowdown_seed_mean: float = Field(1.0, description="imbalance_slowdown averaged over the seeds")
    imbalance_slowdown_p10: float = Field(1.0, description="10th percentile of imbalance_slowdown over the seeds")
    imbalance_slowdown_p90: float = Field(1.0, description="90th percentile of imbalance_slowdown over the seeds")
    imbalance_s_p10: float = Field(0.0, description="imbalance_s at the p10 slowdown: the balanced expert and "
                                   "dispatch/combine time (expert_compute_s + all_to_all_s) / imbalance_slowdown "
                                   "x (p10 - 1), without re-simulating")
    imbalance_s_p90: float = Field(0.0, description="imbalance_s at the p90 slowdown, likewise")


def moe_summary(*, params_total: int, params_active: int, ep: int, edp: int, factor: float, spread: float,
                dropped: float, expert_compute_s: float, all_to_all_s: float, step_time_s: float,
                seeds: SeedSpread | None = None) -> MoeSummary:
    """The summary; the time above balance at another slowdown g scales the balanced time
    ``(expert_compute_s + all_to_all_s) / factor`` by ``g - 1``."""
    balanced = (expert_compute_s + all_to_all_s) / factor if factor > 0 else 0.0
    seeds = seeds or SeedSpread(1, factor, factor, factor)
    return MoeSummary(params_total=params_total, params_active=params_active, ep=ep, edp=edp,
                      imbalance_slowdown=factor, imbalance_spread=spread, dropped_fraction=dropped,
                      expert_compute_s=expert_compute_s, all_to_all_s=all_to_all_s,
                      all_to_all_share=all_to_all_s / step_time_s if step_time_s > 0 else 0.0,
                      imbalance_s=balanced * (factor - 1.0) if factor > 0 else 0.0,
                      imbalance_seeds=seeds.seeds, imbalance_slowdown_seed_mean=seeds.mean,
                      imbalance_slowdown_p10=seeds.p10, imbalance_slowdown_p90=seeds.p90,
                      imbalance_s_p10=balanced * (seeds.p10 - 1.0), imbalance_s_p90=balanced * (seeds.p90 - 1.0))


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
        ("  over seeds", f"{s.imbalance_seeds} routing seeds: x{s.imbalance_slowdown_seed_mean:.3f} mean, "
                         f"p10 x{s.imbalance_slowdown_p10:.3f} to p90 x{s.imbalance_slowdown_p90:.3f} "
                         f"({format_time(s.imbalance_s_p10)} to {format_time(s.imbalance_s_p90)} over balance)"),
    ]
