"""Per-configuration cost of dtsim beside Calculon's, on the same layouts (not part of `make test`).

    python bench/bench_calculon.py --calculon ../calculon            # a local clone of
                                                                     # github.com/calculon-ai/calculon
    python bench/bench_calculon.py --calculon ../calculon --gpus 1024 --repeats 20

Calculon (Isaev et al., SC'23) is a closed-form performance model: one configuration is one
function evaluation. dtsim simulates each configuration as discrete events; its search first
ranks layouts with a closed-form estimate (stage 1) and simulates only the survivors. This
script times, for GPT-3 175B with tp 8 x pp 8 on A100-80GB nodes and data parallelism filling
``--gpus``, over micro-batch sizes 1, 2 and 4 with full recomputation:

* Calculon: ``Llm(app).compile(system, execution)`` then ``run(system)`` with the clone's
  ``models/gpt3-175B.json`` and ``systems/a100_80g.json`` (best of ``--repeats``);
* dtsim: one ``simulate()`` fresh (the process's cluster cache emptied) and kept (the cluster
  reused, as a sweep or search point pays), best of ``--repeats``; and dtsim's stage-1 estimate
  per layout, from a search over the same scenario's layouts (``SearchReport.stage1_s`` /
  ``stage1``, the closed-form pass over all candidates at once).

It prints the milliseconds per configuration and the ratios, and both tools' step times side by
side (they model different things: Calculon has no network contention, no pipeline schedule
events and its own efficiency tables; the step times are shown, not compared). Nothing here is
imported by the package or the tests; without ``--calculon`` only dtsim's columns are printed.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Any

import simulator

MICRO_BATCHES = (1, 2, 4)
GLOBAL_BATCH = 1536  # sequences of 2048 tokens, as Megatron-LM SC'21's GPT-3 175B


def dtsim_scenario(gpus: int, micro_batch: int) -> simulator.Scenario:
    """GPT-3 175B, tp 8 x pp 8, ZeRO-1, full recomputation, on DGX A100 nodes (dtsim's dgx-a100)."""
    return simulator.Scenario.model_validate({
        "name": f"gpt3-175b tp8 pp8 mb{micro_batch}", "model": "gpt3-175b",
        "cluster": {"node": "dgx-a100", "nodes": gpus // 8},
        "parallelism": {"tp": 8, "pp": 8, "sharding": "zero1", "sequence_parallel": False},
        "training": {"micro_batch": micro_batch, "global_batch": GLOBAL_BATCH, "recompute": "full"}})


def best_of(repeats: int, fn: Any) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def time_dtsim(gpus: int, micro_batch: int, repeats: int) -> tuple[float, float, float]:
    """(fresh s, kept s, step s) of one simulate."""
    from simulator.cluster.cache import clear_cluster_cache

    sc = dtsim_scenario(gpus, micro_batch)

    def fresh() -> Any:
        clear_cluster_cache()
        return simulator.simulate(sc)

    fresh_s, result = best_of(repeats, fresh)
    kept_s, _ = best_of(repeats, lambda: simulator.simulate(sc))
    return fresh_s, kept_s, result.step_time_s


def stage1_per_layout_s(gpus: int) -> tuple[float, int]:
    """Seconds per layout of the search's closed-form stage, and how many layouts it estimated."""
    from simulator.search import search
    from simulator.sweep import open_executor

    with open_executor("serial", 1) as pool:
        report = search(dtsim_scenario(gpus, 1), executor=pool, top=1)
    return report.stage1_s / max(report.stage1, 1), report.stage1


def calculon_runner(clone: Path) -> Any:
    """A function (gpus, micro_batch) -> (seconds, step s) evaluating Calculon from ``clone``."""
    sys.path.insert(0, str(clone))
    import calculon  # only from the given clone
    from calculon.llm import Llm

    app = Llm.Application(calculon.io.read_json_file(str(clone / "models" / "gpt3-175B.json")))
    system = calculon.System(calculon.io.read_json_file(str(clone / "systems" / "a100_80g.json")))
    log = logging.getLogger("calculon")

    def run(gpus: int, micro_batch: int, repeats: int) -> tuple[float, float]:
        execution = Llm.Execution.from_json({
            "num_procs": gpus, "tensor_par": 8, "pipeline_par": 8, "data_par": gpus // 64,
            "tensor_par_net": 0, "pipeline_par_net": 1, "data_par_net": 1,
            "batch_size": GLOBAL_BATCH, "microbatch_size": micro_batch, "datatype": "bfloat16"
            if "bfloat16" in system.cfg["matrix"] else "float16",
            "fused_activation": True, "attention_type": "multihead", "activation_recompute": "full",
            "pipeline_interleaving": 1, "optimizer_sharding": True, "tensor_par_comm_type": "ar",
            "tensor_par_overlap": "none", "seq_par_ag_redo": False, "data_par_overlap": False,
            "weight_offload": False, "activations_offload": False, "optimizer_offload": False, "training": True})

        def once() -> Any:
            model = Llm(app, log)
            model.compile(system, execution)
            model.run(system)
            return model

        seconds, model = best_of(repeats, once)
        return seconds, model.get_total_time()

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calculon", type=Path, help="a local clone of github.com/calculon-ai/calculon")
    parser.add_argument("--gpus", type=int, default=1024, help="GPUs (a multiple of 64; default 1024)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--no-search", action="store_true", help="skip timing the search's stage 1")
    args = parser.parse_args()
    if args.gpus % 64:
        parser.error("--gpus must be a multiple of 64 (tp 8 x pp 8)")
    calc = calculon_runner(args.calculon.resolve()) if args.calculon else None
    simulator.simulate(dtsim_scenario(64, 1))  # imports and catalog loaded before timing
    print(f"GPT-3 175B, tp 8 x pp 8 x dp {args.gpus // 64} on {args.gpus} A100-80GB, global batch {GLOBAL_BATCH}, "
          f"full recomputation; best of {args.repeats}")
    head = f"{'mb':>3} {'dtsim fresh ms':>15} {'dtsim kept ms':>14} {'dtsim step s':>13}"
    if calc is not None:
        head += f" {'Calculon ms':>12} {'Calculon step s':>16} {'fresh / Calculon':>17} {'kept / Calculon':>16}"
    print(head)
    for mb in MICRO_BATCHES:
        fresh_s, kept_s, step_s = time_dtsim(args.gpus, mb, args.repeats)
        line = f"{mb:>3} {1e3 * fresh_s:>15.1f} {1e3 * kept_s:>14.1f} {step_s:>13.3f}"
        if calc is not None:
            c_s, c_step = calc(args.gpus, mb, args.repeats)
            line += f" {1e3 * c_s:>12.2f} {c_step:>16.3f} {fresh_s / c_s:>16.0f}x {kept_s / c_s:>15.0f}x"
        print(line)
    if not args.no_search:
        per_s, n = stage1_per_layout_s(args.gpus)
        print(f"dtsim search, stage 1 (closed form over {n} candidate layouts at once): {1e3 * per_s:.2f} ms per layout")


if __name__ == "__main__":
    main()
