"""``analytical``: every phase at the rate it would have alone, no contention.

A phase of B bytes per flow whose busiest class carries f flows on capacity C takes
B / min(C / f, per-flow cap) + latency seconds: the closed-form alpha-beta time over its
bottleneck (Hockney 1994), also the oracle the flow model is tested against.
"""

from __future__ import annotations

from collections.abc import Callable

from simulator.engine.lowering import PhaseLoad
from simulator.engine.network.base import PhasedNetwork

__all__ = ["AnalyticalNetwork"]


class AnalyticalNetwork(PhasedNetwork):
    """Closed-form alone rate per phase; links are never shared."""

    def move_bytes(self, load: PhaseLoad, bytes_done: Callable[[], None]) -> None:
        rate = self.alone_rate_bytes_per_s(load)
        self.account(load, load.bytes_per_flow)
        self.env.timeout(load.bytes_per_flow / rate).callbacks.append(lambda _e: bytes_done())
