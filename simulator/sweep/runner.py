"""Run many sweep points through any executor, cached and resumable, and collect their rows.

    with open_executor("dask-local") as executor:
        run = run_sweep(points, "out/sweep", executor=executor)

Every point not in ``OUT/cache`` (:mod:`simulator.sweep.cache`) is submitted to the
executor (:func:`~simulator.sweep.worker.simulate_point`); identical scenarios are simulated
once.

Failures never abort a sweep. A point that does not validate keeps the reason given at
expansion; a point the simulator rejects (:class:`~simulator.errors.ScenarioError`) is
cached with its message; a point whose peak memory exceeds the device is kept with all its
metrics and ``error = "out of memory: ..."``; an unexpected exception (a bug, a lost worker)
or an answer that is not a point outcome (:func:`~simulator.sweep.cache.outcome_problem`)
is recorded as ``internal error: ...`` but not cached, so the next run tries it again.

Each row starts with ``fits``: true for a point that ran and fits in device memory, false
for one that ran out of memory (its metrics are kept, but they are not a result), empty for
a point with no metrics. Each row also gets ``series`` (the label of its scaling curve) and ``scaling_efficiency``:
of a point with ``N`` GPUs against the smallest feasible point of its series (``N0`` GPUs),
``tokens_per_s_N / (N / N0 * tokens_per_s_N0)``, the definition of
:mod:`simulator.viz.scaling`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, Future, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simulator.results.scaling import scaling_efficiency
from simulator.sweep.cache import ResultCache, outcome_problem
from simulator.sweep.points import SweepPoint
from simulator.sweep.worker import point_key, simulate_point

__all__ = ["SweepProgress", "SweepRun", "run_sweep", "series_label", "INTERNAL_PREFIX"]

INTERNAL_PREFIX = "internal error"


@dataclass(frozen=True)
class SweepProgress:
    """Where a running sweep stands (passed to the progress callback after every point)."""

    total: int
    done: int
    failed: int
    cached: int
    elapsed_s: float


@dataclass
class SweepRun:
    """The outcome of :func:`run_sweep`: one row per point, in point order."""

    rows: list[dict[str, Any]]
    varied: list[str]
    simulated: int = 0
    cached: int = 0
    failed: int = 0
    wall_s: float = 0.0
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def columns(self) -> list[str]:
        """``fits``, ``point``, the varied fields, every metric seen (first-seen order, which
        is the same whether a row came from the cache or not), ``series``,
        ``scaling_efficiency``, ``error``."""
        head = ["fits", "point", *self.varied]
        tail = ["series", "scaling_efficiency", "error"]
        metrics: dict[str, None] = {}
        for row in self.rows:
            for name in row:
                if name not in head and name not in tail:
                    metrics.setdefault(name, None)
        return [*head, *metrics, *tail]


def run_sweep(
    points: Sequence[SweepPoint],
    out_dir: str | Path,
    *,
    executor: Executor,
    varied: Sequence[str] | None = None,
    series: Sequence[str] = (),
    progress: Callable[[SweepProgress], None] | None = None,
) -> SweepRun:
    """Simulate every point not already in ``OUT/cache`` on ``executor`` and return all rows.

    ``varied``: the varied-field columns (default: the keys of the points' values);
    ``series``: the fields whose values label a point's scaling curve. Identical scenarios
    are simulated once. ``progress`` is called after each point (cached ones first). On
    ``KeyboardInterrupt`` the futures not yet started are cancelled and the interrupt
    propagates; every point finished before it is already cached.
    """
    start = time.perf_counter()
    cache = ResultCache(Path(out_dir) / "cache")
    varied = list(varied) if varied is not None else list(dict.fromkeys(k for p in points for k in p.values))
    outcomes: dict[int, dict[str, Any]] = {}
    keys: dict[int, str] = {}
    pending: dict[str, list[int]] = {}
    payloads: dict[str, dict[str, Any]] = {}
    stats = {"done": 0, "failed": 0, "cached": 0, "simulated": 0}

    def report() -> None:
        if progress is not None:
            progress(SweepProgress(len(points), stats["done"], stats["failed"], stats["cached"],
                                   time.perf_counter() - start))

    def finish(index: int, outcome: dict[str, Any], *, from_cache: bool) -> None:
        outcomes[index] = outcome
        stats["done"] += 1
        stats["cached"] += from_cache
        stats["failed"] += outcome.get("error") is not None

    for point in points:
        if point.scenario is None:
            finish(point.index, {"metrics": None, "error": point.error or "invalid point"}, from_cache=False)
            continue
        key = keys[point.index] = point_key(point.scenario)
        entry = cache.get(key)
        if entry is not None:
            finish(point.index, entry, from_cache=True)
        else:
            pending.setdefault(key, []).append(point.index)
            payloads.setdefault(key, point.scenario.model_dump(mode="json", by_alias=True))
    report()

    futures: dict[Future[Any], str] = {}
    harvested: set[Future[Any]] = set()

    def harvest(future: Future[Any]) -> None:
        harvested.add(future)
        key = futures[future]
        outcome, cacheable = _outcome(future)
        if cacheable:
            cache.put(key, outcome)
        stats["simulated"] += 1
        for index in pending[key]:
            finish(index, outcome, from_cache=False)
        report()

    try:
        for key, payload in payloads.items():
            futures[executor.submit(simulate_point, payload)] = key
        for future in as_completed(futures):
            harvest(future)
    except BaseException:
        for future in futures:
            future.cancel()
        for future in futures:  # keep what finished before the interrupt
            if future not in harvested and future.done() and not future.cancelled():
                harvest(future)
        raise

    rows = [_row(point, outcomes[point.index], varied) for point in points]
    _add_scaling(rows, points, series)
    return SweepRun(rows, varied, simulated=stats["simulated"], cached=stats["cached"], failed=stats["failed"],
                    wall_s=time.perf_counter() - start)


def _outcome(future: Future[Any]) -> tuple[dict[str, Any], bool]:
    """The worker's answer and whether it may be cached (not for bugs or lost workers)."""
    try:
        answer = future.result()
    except Exception as exc:  # a bug in the simulator, a dead worker, a lost connection
        return {"metrics": None, "error": f"{INTERNAL_PREFIX}: {type(exc).__name__}: {exc}"}, False
    problem = outcome_problem(answer)
    if problem is not None:  # a worker of another version, a broken transport: never cached
        return {"metrics": None, "error": f"{INTERNAL_PREFIX}: the worker's answer is not a point outcome "
                                          f"({problem})"}, False
    return {"metrics": answer["metrics"], "error": answer["error"]}, True


def _row(point: SweepPoint, outcome: Mapping[str, Any], varied: Sequence[str]) -> dict[str, Any]:
    metrics = outcome.get("metrics")
    row: dict[str, Any] = {"fits": None if metrics is None else not metrics.get("oom"), "point": point.index}
    for name in varied:
        row[name] = point.values.get(name)
    for name, value in (metrics or {}).items():
        row.setdefault(name, value)  # a metric never overwrites the row's own columns
    row["error"] = outcome.get("error")
    return row


def series_label(values: Mapping[str, Any], fields: Sequence[str]) -> str:
    """``"sharding=zero3, tp=2"``: each series field's last path segment and its value."""
    return ", ".join(f"{f.rsplit('.', 1)[-1]}={_plain(values.get(f))}" for f in fields)


def _plain(value: Any) -> str:
    return "default" if value is None else str(value)


def _add_scaling(rows: list[dict[str, Any]], points: Sequence[SweepPoint], series: Sequence[str]) -> None:
    groups: dict[str, list[dict[str, Any]]] = {}
    for row, point in zip(rows, points, strict=True):
        row["series"] = series_label(point.values, series)
        row["scaling_efficiency"] = None
        if row["error"] is None and row.get("tokens_per_s") and row.get("world_size"):
            groups.setdefault(row["series"], []).append(row)
    for members in groups.values():
        eff = scaling_efficiency([float(r["world_size"]) for r in members], [float(r["tokens_per_s"]) for r in members])
        for row, value in zip(members, eff, strict=True):
            row["scaling_efficiency"] = value
