"""Validation stage: published training runs as scenarios, simulated and compared (``dtsim validate``)."""

from simulator.validation.records import CommRecord, Record, load_comm_records, load_records
from simulator.validation.runner import CommResult, RecordResult, Validation, validate

__all__ = ["Record", "CommRecord", "load_records", "load_comm_records", "Validation", "RecordResult", "CommResult",
           "validate"]
