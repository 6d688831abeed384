"""Golden results for every shipped scenario (scenarios/*.yaml).

The simulator is deterministic, so each scenario's key metrics are pinned exactly (to float
round-off). When a model change moves them on purpose, regenerate with
``DTSIM_UPDATE_GOLDEN=1 pytest tests/test_golden.py`` and say why in the commit.
"""

import json
import os
from pathlib import Path

import pytest

import simulator

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).parent / "golden"
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))
KEYS = ("step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "hfu", "peak_memory_bytes", "oom", "params",
        "world_size", "dp", "micro_batches")


def _metrics(path: Path) -> dict:
    result = simulator.simulate(simulator.load_scenario(path))
    data = {k: getattr(result, k) for k in KEYS}
    data["exposed_comm_s"] = result.breakdown.exposed_comm_s
    data["bubble_s"] = result.breakdown.bubble_s
    return data


def test_every_scenario_has_a_golden_file():
    assert SCENARIOS, "no shipped scenarios"
    missing = [p.stem for p in SCENARIOS if not (GOLDEN / f"{p.stem}.json").exists()]
    assert not missing or os.environ.get("DTSIM_UPDATE_GOLDEN"), f"no golden file for {missing}"


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_golden(path):
    got = _metrics(path)
    file = GOLDEN / f"{path.stem}.json"
    if os.environ.get("DTSIM_UPDATE_GOLDEN"):
        file.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n")
    want = json.loads(file.read_text())
    assert set(got) == set(want)
    for key, value in want.items():
        if isinstance(value, (dict, float)):
            assert got[key] == pytest.approx(value, rel=1e-9), key
        else:
            assert got[key] == value, key
