"""Wall time of 100-point sweeps on this machine (not part of `make test`).

    python bench/bench_sweep.py                         # serial, local process pool, dask-local; all CPUs
    python bench/bench_sweep.py --workers 2 --executors local,dask-local --sweeps heavy

Two sweeps of 100 points each, 1 to 16 p4d.24xlarge (8 to 128 A100-40GB) x five
data-parallel strategies x four micro-batch sizes, 8 sequences per GPU per step:

* ``light``: GPT-3 XL (1.3B), DDP / ZeRO-1 / ZeRO-2 / ZeRO-3 / FSDP, tens of ms per point;
* ``heavy``: GPT-3 13B with full recomputation, ZeRO-2 / ZeRO-3 / FSDP / HSDP / MiCS
  (shard groups of 8), a few hundred ms per point.

Some points run out of memory and are recorded as such. Each executor runs a sweep into a
fresh output folder (every point simulated), then once more into the same folder (every
point from the cache). Prints wall time, points per second, and the speed-up over running
the points one by one in this process.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from simulator.errors import ScenarioError
from simulator.sweep import default_workers, expand_sweep, load_sweep, open_executor, run_sweep, write_results

SWEEPS = {
    "light": ("""\
model: gpt3-1.3b
cluster: {node: p4d.24xlarge, nodes: 1}
training: {micro_batch: 1, global_batch: 32, precision: bf16}
""", """\
base: base.yaml
vary:
  cluster.nodes: [1, 2, 4, 8, 16]
  parallelism.sharding: [none, zero1, zero2, zero3, fsdp]
  training.micro_batch: [1, 2, 4, 8]
derive:
  training.global_batch: "{cluster.nodes} * 8 * 8"   # 8 sequences per GPU: 8, 4, 2 or 1 micro-batches
"""),
    "heavy": ("""\
model: gpt3-13b
cluster: {node: p4d.24xlarge, nodes: 1}
training: {micro_batch: 1, global_batch: 32, precision: bf16, recompute: full}
""", """\
base: base.yaml
vary:
  cluster.nodes: [1, 2, 4, 8, 16]
  training.micro_batch: [1, 2, 4, 8]
zip:
  parallelism.sharding: [zero2, zero3, fsdp, hsdp, mics]
  parallelism.shard_group_size: [null, null, null, 8, 8]
derive:
  training.global_batch: "{cluster.nodes} * 8 * 8"
"""),
}


def run(sweep_path: Path, out: Path, executor_name: str, workers: int) -> tuple[float, int, int, int]:
    sweep = load_sweep(sweep_path)
    start = time.perf_counter()
    points = expand_sweep(sweep)
    with open_executor(executor_name, workers) as executor:
        ready = time.perf_counter()
        result = run_sweep(points, out, executor=executor, varied=sweep.spec.varied_fields,
                           series=sweep.spec.series_fields())
    write_results(result, out)
    wall = time.perf_counter() - start
    print(f"  {executor_name:11s} {len(points):4d} points  {wall:7.2f} s wall ({ready - start:5.2f} s to start)  "
          f"{len(points) / wall:6.1f} points/s  simulated {result.simulated:3d}, cached {result.cached:3d}, "
          f"infeasible {result.failed:3d}", flush=True)
    return wall, result.simulated, result.cached, result.failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=default_workers())
    parser.add_argument("--executors", default="serial,local,dask-local")
    parser.add_argument("--sweeps", default="light,heavy")
    args = parser.parse_args()
    for sweep_name in args.sweeps.split(","):
        base, sweep = SWEEPS[sweep_name]
        with tempfile.TemporaryDirectory(prefix="dtsim-bench-sweep-") as tmp:
            folder = Path(tmp)
            (folder / "base.yaml").write_text(base)
            sweep_path = folder / "sweep.yaml"
            sweep_path.write_text(sweep)
            print(f"{sweep_name} 100-point sweep, {args.workers} worker(s), {default_workers()} CPU(s) available")
            walls: dict[str, float] = {}
            for name in args.executors.split(","):
                out = folder / f"out-{name}"
                try:
                    walls[name], *_ = run(sweep_path, out, name, args.workers)
                except ScenarioError as exc:  # e.g. dask not installed
                    print(f"  {name:11s} skipped: {exc}")
                    continue
                run(sweep_path, out, name, args.workers)  # again: every point from the cache
            if "serial" in walls:
                for name, wall in walls.items():
                    if name != "serial":
                        print(f"  speed-up of {name} over serial: {walls['serial'] / wall:.2f}x")


if __name__ == "__main__":
    main()
