"""What the ``faults`` section did to a run: the perturbed ranks and links, which ranks were
simulated individually, and (``sim.samples``) the step-time distribution over seeded
iterations with the slowest rank of each."""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from simulator.units import format_time

__all__ = ["FaultsSummary", "PerturbedLinkOut", "StepSamples", "step_samples", "rank_ranges", "faults_lines"]


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PerturbedLinkOut(_Out):
    label: str
    kind: str
    tier: str
    bandwidth_factor: float = Field(description="fraction of the bandwidth left (0: failed, routed around)")
    latency_add_s: float
    faults: list[int] = Field(description="indices of the faults.links entries naming it")


class StepSamples(_Out):
    """Step time over ``samples`` seeded iterations (jitter seeds ``seeds``)."""

    samples: int
    seeds: list[int]
    step_times_s: list[float]
    mean_s: float
    p50_s: float
    p99_s: float = Field(description="99th percentile, numpy's linear interpolation between order statistics")
    slowest_rank: list[int] = Field(description="per sample: the rank with the most compute time (the one the "
                                    "others wait for at their next collective)")
    slowest_compute_s: list[float] = Field(description="per sample: that rank's compute seconds")
    median_compute_s: list[float] = Field(description="per sample: the median simulated rank's compute seconds")
    slowest_counts: dict[int, int] = Field(description="rank -> samples in which it was the slowest")


class FaultsSummary(_Out):
    simulated_individually: str = Field(description="the ranks simulated one by one, as ranges ('0-15'); with "
                                        "symmetry reduction on, one rank stands for each pipeline stage")
    symmetry: str = Field(description="whether symmetry reduction ran, and why not where a perturbation stopped it")
    stragglers: dict[int, float] = Field(description="rank -> compute slowdown")
    jitter_cv: float | None = None
    links: list[PerturbedLinkOut] = Field(default_factory=list)
    samples: StepSamples | None = None


def rank_ranges(ranks: list[int] | tuple[int, ...]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    out: list[str] = []
    ordered = sorted(set(ranks))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def step_samples(seeds: list[int], step_times_s: list[float], compute_by_rank: list[dict[int, float]]) -> StepSamples:
    """The distribution of ``step_times_s`` and, per sample, the rank with the most compute."""
    times = np.asarray(step_times_s, dtype=float)
    slowest = [max(sorted(c), key=c.__getitem__) for c in compute_by_rank]  # ties: the lowest rank
    counts: dict[int, int] = {}
    for r in slowest:
        counts[r] = counts.get(r, 0) + 1
    return StepSamples(
        samples=len(times), seeds=list(seeds), step_times_s=times.tolist(), mean_s=float(times.mean()),
        p50_s=float(np.percentile(times, 50)), p99_s=float(np.percentile(times, 99)), slowest_rank=slowest,
        slowest_compute_s=[c[r] for c, r in zip(compute_by_rank, slowest, strict=True)],
        median_compute_s=[float(np.median(list(c.values()))) for c in compute_by_rank],
        slowest_counts=dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))))


def faults_lines(summary: FaultsSummary | None) -> list[tuple[str, str]]:
    """(label, text) lines for ``dtsim run``'s summary: what was perturbed, which ranks were
    simulated individually and the step-time distribution of ``sim.samples``."""
    if summary is None:
        return []
    out = [("faults", f"ranks simulated individually: {summary.simulated_individually} ({summary.symmetry})")]
    if summary.stragglers:
        by_factor: dict[float, list[int]] = {}
        for rank, factor in summary.stragglers.items():
            by_factor.setdefault(factor, []).append(rank)
        out.append(("  stragglers", "; ".join(f"rank{'s' if len(r) > 1 else ''} {rank_ranges(r)} compute x{f:g}"
                                              for f, r in by_factor.items())))
    if summary.jitter_cv is not None:
        out.append(("  jitter", f"compute time cv {summary.jitter_cv:g} per task (lognormal, mean 1)"))
    for link in summary.links[:4]:
        state = "failed, routed around" if link.bandwidth_factor == 0 else f"bandwidth x{link.bandwidth_factor:g}"
        if link.latency_add_s:
            state += f", latency +{format_time(link.latency_add_s)}"
        out.append(("  link", f"{link.label} ({link.tier}): {state}"))
    if len(summary.links) > 4:
        out.append(("  link", f"... {len(summary.links) - 4} more perturbed links (Result.faults.links)"))
    s = summary.samples
    if s is not None:
        out.append(("samples", f"{s.samples} iterations (jitter seeds {s.seeds[0]}..{s.seeds[-1]}): mean "
                    f"{format_time(s.mean_s)}, p50 {format_time(s.p50_s)}, p99 {format_time(s.p99_s)}, "
                    f"min {format_time(min(s.step_times_s))}, max {format_time(max(s.step_times_s))}"))
        rank, count = next(iter(s.slowest_counts.items()))
        i = s.slowest_rank.index(rank)
        out.append(("slowest rank", f"rank {rank} in {count} of {s.samples} samples (sample {i}: compute "
                    f"{format_time(s.slowest_compute_s[i])} vs median rank {format_time(s.median_compute_s[i])})"))
    return out
