"""Wall time of ``dtsim search`` on Llama 3 70B over 64 H100 (not part of `make test`).

    python bench/bench_search.py                    # the layered search, 2 workers
    python bench/bench_search.py --workers 1 --bound-only

Runs ``dtsim search scenarios/llama3-70b-fsdp-p5.yaml`` (2,119 layouts) in this process with
a fresh cache and prints its wall time, what each stage kept, and the best layout.
``--bound-only`` searches as before the layered search (``margin = 1``: only the proven step
bound prunes), to print the ratio of the two in the same run; it takes several minutes.
Target (issue 17): at most 30 s on 2 cores, with the same best layout as the search before
(``tp4 pp2 cp2 dp4 mb1 interleaved(v=4) zero1 rc=none``) or a better one the simulation confirms.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import simulator
from simulator.search import search
from simulator.sweep import open_executor

SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "llama3-70b-fsdp-p5.yaml"


def run(workers: int, margin: float | None) -> tuple[float, object]:
    base = simulator.load_scenario(SCENARIO)
    start = time.perf_counter()
    with open_executor("local", workers) as pool:
        report = search(base, executor=pool, top=5, batch=4 * workers,
                        **({} if margin is None else {"margin": margin}))
    return time.perf_counter() - start, report


def show(name: str, wall_s: float, report: object) -> None:
    r = report
    best = r.ranked[0] if r.ranked else None  # type: ignore[attr-defined]
    print(f"{name}: {wall_s:.1f} s; {r.enumerated} layouts, {r.stage1} candidates in closed form "  # type: ignore[attr-defined]
          f"({r.stage1_s:.1f} s), {r.estimated} simulated from short runs (margin {100 * r.margin:.0f}%), "  # type: ignore[attr-defined]
          f"{r.simulated} whole")  # type: ignore[attr-defined]
    if best is not None:
        print(f"  best: {best.label}, step {best.metrics['step_time_s']:.3f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--bound-only", action="store_true", help="also run with only the proven bound pruning")
    args = parser.parse_args()
    wall, report = run(args.workers, None)
    show("layered search", wall, report)
    if args.bound_only:
        old_wall, old = run(args.workers, 1.0)
        show("bound only", old_wall, old)
        print(f"speed-up {old_wall / wall:.1f}x")


if __name__ == "__main__":
    main()
