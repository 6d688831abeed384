"""Speed of the simulator itself on reference scenarios (not part of `make test`).

    python bench/bench_engine.py            # the fast cases (a few seconds)
    python bench/bench_engine.py --all      # also GPT-3 175B with every rank simulated (~1 min)
    python bench/bench_engine.py --all --against ../other-checkout   # and the same in another checkout

Prints wall time (best of a few runs), tasks and transfers simulated and their rate, and
the simulated step time, so symmetry reduction can be checked against the full run. The
run with every rank simulated is measured in fresh processes (wall and CPU seconds, peak
resident memory from ``resource.getrusage``); ``--against DIR`` runs it alternately with
the simulator of checkout DIR (e.g. the commit before a change) and prints the ratios, so
both sides see the same machine load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import simulator

CASES: dict[str, dict[str, Any]] = {
    "bert-large DDP, 32 x p4d (256 GPUs)": {
        "model": "bert-large", "cluster": {"node": "p4d.24xlarge", "nodes": 32},
        "training": {"micro_batch": 32, "global_batch": 8192},
    },
    "GPT-3 13B ZeRO-3, 16 x p4d (128 GPUs)": {
        "model": "gpt3-13b", "cluster": {"node": "p4d.24xlarge", "nodes": 16},
        "parallelism": {"sharding": "zero3"},
        "training": {"micro_batch": 4, "global_batch": 1024, "recompute": "full"},
    },
    "GPT-3 13B DDP, 16 x p4d (128 GPUs, OOM verdict)": {
        "model": "gpt3-13b", "cluster": {"node": "p4d.24xlarge", "nodes": 16},
        "training": {"micro_batch": 1, "global_batch": 1024},
    },
    "GPT-3 175B tp8 pp8 zero1 full recompute, 1024 A100": {
        "model": "gpt3-175b", "cluster": {"node": "dgx-a100", "nodes": 128},
        "parallelism": {"tp": 8, "pp": 8, "sharding": "zero1"},
        "training": {"micro_batch": 1, "global_batch": 1536, "recompute": "full"},
    },
    "Llama-3 405B tp8 pp16 v2 SP selective, 16384 H100": {
        "model": "llama3-405b", "cluster": {"node": "dgx-h100", "nodes": 2048},
        "parallelism": {"tp": 8, "pp": 16, "pipeline_schedule": "interleaved", "virtual_stages": 2,
                        "sequence_parallel": True, "sharding": "zero1"},
        "training": {"micro_batch": 1, "global_batch": 2048, "recompute": "selective"},
    },
}
FULL = "GPT-3 175B tp8 pp8 zero1 full recompute, 1024 A100"
ROOT = Path(__file__).resolve().parents[1]

# one simulate in a fresh process, with the simulator found on PYTHONPATH: its numbers as JSON
CHILD = """
import json, resource, sys, time
import simulator
scenario = simulator.Scenario.model_validate(json.loads(sys.argv[1]))
wall, cpu = time.perf_counter(), time.process_time()
result = simulator.simulate(scenario)
print(json.dumps({"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu,
                  "rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "step_time_s": result.step_time_s, "tasks": result.engine["tasks"]}))
"""


def bench(name: str, data: dict[str, Any], repeats: int) -> tuple[float, Any]:
    scenario = simulator.Scenario.model_validate(data)
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = simulator.simulate(scenario)
        best = min(best, time.perf_counter() - start)
    assert result is not None
    tasks, transfers = result.engine["tasks"], result.engine["network_entities"]
    print(f"{name:58s} {best:7.3f} s  {tasks:8d} tasks {transfers:7d} transfers  "
          f"{(tasks + transfers) / best:9.0f} /s  step {result.step_time_s:9.4f} s  MFU {100 * result.mfu:5.1f}%"
          f"{'  OOM' if result.oom else ''}", flush=True)
    return best, result


def fresh(data: dict[str, Any], checkout: Path) -> dict[str, float]:
    """One simulate of ``data`` in a fresh process using the simulator of ``checkout``."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(data)], env=env, cwd=checkout,  # not ours on sys.path
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def bench_fresh(name: str, data: dict[str, Any], repeats: int, against: Path | None) -> dict[str, float]:
    """Best of ``repeats`` fresh runs here (and in ``against``, alternately): wall, CPU, peak RSS."""
    sides = {"this checkout": ROOT, **({f"{against}": against} if against else {})}
    best: dict[str, dict[str, float]] = {side: {} for side in sides}
    for _ in range(repeats):
        for side, checkout in sides.items():
            got = fresh(data, checkout)
            for key, value in got.items():
                best[side][key] = min(best[side].get(key, value), value)
    for side, b in best.items():
        print(f"{name} [{side}]: wall {b['wall_s']:6.2f} s  CPU {b['cpu_s']:6.2f} s  peak RSS "
              f"{b['rss_bytes'] / 2**20:6.0f} MiB  {b['tasks']:.0f} tasks  step {b['step_time_s']:.6f} s", flush=True)
    if against:
        new, old = best["this checkout"], best[f"{against}"]
        print(f"  ratio {against} / this checkout: wall x{old['wall_s'] / new['wall_s']:.2f}  "
              f"CPU x{old['cpu_s'] / new['cpu_s']:.2f}  RSS x{old['rss_bytes'] / new['rss_bytes']:.2f}  "
              f"step time {abs(new['step_time_s'] / old['step_time_s'] - 1):.1e} apart", flush=True)
    return best["this checkout"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--all", action="store_true", help="also run the 1,024-GPU case without symmetry")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--against", type=Path, help="another checkout to compare the full run with")
    parser.add_argument("--full-only", action="store_true", help="only the run with every rank simulated")
    args = parser.parse_args()
    print(f"dtsim {simulator.__version__}: wall time of simulate() (best of {args.repeats})")
    cases = {} if args.full_only else CASES
    results = {name: bench(name, data, args.repeats) for name, data in cases.items()}
    if args.all or args.full_only:
        data = {**CASES[FULL], "sim": {"symmetry": "off"}}
        full = bench_fresh(FULL + " (symmetry off)", data, 1 if args.against is None else args.repeats,
                           args.against)
        if FULL in results:
            diff = abs(full["step_time_s"] / results[FULL][1].step_time_s - 1)
            print(f"step time, every rank simulated vs symmetry reduction: {100 * diff:.3f}% apart")


if __name__ == "__main__":
    main()
