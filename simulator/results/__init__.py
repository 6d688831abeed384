"""Results stage: trace rows -> metrics (Result), Chrome trace export."""

from simulator.results.metrics import compute_result
from simulator.results.result import Breakdown, CommSummary, LinkUsage, OomDetail, RankMemory, Result
from simulator.results.rows import LinkStat, Row, RunFacts

__all__ = ["compute_result", "Result", "RankMemory", "Breakdown", "OomDetail", "LinkUsage", "CommSummary",
           "Row", "LinkStat", "RunFacts"]
