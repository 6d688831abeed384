"""Shared fixtures: paths, small scenarios, a CLI runner that reports exit codes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "scenarios"


@pytest.fixture
def root() -> Path:
    return ROOT


@pytest.fixture
def cli() -> Any:
    from simulator.cli import app

    runner = CliRunner()

    def invoke(*args: str) -> Any:
        return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)

    return invoke


def small_scenario(**over: Any) -> dict[str, Any]:
    """A fast data-parallel scenario (2 x p4d, GPT-3 125M) as a plain mapping."""
    data: dict[str, Any] = {
        "model": "gpt3-125m",
        "cluster": {"node": "p4d.24xlarge", "nodes": 2},
        "training": {"micro_batch": 4, "global_batch": 128},
    }
    for key, value in over.items():
        section, _, field = key.partition("__")
        if field:
            data.setdefault(section, {})[field] = value
        else:
            data[section] = value
    return data


def cross_microbatch_overlaps(sim) -> int:
    """All-to-all tasks of one micro-batch running while a compute task of another runs, on a rank."""
    found = 0
    for rank in {r.rank for r in sim.rows}:
        rows = [r for r in sim.rows if r.rank == rank and r.info is not None and r.info.mb is not None]
        comms = [r for r in rows if r.stream == "ep" and r.duration_s > 0]
        computes = [r for r in rows if r.stream == "compute" and r.duration_s > 0]
        found += sum(1 for a in comms for c in computes
                     if c.info.mb != a.info.mb and c.start_s < a.end_s and a.start_s < c.end_s)
    return found
