"""Wall time of 100-point sweeps on this machine (not part of `make test`).

    python bench/bench_sweep.py                         # serial, local process pool, dask-local; all CPUs
    python bench/bench_sweep.py --workers 2 --executors local,dask-local --sweeps heavy
    python bench/bench_sweep.py --workers 2 --executors local --sweeps heavy --against ../other-checkout

Two sweeps of 100 points each, 1 to 16 p4d.24xlarge (8 to 128 A100-40GB) x five
data-parallel strategies x four micro-batch sizes, 8 sequences per GPU per step:

* ``light``: GPT-3 XL (1.3B), DDP / ZeRO-1 / ZeRO-2 / ZeRO-3 / FSDP, tens of ms per point;
* ``heavy``: GPT-3 13B with full recomputation, ZeRO-2 / ZeRO-3 / FSDP / HSDP / MiCS
  (shard groups of 8), a few hundred ms per point.

Some points run out of memory and are recorded as such. Each executor runs a sweep into a
fresh output folder (every point simulated), then once more into the same folder (every
point from the cache). Prints wall time, points per second, and the speed-up over running
the points one by one in this process.

``--against DIR`` also runs each fresh sweep in new processes, alternately with the simulator
of checkout DIR (e.g. the commit before a change) and this one, ``--repeats`` times: whole
process wall time (start-up and imports included), CPU seconds of the process and its
workers, the ratio, and whether both wrote the same ``results.csv`` byte for byte.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
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


ROOT = Path(__file__).resolve().parents[1]

# one fresh sweep in a new process, with the simulator found on PYTHONPATH
CHILD = """
import sys
from pathlib import Path
from simulator.sweep import expand_sweep, load_sweep, open_executor, run_sweep, write_results
sweep = load_sweep(Path(sys.argv[1]))
points = expand_sweep(sweep)
with open_executor(sys.argv[3], int(sys.argv[4])) as executor:
    result = run_sweep(points, Path(sys.argv[2]), executor=executor, varied=sweep.spec.varied_fields,
                       series=sweep.spec.series_fields())
write_results(result, Path(sys.argv[2]))
"""


def fresh(sweep_path: Path, out: Path, executor_name: str, workers: int, checkout: Path) -> tuple[float, float]:
    """Wall and CPU seconds (the process and its workers) of one fresh sweep in a new process
    using the simulator of ``checkout``."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", CHILD, str(sweep_path), str(out), executor_name, str(workers)], env=env,
                   cwd=checkout, check=True)  # cwd: not ours on sys.path
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def against(folder: Path, sweep_path: Path, executor_name: str, workers: int, other: Path, repeats: int) -> None:
    """Fresh sweeps here and in ``other``, alternately: best wall and CPU of each, the ratios,
    and whether the results are the same."""
    sides = {"this checkout": ROOT, str(other): other}
    best: dict[str, tuple[float, float]] = {}
    csv: dict[str, bytes] = {}
    for i in range(repeats):
        for side, checkout in sides.items():
            out = folder / f"fresh-{executor_name}-{len(best)}-{i}-{checkout.name}"
            wall, cpu = fresh(sweep_path, out, executor_name, workers, checkout)
            old = best.get(side, (wall, cpu))
            best[side] = (min(old[0], wall), min(old[1], cpu))
            csv[side] = (out / "results.csv").read_bytes()
    for side, (wall, cpu) in best.items():
        print(f"  {executor_name:11s} fresh process [{side}]: wall {wall:6.2f} s  CPU {cpu:6.2f} s (best of {repeats})")
    new, old = best["this checkout"], best[str(other)]
    same = "same" if csv["this checkout"] == csv[str(other)] else "DIFFERENT"
    print(f"  ratio {other} / this checkout: wall x{old[0] / new[0]:.2f}  CPU x{old[1] / new[1]:.2f}  "
          f"results.csv {same}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=default_workers())
    parser.add_argument("--executors", default="serial,local,dask-local")
    parser.add_argument("--sweeps", default="light,heavy")
    parser.add_argument("--against", type=Path, help="another checkout to compare fresh sweeps with")
    parser.add_argument("--repeats", type=int, default=3, help="fresh runs per side with --against")
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
                if args.against is not None:
                    against(folder, sweep_path, name, args.workers, args.against.resolve(), args.repeats)
            if "serial" in walls:
                for name, wall in walls.items():
                    if name != "serial":
                        print(f"  speed-up of {name} over serial: {walls['serial'] / wall:.2f}x")


if __name__ == "__main__":
    main()
