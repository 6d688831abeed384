"""Speed of the simulator itself on reference scenarios (not part of `make test`).

    python bench/bench_engine.py            # the fast cases (a few seconds)
    python bench/bench_engine.py --all      # also GPT-3 175B with every rank simulated (~1 min)

Prints wall time (best of a few runs), tasks and transfers simulated and their rate, and
the simulated step time, so symmetry reduction can be checked against the full run.
"""

from __future__ import annotations

import argparse
import time
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--all", action="store_true", help="also run the 1,024-GPU case without symmetry")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"dtsim {simulator.__version__}: wall time of simulate() (best of {args.repeats})")
    results = {name: bench(name, data, args.repeats) for name, data in CASES.items()}
    if args.all:
        data = {**CASES[FULL], "sim": {"symmetry": "off"}}
        _, full = bench(FULL + " (symmetry off)", data, 1)
        reduced = results[FULL][1]
        diff = abs(full.step_time_s / reduced.step_time_s - 1)
        print(f"step time, every rank simulated vs symmetry reduction: {100 * diff:.3f}% apart")


if __name__ == "__main__":
    main()
