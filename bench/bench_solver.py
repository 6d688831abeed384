"""The flow solver before and after issue 17, on the same flows in one run (not part of `make test`).

    python bench/bench_solver.py             # scenarios + synthetic flow sets (a few minutes)
    python bench/bench_solver.py --quick     # one scenario, one synthetic set

For each case the same flows run through the solver this one replaced (tests/reference_flow.py,
a Python walk of the component on every recomputation and one filling row per entity) and
through today's (:mod:`simulator.engine.network.flow`: components kept up to date, one row per
kind of entity). Printed: seconds inside the solver (best of ``--repeats``), the old/new ratio,
and the largest relative difference of the results (end times, step time).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import simpy

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from reference_flow import ReferenceFlowNetwork  # noqa: E402

import simulator  # noqa: E402
from simulator.engine.network import FlowNetwork, PhaseLoad, register_network_model  # noqa: E402

SCENARIOS = {
    "llama3-70b FSDP, 64 H100 (the search's scenario)": ("scenarios/llama3-70b-fsdp-p5.yaml", {}),
    "GPT-3 175B tp8 pp8, 1024 A100 (symmetric)": ("scenarios/gpt3-175b-3d-dgx-a100.yaml", {}),
    "bert-large DDP, 32 x p4d, every rank simulated": (None, {
        "model": "bert-large", "cluster": {"node": "p4d.24xlarge", "nodes": 32},
        "training": {"micro_batch": 32, "global_batch": 8192}, "sim": {"symmetry": "off"}}),
}


def _timed(cls: type) -> type:
    """``cls`` with the seconds spent in its solver entry points added up in ``cls.seconds``."""

    class Timed(cls):  # type: ignore[valid-type, misc]
        seconds = 0.0

        def move_bytes(self, *a: Any) -> None:
            t = time.perf_counter()
            super().move_bytes(*a)
            Timed.seconds += time.perf_counter() - t

        def _recompute(self) -> None:
            t = time.perf_counter()
            super()._recompute()
            Timed.seconds += time.perf_counter() - t

        def _maybe_finish(self, entity: Any, version: int) -> None:
            t = time.perf_counter()
            cb, entity.on_done = entity.on_done, lambda: None  # time the solver, not the engine after it
            super()._maybe_finish(entity, version)
            Timed.seconds += time.perf_counter() - t
            entity.on_done = cb
            cb()

    return Timed


def _scenario(path: str | None, data: dict[str, Any]) -> simulator.Scenario:
    return simulator.load_scenario(ROOT / path) if path else simulator.Scenario.model_validate(data)


def bench_scenario(name: str, scenario: simulator.Scenario, repeats: int) -> None:
    out = {}
    for label, cls in (("old", ReferenceFlowNetwork), ("new", FlowNetwork)):
        timed = _timed(cls)
        register_network_model("flow", timed, replace=True)
        best, step = float("inf"), 0.0
        for _ in range(repeats):
            timed.seconds = 0.0
            result = simulator.simulate(scenario)
            best, step = min(best, timed.seconds), result.step_time_s
        out[label] = (best, step, result.engine["rate_recomputations"])
    register_network_model("flow", FlowNetwork, replace=True)
    (old, s_old, _), (new, s_new, r_new) = out["old"], out["new"]
    print(f"{name:52s} solver old {old:7.3f} s  new {new:7.3f} s  x{old / new:5.1f}  "
          f"{r_new:6d} recomputations  step time {abs(s_new / s_old - 1):.1e} apart", flush=True)


def _synthetic(seed: int, n: int, classes: int) -> list[tuple[float, PhaseLoad]]:
    """``n`` phases over ``classes`` link classes, in bursts of identical copies (replicas'
    ring steps) with a few shared links between bursts: large components, many kinds alike."""
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        t0 = float(rng.choice([0.0, 1e-4, 5e-4, 2e-3]) + rng.integers(0, 20) * 1e-3)
        cls = np.sort(rng.choice(classes, size=int(rng.integers(2, 6)), replace=False))
        load = PhaseLoad(cls, rng.choice([1.0, 2.0, 0.5], size=len(cls)), float(rng.choice([4e6, 3.2e7])), 0.0)
        out += [(t0, load)] * int(rng.integers(1, 9))
    return out[:n]


def _replay(cls: type, flows: list[tuple[float, PhaseLoad]], caps: np.ndarray, ends: list[float]) -> tuple[float, int]:
    """Run ``flows`` through a solver of class ``cls``; ``ends`` gets each one's end time."""
    env = simpy.Environment()
    net = cls(env, caps)

    def start(i: int, load: PhaseLoad) -> None:
        net.transfer_phases([load], lambda: ends.__setitem__(i, env.now))

    for i, (t0, load) in enumerate(flows):
        env.timeout(t0).callbacks.append(lambda _e, i=i, load=load: start(i, load))
    begin = time.perf_counter()
    env.run()
    return time.perf_counter() - begin, net.recomputations


def bench_synthetic(n: int, classes: int, repeats: int) -> None:
    flows = _synthetic(17, n, classes)
    caps = np.full(classes, 2.5e10)
    out = {}
    for label, cls in (("old", ReferenceFlowNetwork), ("new", FlowNetwork)):
        best, ends, recomputations = float("inf"), [0.0] * len(flows), 0
        for _ in range(repeats):
            seconds, recomputations = _replay(cls, flows, caps, ends)
            best = min(best, seconds)
        out[label] = (best, np.array(ends), recomputations)
    (old, e_old, _), (new, e_new, r_new) = out["old"], out["new"]
    diff = float(np.max(np.abs(e_new / e_old - 1)))
    print(f"{f'synthetic: {n} phases on {classes} classes':52s} run    old {old:7.3f} s  new {new:7.3f} s  "
          f"x{old / new:5.1f}  {r_new:6d} recomputations  end times {diff:.1e} apart", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one scenario and one synthetic set")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"dtsim {simulator.__version__}: flow solver, old vs new on the same flows (best of {args.repeats})")
    cases = list(SCENARIOS.items())[:1] if args.quick else list(SCENARIOS.items())
    for name, (path, data) in cases:
        bench_scenario(name, _scenario(path, data), args.repeats)
    for n, classes in ([(1000, 200)] if args.quick else [(1000, 200), (2000, 400)]):
        bench_synthetic(n, classes, args.repeats)


if __name__ == "__main__":
    main()
