"""Trace markers of the ``faults`` section: which ranks were slowed and which links degraded.

* each straggler rank traced gets an instant event ``straggler: compute xF`` (category
  ``fault``, process scope) at the start of its iteration row, and its process label says so;
* each perturbed link gets a global instant event ``link SRC->DST: bandwidth xF, latency +T``
  (or ``failed, routed around``) at t = 0 on the network process;
* the trace's ``otherData.faults`` holds the Result's account (``Result.faults``): the ranks
  simulated individually, why symmetry reduction was off, and the samples' distribution.
"""

from __future__ import annotations

from typing import Any

from simulator.results.faults import FaultsSummary
from simulator.units import format_time

__all__ = ["fault_events", "straggler_label", "FAULT_CATEGORY"]

FAULT_CATEGORY = "fault"


def straggler_label(summary: FaultsSummary | None, rank: int) -> str:
    """``", straggler x1.5"`` for a slowed rank, else ``""`` (appended to its process label)."""
    factor = summary.stragglers.get(rank) if summary is not None else None
    return f", straggler x{factor:g}" if factor else ""


def fault_events(summary: FaultsSummary | None, chosen: list[int], network_pid: int, iteration_tid: int) -> list[dict[str, Any]]:
    """Instant events marking the traced straggler ranks and every perturbed link."""
    if summary is None:
        return []
    events: list[dict[str, Any]] = []
    for rank in chosen:
        factor = summary.stragglers.get(rank)
        if factor:
            events.append({"ph": "i", "s": "p", "name": f"straggler: compute x{factor:g}", "cat": FAULT_CATEGORY,
                           "pid": rank, "tid": iteration_tid, "ts": 0.0, "args": {"slowdown": factor}})
    for link in summary.links:
        state = "failed, routed around" if link.bandwidth_factor == 0 else f"bandwidth x{link.bandwidth_factor:g}"
        if link.latency_add_s:
            state += f", latency +{format_time(link.latency_add_s)}"
        events.append({"ph": "i", "s": "g", "name": f"link {link.label}: {state}", "cat": FAULT_CATEGORY,
                       "pid": network_pid, "tid": iteration_tid, "ts": 0.0,
                       "args": {"kind": link.kind, "tier": link.tier, "bandwidth_factor": link.bandwidth_factor,
                                "latency_add_s": link.latency_add_s, "faults": link.faults}})
    return events
