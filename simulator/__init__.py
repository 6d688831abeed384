"""dtsim: a discrete-event simulator of distributed deep-learning training.

    import simulator
    scenario = simulator.load_scenario("scenarios/quickstart.yaml", overrides=["parallelism.tp=4"])
    result = simulator.simulate(scenario)
    print(result.step_time_s, result.mfu)
"""

from __future__ import annotations

from simulator.errors import InfeasibleError, ScenarioError
from simulator.results.result import Result
from simulator.run import simulate, simulate_collective
from simulator.scenario import Scenario, load_scenario
from simulator.version import __version__

__all__ = [
    "__version__",
    "Scenario",
    "Result",
    "load_scenario",
    "simulate",
    "simulate_collective",
    "ScenarioError",
    "InfeasibleError",
]
