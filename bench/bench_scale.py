"""Wall time of one symmetric simulate against the cluster's size (not part of `make test`).

    python bench/bench_scale.py                       # both cases, 64 .. 16,384 GPUs
    python bench/bench_scale.py --cases gpt3 --sizes 64,8192 --repeats 5
    python bench/bench_scale.py --baseline /tmp/dtsim-before   # also time a checkout of an
                                                      # earlier commit, printing the ratios

Two cases with the same simulated work at every size (16 micro-batches per data-parallel
replica, so every size runs the same engine events):

* ``gpt3``: GPT-3 175B, tp 8, pp 8, ZeRO-1, full recomputation, on DGX A100 nodes;
* ``llama``: Llama-3 405B, tp 8, pp 16 interleaved (2 virtual stages), sequence parallel,
  ZeRO-1, selective recomputation, on DGX H100 nodes.

For each size it prints the *fresh* time (the process's cluster cache emptied first:
building, routing and planning the cluster included, what a single ``dtsim run`` pays) and
the *kept* time (the same scenario again: what each further point of a sweep or search on
that cluster pays, :mod:`simulator.cluster.cache`), best of ``--repeats``, in wall seconds and
in this process's CPU seconds (steadier on a shared machine), the engine events and the step
time. With ``--baseline DIR`` the same cases run in a subprocess on the code in
DIR (e.g. ``git worktree add /tmp/dtsim-before <commit>``), fresh only, and the CPU-time
speed-ups of a fresh and a kept run over it are printed beside them; the step times must agree.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from typing import Any

import simulator

CASES = {
    "gpt3": ("GPT-3 175B tp8 pp8 zero1, A100", 8, 64),
    "llama": ("Llama-3 405B tp8 pp16 v2 SP, H100", 8, 128),
}
SIZES = {"gpt3": [64, 256, 1024, 4096, 8192, 16384], "llama": [128, 512, 2048, 8192, 16384]}
MICRO_BATCHES = 16  # per data-parallel replica, at every size


def scenario(case: str, gpus: int) -> Any:
    dp = gpus // CASES[case][2]
    if case == "gpt3":
        data = {"model": "gpt3-175b", "cluster": {"node": "dgx-a100", "nodes": gpus // 8},
                "parallelism": {"tp": 8, "pp": 8, "sharding": "zero1"},
                "training": {"micro_batch": 1, "global_batch": MICRO_BATCHES * dp, "recompute": "full"}}
    else:
        data = {"model": "llama3-405b", "cluster": {"node": "dgx-h100", "nodes": gpus // 8},
                "parallelism": {"tp": 8, "pp": 16, "pipeline_schedule": "interleaved", "virtual_stages": 2,
                                "sequence_parallel": True, "sharding": "zero1"},
                "training": {"micro_batch": 1, "global_batch": MICRO_BATCHES * dp, "recompute": "selective"}}
    return simulator.Scenario.model_validate(data)


def clear_cache() -> None:
    """Empty the process's cluster cache (a no-op on code from before it): the next run is fresh."""
    try:
        from simulator.cluster.cache import clear_cluster_cache
    except ImportError:  # code from before the cache: every run is fresh
        return
    clear_cluster_cache()


def _timed(sc: Any) -> tuple[float, float, Any]:
    wall, cpu = time.perf_counter(), time.process_time()
    result = simulator.simulate(sc)
    return time.perf_counter() - wall, time.process_time() - cpu, result


def measure(case: str, gpus: int, repeats: int, kept: bool) -> dict[str, Any]:
    """Best wall and CPU seconds of ``repeats`` fresh runs, and (``kept``) of as many kept ones."""
    sc = scenario(case, gpus)
    out: dict[str, Any] = {"fresh_s": math.inf, "fresh_cpu_s": math.inf, "kept_s": math.inf, "kept_cpu_s": math.inf}
    result = None
    for _ in range(repeats):
        clear_cache()
        wall, cpu, result = _timed(sc)
        out["fresh_s"], out["fresh_cpu_s"] = min(out["fresh_s"], wall), min(out["fresh_cpu_s"], cpu)
    for _ in range(repeats if kept else 0):
        wall, cpu, result = _timed(sc)
        out["kept_s"], out["kept_cpu_s"] = min(out["kept_s"], wall), min(out["kept_cpu_s"], cpu)
    clear_cache()
    assert result is not None
    return {**out, "events": result.engine["events"], "step_time_s": result.step_time_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="gpt3,llama")
    parser.add_argument("--sizes", default=None, help="GPU counts, comma-separated (default: each case's list)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline", default=None, help="a checkout of earlier code to time beside this one")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # one case/size, for --baseline
    args = parser.parse_args()
    cases = args.cases.split(",")
    if args.json:
        gpus = int(args.sizes)
        print(json.dumps(measure(cases[0], gpus, args.repeats, kept=False)))
        return
    print(f"dtsim {simulator.__version__}: one simulate vs cluster size (best of {args.repeats}); "
          "fresh = cluster built, kept = cluster cache warm")
    for case in cases:
        sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else SIZES[case]
        print(f"\n{CASES[case][0]}, {MICRO_BATCHES} micro-batches per replica")
        head = f"{'GPUs':>7s} {'fresh s':>8s} {'(cpu)':>7s} {'kept s':>7s} {'(cpu)':>7s} {'events':>6s} {'step s':>9s}"
        print(head + ("  before s  (cpu)  speed-up (cpu)" if args.baseline else ""))
        for gpus in sizes:
            if gpus % CASES[case][2]:
                continue
            now = measure(case, gpus, args.repeats, kept=True)
            line = (f"{gpus:7d} {now['fresh_s']:8.3f} {now['fresh_cpu_s']:7.3f} {now['kept_s']:7.3f} "
                    f"{now['kept_cpu_s']:7.3f} {now['events']:6d} {now['step_time_s']:9.5f}")
            if args.baseline:
                before = _baseline(args.baseline, case, gpus, args.repeats)
                same = "" if before["step_time_s"] == now["step_time_s"] else "  STEP TIME DIFFERS"
                line += (f"  {before['fresh_s']:8.3f} {before['fresh_cpu_s']:6.3f}  "
                         f"{before['fresh_cpu_s'] / now['fresh_cpu_s']:5.1f}x fresh "
                         f"{before['fresh_cpu_s'] / now['kept_cpu_s']:5.1f}x kept{same}")
            print(line, flush=True)


def _baseline(path: str, case: str, gpus: int, repeats: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": path}
    out = subprocess.run([sys.executable, __file__, "--json", "--cases", case, "--sizes", str(gpus),
                          "--repeats", str(repeats)], env=env, cwd=path, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
