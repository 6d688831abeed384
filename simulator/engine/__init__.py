"""Engine stage: the only simpy code. Runs a Program's task DAG over a network model."""

from __future__ import annotations

import simpy

from simulator.engine.comm import CommResolver, LinkClasses, Resolved
from simulator.engine.core import Engine, EngineRun
from simulator.engine.network import NETWORK_MODELS, NetworkModel, PhaseLoad, network_model, register_network_model
from simulator.ir import Program

__all__ = ["run_program", "Engine", "EngineRun", "NetworkModel", "PhaseLoad", "CommResolver", "LinkClasses",
           "Resolved", "NETWORK_MODELS", "network_model", "register_network_model"]


def run_program(program: Program, resolver: CommResolver, *, mode: str = "flow", record_series: bool = False,
                overlap_slowdown: float = 0.0, durations: list[float] | None = None) -> EngineRun:
    """Execute ``program`` on a fresh simpy environment and return the recorded times.

    ``mode``: the network model's name in :data:`NETWORK_MODELS` (``sim.network``).
    ``overlap_slowdown``: compute runs ``1 + overlap_slowdown`` times longer while a collective
    of the same GPU is in flight (a collective with its own ``sm_slowdown``, DeepEP's, brings that
    instead; beside several, the largest applies). ``durations``: per-task durations replacing the tasks' own
    (stragglers and jitter, :mod:`simulator.workload.perturb`)."""
    env = simpy.Environment()
    network = network_model(mode)(env, resolver.classes.capacity, record_series=record_series)
    return Engine(program, resolver, network, slowdown=overlap_slowdown, durations=durations).run()
