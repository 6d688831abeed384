"""One simulated iteration: its :class:`~simulator.results.result.Result` and what traces and
figures are drawn from (the engine's rows, the run's facts, the link-load record).

``simulator.simulate`` returns the Result alone; ``simulator.run_simulation`` returns a
:class:`Simulation`, which the trace exports and the figures take.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simulator.results.link_load import LinkLoad
from simulator.results.result import Result
from simulator.results.rows import Row, RunFacts

__all__ = ["Simulation"]


@dataclass(frozen=True)
class Simulation:
    """A Result with its trace rows, run facts and (``record_series=True``) link-load record."""

    result: Result
    rows: list[Row]
    facts: RunFacts
    series: dict[str, Any] | None = None

    def link_load(self) -> LinkLoad | None:
        """The link-load record as numbers, or None when it was not recorded."""
        return LinkLoad.from_series(self.series, self.result.step_time_s)
