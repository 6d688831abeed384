"""A scenario and seed determine the result exactly."""

import simulator
from tests.conftest import small_scenario


def test_two_runs_give_identical_json(root):
    sc = simulator.load_scenario(root / "scenarios/quickstart.yaml")
    assert simulator.simulate(sc).model_dump_json() == simulator.simulate(sc).model_dump_json()


def test_identical_in_a_fresh_process_with_tcp_hashing():
    """ECMP hashing uses a stable hash of (flow, seed), not Python's randomised hash()."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]

    code = ("import simulator, tests.conftest as c; "
            "sc = simulator.Scenario.model_validate(c.small_scenario(cluster={'node': 'p3.16xlarge', 'nodes': 16}, "
            "sim={'seed': 3}, training={'micro_batch': 1, 'global_batch': 256, 'precision': 'fp16'})); "
            "print(simulator.simulate(sc).step_time_s)")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           cwd=root, env={**os.environ, "PYTHONHASHSEED": str(seed), "PYTHONPATH": str(root)}).stdout
            for seed in (1, 2)}
    assert len(outs) == 1
    sc = simulator.Scenario.model_validate(small_scenario(cluster={"node": "p3.16xlarge", "nodes": 16}, sim={"seed": 3},
                                                          training={"micro_batch": 1, "global_batch": 256, "precision": "fp16"}))
    assert float(outs.pop()) == simulator.simulate(sc).step_time_s
