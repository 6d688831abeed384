"""Wall time of big runs under Megatron-Core's rank order, pp outermost (not part of `make test`).

    python bench/bench_megatron_order.py                     # both cases, best of 3
    python bench/bench_megatron_order.py --cases sc21_1t --repeats 5
    python bench/bench_megatron_order.py --baseline /tmp/dtsim-before   # also time a checkout
                                                             # of earlier code, printing ratios

``parallelism.rank_order: tp-cp-dp-pp`` (set by the megatron-core, torchtitan and deepspeed
framework profiles) puts the pipeline stages outermost, so a data-parallel replica spans the
whole world and symmetry reduction stands each simulated rank for copies across its whole
stage (:mod:`simulator.workload.symmetry`): every link is its own class and one phase
crosses thousands of them. Two cases:

* ``sc21_1t``: the validation record ``megatron_sc21_t1_1t`` (Megatron-LM SC'21, GPT 1T on
  3,072 A100: tp 8, pp 64, dp 6), as ``dtsim validate`` runs it;
* ``dsv3_2048``: ``scenarios/deepseek-v3-h800.yaml`` at DeepSeek's own scale (arXiv:2412.19437
  §3.2): 256 DGX H800 = 2,048 GPUs, pp 16, ep 64, 15,360 sequences a step, the 61 blocks
  split as the file's comments describe (the first and the last two stages one block fewer:
  3, 13 x 4, 3, 3).

Each case prints the best wall and CPU seconds of ``--repeats`` runs (the cluster cache
emptied before each: what one ``dtsim run`` pays), the engine events and the step time. With
``--baseline DIR`` the same cases run in a subprocess on the code in DIR, interleaved with
this code's runs (run i of both in the same minute: the machine's load is shared), and the
step times must agree exactly.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench_scale import clear_cache  # bench/ is the script's directory, first on sys.path

import simulator

CASES = {
    "sc21_1t": "Megatron-LM SC'21 GPT 1T, 3,072 A100 (tp 8, pp 64, dp 6)",
    "dsv3_2048": "DeepSeek-V3, 2,048 H800 (pp 16, ep 64, dp 128)",
}
ROOT = Path(__file__).resolve().parent.parent


def scenario(case: str) -> Any:
    if case == "sc21_1t":
        from simulator.validation.records import load_records

        data = next(r for r in load_records() if r.id == "megatron_sc21_t1_1t").scenario
    else:
        from simulator.yamlio import load_yaml

        data = load_yaml(ROOT / "scenarios" / "deepseek-v3-h800.yaml")
        data["cluster"]["nodes"] = 256
        data["parallelism"].update(pp=16, ep=64, stage_layers=[3] + [4] * 13 + [3, 3])
        data["training"]["global_batch"] = 15360
    return simulator.Scenario.model_validate(data)


def measure(case: str) -> dict[str, Any]:
    """Wall and CPU seconds of one fresh run."""
    sc = scenario(case)
    clear_cache()
    wall, cpu = time.perf_counter(), time.process_time()
    result = simulator.simulate(sc)
    out = {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu,
           "events": result.engine["events"], "step_time_s": result.step_time_s}
    clear_cache()
    return out


def _baseline(path: str, case: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": path}
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--json", "--cases", case],
                         env=env, cwd=path, capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline", default=None, help="a checkout of earlier code to time beside this one")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # one run of one case
    args = parser.parse_args()
    cases = args.cases.split(",")
    if args.json:
        print(json.dumps(measure(cases[0])))
        return
    print(f"dtsim {simulator.__version__}: pp-outermost runs, best of {args.repeats} (fresh cluster each)")
    for case in cases:
        best = {"wall_s": math.inf, "cpu_s": math.inf}
        before = {"wall_s": math.inf, "cpu_s": math.inf}
        now: dict[str, Any] = {}
        then: dict[str, Any] = {}
        for _ in range(args.repeats):
            now = measure(case)
            best = {k: min(best[k], now[k]) for k in best}
            if args.baseline:
                then = _baseline(args.baseline, case)
                before = {k: min(before[k], then[k]) for k in before}
        line = (f"{CASES[case]}: {best['wall_s']:.2f} s wall, {best['cpu_s']:.2f} s cpu, "
                f"{now['events']} events, step {now['step_time_s']!r} s")
        if args.baseline:
            same = "same step time" if then["step_time_s"] == now["step_time_s"] else "STEP TIME DIFFERS"
            line += (f"\n  before: {before['wall_s']:.2f} s wall, {before['cpu_s']:.2f} s cpu "
                     f"({before['cpu_s'] / best['cpu_s']:.2f}x cpu speed-up; {same})")
        print(line, flush=True)


if __name__ == "__main__":
    main()
