"""Why the best configuration wins, in sentences, from the simulated breakdowns."""

from __future__ import annotations

from simulator.search.report import Ranked, SearchReport
from simulator.search.space import RECOMPUTE_ORDER

__all__ = ["explain"]

_COMPONENTS = (("bubble_s", "pipeline bubble"), ("compute_s", "compute"), ("idle_s", "idle time"))


def explain(report: SearchReport) -> list[str]:
    """Sentences on why the best configuration wins, from the simulated results: its step
    against the runner-up's, the components of the step that differ most (compute, exposed
    communication by kind, bubble, idle), recomputation, memory headroom, and the naive
    data-parallel baseline's verdict."""
    if not report.ranked:
        return ["no configuration fits: every layout was invalid or out of memory"]
    best = report.ranked[0]
    b = best.metrics
    recompute = ("without activation recomputation" if best.candidate.recompute == "none"
                 else f"with {best.candidate.recompute} activation recomputation")
    lines = [f"{best.label}: {b['tokens_per_s']:,.0f} tokens/s, step {b['step_time_s']:.3f} s, "
             f"MFU {100 * b['mfu']:.1f}%; it fits {recompute}, peak {b['peak_memory_bytes'] / 2**30:.1f} GiB of "
             f"{b['gpu_memory_bytes'] / 2**30:.0f} GiB."]
    if len(report.ranked) > 1:
        second = report.ranked[1]
        lines.append(_versus(best, second, "the runner-up"))
    baseline = report.baseline or {}
    verdict = baseline.get("verdict")
    if verdict == "out of memory":
        peak = baseline["metrics"]["peak_memory_bytes"] / 2**30
        lines.append(f"Naive data parallelism ({baseline['label']}) does not fit: {peak:.0f} GiB per GPU.")
    elif verdict == "fits":
        naive = baseline["metrics"]
        gain = b["tokens_per_s"] / naive["tokens_per_s"]
        lines.append(f"Naive data parallelism ({baseline['label']}) fits at {naive['tokens_per_s']:,.0f} tokens/s; "
                     f"the best is {gain:.2f}x faster.")
    elif verdict is not None:
        lines.append(f"Naive data parallelism is {verdict}: {baseline.get('reason', '')}")
    return lines


def _versus(best: Ranked, other: Ranked, name: str) -> str:
    a, b = best.metrics, other.metrics
    step_a, step_b = float(a["step_time_s"]), float(b["step_time_s"])
    parts = []
    diffs = []
    for key, label in _COMPONENTS:
        diffs.append((float(b.get(key) or 0.0) - float(a.get(key) or 0.0), label))
    kinds = {k[len("exposed_comm_"):-2] for k in (*a, *b) if k.startswith("exposed_comm_") and k != "exposed_comm_s"}
    for kind in sorted(kinds):
        key = f"exposed_comm_{kind}_s"
        diffs.append((float(b.get(key) or 0.0) - float(a.get(key) or 0.0), f"exposed {kind} communication"))
    diffs.sort(key=lambda d: -abs(d[0]))
    for delta, label in diffs[:3]:
        if abs(delta) < 0.005 * step_b:
            continue
        parts.append(f"{'less' if delta > 0 else 'more'} {label} ({abs(delta):.3f} s {'saved' if delta > 0 else 'added'})")
    per_step = 100 * (step_b - step_a) / step_b if step_b > 0 else 0.0
    text = f"Against {name} ({other.label}): step {step_a:.3f} s vs {step_b:.3f} s ({per_step:.1f}% shorter)"
    if best.candidate.scenario.world_size != other.candidate.scenario.world_size:
        text += f" on {best.candidate.scenario.world_size} vs {other.candidate.scenario.world_size} GPUs"
    if parts:
        text += "; " + ", ".join(parts)
    rec_a, rec_b = best.candidate.recompute, other.candidate.recompute
    if rec_a != rec_b:
        order = {r: i for i, r in enumerate(RECOMPUTE_ORDER)}
        if order[rec_a] < order[rec_b]:
            text += f"; it fits with {rec_a} recomputation where {name} needs {rec_b}"
        else:
            text += f"; it recomputes ({rec_a}) and still wins"
    headroom = (float(a["memory_headroom_bytes"]) - float(b["memory_headroom_bytes"])) / 2**30
    if abs(headroom) >= 1:
        text += f"; {abs(headroom):.1f} GiB {'more' if headroom > 0 else 'less'} memory headroom"
    return text + "."
