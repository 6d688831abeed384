"""Run many scenarios through any executor, cached and resumable, and tabulate their metrics.

    sweep = load_sweep("scenarios/sweeps/gpt3-13b-p4d-sharding.yaml")
    points = expand_sweep(sweep)
    with open_executor("dask-local") as executor:
        run = run_sweep(points, "out/sweep", executor=executor)
    write_results(run, "out/sweep")            # results.csv, results.json

Each point is one whole :func:`simulator.simulate` call in a worker (parallelism is across
scenarios, never inside one). The worker gets the scenario as a JSON mapping and returns a
flat record of scalar metrics (:func:`result_metrics`); the parent writes every finished
point to ``OUT/cache/<key>.json`` at once, atomically (a temporary file, then
:func:`os.replace`), where ``key`` hashes the scenario's content hash, the simulator
version and the fingerprint of its code and data. A later run with the same output folder reads those entries instead of
simulating, so an interrupted sweep resumes where it stopped and loses nothing.

Failures never abort a sweep. A point that does not validate keeps the reason given at
expansion; a point the simulator rejects (:class:`~simulator.errors.ScenarioError`) is
cached with its message; a point whose peak memory exceeds the device is kept with all its
metrics and ``error = "out of memory: ..."``; an unexpected exception (a bug, a lost worker)
is recorded as ``internal error: ...`` but not cached, so the next run tries it again.

``results.csv`` has one row per point, in point order: ``point``, the varied fields, the
metrics, ``series`` (the label of its scaling curve), ``scaling_efficiency`` and ``error``.
Scaling efficiency of a point with ``N`` GPUs against the smallest feasible point of its
series (``N0`` GPUs): ``tokens_per_s_N / (N / N0 * tokens_per_s_N0)``, the definition of
:mod:`simulator.viz.scaling`.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor, Future, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simulator import __version__
from simulator.datadirs import model_fingerprint
from simulator.errors import ScenarioError
from simulator.results.scaling import scaling_efficiency
from simulator.scenario import Scenario
from simulator.sweepfile import SweepPoint

__all__ = [
    "SweepProgress",
    "SweepRun",
    "ResultCache",
    "run_sweep",
    "write_results",
    "simulate_point",
    "result_metrics",
    "point_key",
    "series_label",
    "atomic_write_text",
]

OOM_PREFIX = "out of memory"
INTERNAL_PREFIX = "internal error"


# ----------------------------------------------------------------------------------------
# one point, in a worker


def simulate_point(scenario_json: dict[str, Any]) -> dict[str, Any]:
    """Simulate one scenario given as a JSON mapping (``Scenario.model_dump(mode="json")``).

    Returns ``{"metrics": {...} | None, "error": str | None}``. A scenario the simulator
    rejects comes back with its message in ``error``; any other exception propagates (the
    caller records it as an internal error).
    """
    from simulator.run import simulate  # the worker's import, kept out of the parent's module import

    try:
        scenario = Scenario.model_validate(scenario_json)
        result = simulate(scenario)
    except ScenarioError as exc:
        return {"metrics": None, "error": str(exc)}
    metrics = result_metrics(result, scenario)
    error = None
    if result.oom:
        detail = result.oom_detail.message if result.oom_detail is not None else ""
        error = f"{OOM_PREFIX}: {detail}" if detail else OOM_PREFIX
    return {"metrics": metrics, "error": error}


_SKIPPED_RESULT_FIELDS = frozenset({"flops_convention"})


def result_metrics(result: Any, scenario: Scenario) -> dict[str, Any]:
    """Every scalar of a :class:`~simulator.results.result.Result`, flat, SI units in the names:
    the top-level numbers, the critical rank's breakdown (``compute_s``, ``bubble_s``,
    ``idle_s``, ``exposed_comm_s`` and ``exposed_comm_<kind>_s`` / ``comm_<kind>_s`` per
    group kind), the memory of the rank with the highest peak by category
    (``<category>_bytes``) and ``memory_headroom_bytes`` (device memory minus peak)."""
    dump = result.model_dump()
    out: dict[str, Any] = {"nodes": scenario.cluster.n_nodes, "gpu": scenario.cluster.gpu_name}
    for name, value in dump.items():
        if name in _SKIPPED_RESULT_FIELDS:
            continue
        if isinstance(value, (bool, int, float, str)):
            out[name] = value
    b = result.breakdown
    out["compute_s"] = b.compute_s
    out["exposed_comm_s"] = b.exposed_comm_total_s
    for kind, seconds in sorted(b.exposed_comm_s.items()):
        out[f"exposed_comm_{kind}_s"] = seconds
    for kind, seconds in sorted(b.comm_s.items()):
        out[f"comm_{kind}_s"] = seconds
    out["bubble_s"] = b.bubble_s
    out["idle_s"] = b.idle_s
    peak = max(result.memory, key=lambda m: m.peak_bytes)
    for category in ("params", "grads", "optimizer", "activations", "buffers", "other"):
        out[f"{category}_bytes"] = getattr(peak, f"{category}_bytes")
    out["memory_headroom_bytes"] = result.gpu_memory_bytes - result.peak_memory_bytes
    return out


def point_key(scenario: Scenario) -> str:
    """Cache key of a scenario: SHA-256 of its content hash, the simulator version and the
    fingerprint of the simulator's code and data (:func:`~simulator.datadirs.model_fingerprint`),
    so a changed model never reuses an old result."""
    key = f"{scenario.content_hash()}\n{__version__}\n{model_fingerprint()}"
    return hashlib.sha256(key.encode()).hexdigest()


# ----------------------------------------------------------------------------------------
# cache


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the whole new one, never
    a part: a uniquely named temporary file in the same folder, flushed to disk, then
    :func:`os.replace` (atomic on POSIX and Windows)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8", newline="") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class ResultCache:
    """Finished points, one JSON file per key under ``folder``. Unreadable or foreign entries
    (an interrupted write from another tool, a different key inside) count as missing."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    def _path(self, key: str) -> Path:
        return self.folder / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        try:
            entry = json.loads(self._path(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(entry, dict) or entry.get("key") != key:
            return None
        return entry

    def put(self, key: str, outcome: Mapping[str, Any]) -> None:
        entry = {"key": key, "simulator_version": __version__, **outcome}
        atomic_write_text(self._path(key), json.dumps(entry, sort_keys=True))


# ----------------------------------------------------------------------------------------
# running


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
        """``point``, the varied fields, every metric seen (first-seen order), ``series``,
        ``scaling_efficiency``, ``error``."""
        head = ["point", *self.varied]
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
    return {"metrics": answer.get("metrics"), "error": answer.get("error")}, True


def _row(point: SweepPoint, outcome: Mapping[str, Any], varied: Sequence[str]) -> dict[str, Any]:
    row: dict[str, Any] = {"point": point.index}
    for name in varied:
        row[name] = point.values.get(name)
    row.update(outcome.get("metrics") or {})
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


# ----------------------------------------------------------------------------------------
# outputs


def _csv_cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return value


def results_csv(run: SweepRun) -> str:
    """The rows as CSV text (empty cells for missing values; floats at full precision)."""
    buffer = io.StringIO()
    columns = run.columns
    writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in run.rows:
        writer.writerow({c: _csv_cell(row.get(c)) for c in columns})
    return buffer.getvalue()


def write_results(run: SweepRun, out_dir: str | Path, *, meta: Mapping[str, Any] | None = None) -> list[Path]:
    """Write ``results.csv`` and ``results.json`` (rows plus ``meta``) atomically; returns the paths."""
    out = Path(out_dir)
    csv_path, json_path = out / "results.csv", out / "results.json"
    atomic_write_text(csv_path, results_csv(run))
    document = {
        "simulator_version": __version__,
        "points": len(run.rows),
        "simulated": run.simulated,
        "cached": run.cached,
        "failed": run.failed,
        "columns": run.columns,
        **dict(meta or {}),
        "rows": run.rows,
    }
    atomic_write_text(json_path, json.dumps(document, indent=1, default=str) + "\n")
    return [csv_path, json_path]


def feasible_rows(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Rows without an error (what the scaling figure draws)."""
    return [r for r in rows if r.get("error") is None]
