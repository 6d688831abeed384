"""One sweep point, in a worker: simulate a scenario and flatten its result into scalar metrics.

Each point is one whole :func:`simulator.simulate` call in a worker (parallelism is across
scenarios, never inside one). The worker gets the scenario as a JSON mapping and returns a
flat record of scalar metrics (:func:`result_metrics`). A point the simulator rejects
(:class:`~simulator.errors.ScenarioError`) comes back with its message; a point whose peak
memory exceeds the device is kept with all its metrics and ``error = "out of memory: ..."``.
:func:`point_key` names a point's cache entry (:mod:`simulator.sweep.cache`).
"""

from __future__ import annotations

import hashlib
from typing import Any

from simulator import __version__
from simulator.datadirs import model_fingerprint
from simulator.errors import ScenarioError
from simulator.scenario import Scenario

__all__ = ["simulate_point", "result_metrics", "point_key", "OOM_PREFIX"]

OOM_PREFIX = "out of memory"


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
    (``<category>_bytes``) and ``memory_headroom_bytes`` (device memory minus peak); with a
    ``reliability`` section, the goodput of the whole run (``goodput_ettr``, ``goodput_wall_s``:
    expected time-to-train, ``goodput_cost_usd``, ... :func:`simulator.goodput.goodput_metrics`)."""
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
    if scenario.reliability is not None:  # a whole run with failures (simulator/goodput/)
        from simulator.goodput import goodput_metrics

        out.update(goodput_metrics(scenario, result))
    return out


def point_key(scenario: Scenario) -> str:
    """Cache key of a scenario: SHA-256 of its content hash, the simulator version and the
    fingerprint of the simulator's code and data (:func:`~simulator.datadirs.model_fingerprint`),
    so a changed model never reuses an old result."""
    key = f"{scenario.content_hash()}\n{__version__}\n{model_fingerprint()}"
    return hashlib.sha256(key.encode()).hexdigest()
