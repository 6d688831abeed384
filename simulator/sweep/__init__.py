"""Sweeps: run many scenarios through any executor, cached and resumable, and tabulate their metrics.

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
or a worker answer of the wrong shape is recorded as ``internal error: ...`` but not cached,
so the next run tries it again. Cache entries are validated on reading
(:class:`~simulator.sweep.cache.CacheEntry`); a misshapen one is simulated again.

``results.csv`` has one row per point, in point order: ``fits`` (false for an
out-of-memory point, empty for one with no metrics), ``point``, the varied fields, the
metrics, ``series`` (the label of its scaling curve), ``scaling_efficiency`` and ``error``.
Scaling efficiency of a point with ``N`` GPUs against the smallest feasible point of its
series (``N0`` GPUs): ``tokens_per_s_N / (N / N0 * tokens_per_s_N0)``, the definition of
:mod:`simulator.viz.scaling`.

The package, one concept per module:

* :mod:`~simulator.sweep.file`: the sweep file format (``base``, ``set``, ``vary``, ``zip``,
  ``derive``, ``series``) and :func:`load_sweep`;
* :mod:`~simulator.sweep.expressions`: the arithmetic of ``derive`` values;
* :mod:`~simulator.sweep.points`: :func:`expand_sweep`, the validated points;
* :mod:`~simulator.sweep.executors`: :func:`open_executor`, where points run;
* :mod:`~simulator.sweep.worker`: one point in a worker, its metrics and cache key;
* :mod:`~simulator.sweep.cache`: finished points on disk;
* :mod:`~simulator.sweep.runner`: :func:`run_sweep`;
* :mod:`~simulator.sweep.output`: ``results.csv`` and ``results.json``.
"""

from __future__ import annotations

from simulator.sweep.cache import CacheEntry, PointOutcome, ResultCache, atomic_write_text, outcome_problem
from simulator.sweep.executors import (
    EXECUTOR_HELP,
    InlineExecutor,
    RayExecutor,
    bound_workers,
    check_executor,
    default_workers,
    open_executor,
)
from simulator.sweep.expressions import ExpressionError, evaluate, references
from simulator.sweep.file import GPU_COUNT_FIELDS, SweepFile, SweepSpec, load_sweep
from simulator.sweep.output import feasible_rows, invalid_reasons, results_csv, write_results
from simulator.sweep.points import SweepPoint, expand_sweep, get_path, set_path
from simulator.sweep.runner import INTERNAL_PREFIX, SweepProgress, SweepRun, run_sweep, series_label
from simulator.sweep.worker import OOM_PREFIX, point_key, result_metrics, simulate_point

__all__ = [
    # the sweep file and its points
    "SweepSpec",
    "SweepFile",
    "SweepPoint",
    "load_sweep",
    "expand_sweep",
    "set_path",
    "get_path",
    "GPU_COUNT_FIELDS",
    "ExpressionError",
    "evaluate",
    "references",
    # executors
    "open_executor",
    "check_executor",
    "bound_workers",
    "default_workers",
    "InlineExecutor",
    "RayExecutor",
    "EXECUTOR_HELP",
    # running and results
    "SweepProgress",
    "SweepRun",
    "ResultCache",
    "PointOutcome",
    "CacheEntry",
    "outcome_problem",
    "run_sweep",
    "write_results",
    "results_csv",
    "feasible_rows",
    "invalid_reasons",
    "simulate_point",
    "result_metrics",
    "point_key",
    "series_label",
    "atomic_write_text",
    "OOM_PREFIX",
    "INTERNAL_PREFIX",
]
