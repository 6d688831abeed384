"""Simulate every published run and compare: the ``dtsim validate`` engine.

Errors are ``predicted / measured - 1`` on the step time. The summary gives the mean
absolute percentage error (MAPE) and the worst record per source and overall, and the
collective error against the nccl-tests curve (sizes from 1 MiB up, where the issue asks
for 20%).
"""

from __future__ import annotations

import copy
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from simulator.validation.records import CommRecord, Record, load_comm_records, load_records

__all__ = ["RecordResult", "CommResult", "Fp8Pair", "Validation", "validate", "validate_record", "validate_unstated",
           "with_setting", "COMM_MIN_BYTES"]

COMM_MIN_BYTES = 2**20


@dataclass
class RecordResult:
    record: Record
    predicted_step_s: float
    mfu: float
    oom: bool
    breakdown: dict[str, float]
    peak_memory_bytes: float = 0.0
    peak_allocated_bytes: float = 0.0  # the caching allocator's allocated peak (max_memory_allocated)
    peak_reserved_bytes: float = 0.0  # its reserved peak (max_memory_reserved: what torchtitan's figure counts)

    @property
    def error(self) -> float:
        return self.predicted_step_s / self.record.measured_step_s - 1

    @property
    def memory_error(self) -> float | None:
        """Predicted / published peak memory - 1, where the source publishes it. The published
        figures are the PyTorch caching allocator's reserved peak (torchtitan logs
        ``max_reserved``), which holds no CUDA context or library workspace: the prediction
        compared is dtsim's reserved peak (``Result.peak_reserved_bytes``, its allocations
        replayed through the allocator model)."""
        measured = self.record.measured_peak_memory_bytes
        return None if not measured else self.peak_reserved_bytes / measured - 1


@dataclass
class CommResult:
    record: CommRecord
    predicted_s: float
    algorithm: str

    @property
    def error(self) -> float:
        return self.predicted_s / self.record.measured_s - 1


@dataclass
class Fp8Pair:
    """Two records of one source whose scenarios differ only in fp8 (precision and its recipe)."""

    bf16: RecordResult
    fp8: RecordResult

    @property
    def measured_speedup(self) -> float:
        return self.bf16.record.measured_step_s / self.fp8.record.measured_step_s

    @property
    def predicted_speedup(self) -> float:
        return self.bf16.predicted_step_s / self.fp8.predicted_step_s

    @property
    def error(self) -> float:
        return self.predicted_speedup / self.measured_speedup - 1


def _without_precision(scenario: dict[str, Any]) -> str:
    training = {k: v for k, v in scenario.get("training", {}).items() if k not in ("precision", "fp8")}
    rest = {k: v for k, v in scenario.items() if k not in ("name", "training")}
    return repr(sorted({**rest, "training": sorted(training.items())}.items()))


@dataclass
class Validation:
    records: list[RecordResult] = field(default_factory=list)
    comm: list[CommResult] = field(default_factory=list)
    # {record id: [(scenario path, value, result)]}: the record re-simulated at other values of settings its
    # source leaves unstated (Record.unstated), to show how much the unstated fact decides
    unstated: dict[str, list[tuple[str, Any, RecordResult]]] = field(default_factory=dict)

    def by_source(self) -> dict[str, list[RecordResult]]:
        out: dict[str, list[RecordResult]] = defaultdict(list)
        for r in self.records:
            out[r.record.source].append(r)
        return dict(out)

    def fp8_pairs(self) -> list[Fp8Pair]:
        """Paired runs: the same scenario in bf16 and in fp8, measured both ways by one source."""
        by_key: dict[tuple[str, str], dict[str, RecordResult]] = defaultdict(dict)
        for r in self.records:
            precision = r.record.scenario.get("training", {}).get("precision", "bf16")
            by_key[(r.record.source, _without_precision(r.record.scenario))].setdefault(precision, r)
        return [Fp8Pair(p["bf16"], p["fp8"]) for p in by_key.values() if "bf16" in p and "fp8" in p]

    @staticmethod
    def mape(errors: list[float]) -> float:
        return statistics.fmean(abs(e) for e in errors) if errors else 0.0

    @classmethod
    def _memory_stats(cls, rs: list[RecordResult]) -> dict[str, Any]:
        errors = [e for e in (r.memory_error for r in rs) if e is not None]
        if not errors:
            return {}
        return {"memory_records": len(errors), "memory_mape": cls.mape(errors),
                "memory_max_abs_error": max(abs(e) for e in errors)}

    def summary(self) -> dict[str, Any]:
        per_source = {
            source: {"records": len(rs), "mape": self.mape([r.error for r in rs]),
                     "max_abs_error": max(abs(r.error) for r in rs), "mean_error": statistics.fmean(r.error for r in rs),
                     "false_oom": sum(r.oom for r in rs), **self._memory_stats(rs)}
            for source, rs in sorted(self.by_source().items())
        }
        errors = [r.error for r in self.records]
        comm = [c.error for c in self.comm if c.record.nbytes >= COMM_MIN_BYTES]
        small = [c.error for c in self.comm if c.record.nbytes < COMM_MIN_BYTES]
        return {
            "per_source": per_source,
            "overall": {"records": len(errors), "mape": self.mape(errors),
                        "max_abs_error": max((abs(e) for e in errors), default=0.0),
                        "false_oom": sum(r.oom for r in self.records), **self._memory_stats(self.records)},
            "fp8_pairs": [{"bf16": p.bf16.record.id, "fp8": p.fp8.record.id, "measured_speedup": p.measured_speedup,
                           "predicted_speedup": p.predicted_speedup, "error": p.error} for p in self.fp8_pairs()],
            "collectives": {"points": len(comm), "mape": self.mape(comm),
                            "max_abs_error": max((abs(e) for e in comm), default=0.0),
                            "min_bytes": COMM_MIN_BYTES,
                            "small": {"points": len(small), "mape": self.mape(small),
                                      "max_abs_error": max((abs(e) for e in small), default=0.0)}},
        }


def validate_record(record: Record) -> RecordResult:
    import simulator

    result = simulator.simulate(simulator.Scenario.model_validate(record.scenario))
    b = result.breakdown
    breakdown = {"compute": b.compute_s, "bubble": b.bubble_s, "idle": b.idle_s,
                 **{f"exposed {k}": v for k, v in b.exposed_comm_s.items()}}
    return RecordResult(record, result.step_time_s, result.mfu, result.oom, breakdown, result.peak_memory_bytes,
                        result.peak_allocated_bytes, result.peak_reserved_bytes)


def with_setting(record: Record, path: str, value: Any) -> Record:
    """``record`` with its scenario's setting ``path`` (dotted, e.g. ``training.micro_batch``) set to ``value``."""
    scenario = copy.deepcopy(record.scenario)
    *parents, leaf = path.split(".")
    node = scenario
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return Record(record.id, record.source, record.citation, scenario, record.measured_step_s,
                  record.measured_metric, gpus=record.gpus)


def validate_unstated(record: Record) -> list[tuple[str, Any, RecordResult]]:
    """The record simulated at each other value of each setting its source leaves unstated."""
    return [(path, value, validate_record(with_setting(record, path, value)))
            for path, values in record.unstated.items() for value in values]


def validate_comm(record: CommRecord) -> CommResult:
    from simulator.run import collective_choice, simulate_collective

    cluster = {"node": record.node, "nodes": record.nodes}
    seconds = simulate_collective(cluster, record.op, record.nbytes)
    return CommResult(record, seconds, collective_choice(cluster, record.op, record.nbytes))


def validate(*, sources: set[str] | None = None,
             progress: Callable[[str], None] | None = None) -> Validation:
    """Simulate every training record (of ``sources``) and every collective record."""
    out = Validation()
    for record in load_records():
        if sources and record.source not in sources:
            continue
        out.records.append(validate_record(record))
        if record.unstated:
            out.unstated[record.id] = validate_unstated(record)
        if progress:
            progress(record.id)
    for comm in load_comm_records():
        out.comm.append(validate_comm(comm))
    return out
