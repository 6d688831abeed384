"""Clusters kept across the points of a sweep or search that share one.

Building a cluster's graph, routing its flows and planning its collectives depend only on
the cluster spec, the catalog it was built from and the routing seed; a sweep over batch
sizes or a layout search simulates many points on one cluster. :func:`cluster_setup` keeps
the last :data:`CACHE_SIZE` clusters of this process, at most :data:`CACHE_GPUS` GPUs in
all (least recently used first out), with
everything derived from them that does not depend on the point:

* the :class:`~simulator.cluster.graph.ClusterGraph` (built once; above
  :data:`REPLICATE_ABOVE_NODES` nodes with its identical node interiors held once,
  :mod:`simulator.cluster.links`),
* its :class:`~simulator.cluster.routing.Router` (every route computed, cached inside),
* its :class:`~simulator.cluster.collectives.CollectivePlanner` (ring orders and the
  collective plan of every (op, algorithm, group) asked for, cached inside),
* ``derived``: what later stages build from the cluster alone, keyed by the stage (the
  engine's link classes per symmetry block, :func:`simulator.run.simulate`).

Everything kept is deterministic in its key and never changed by a run (plans, routes and
link classes are immutable once built), so a cached setup gives bit-identical results to a
fresh one (``tests/test_cluster_cache.py``). The cost is memory: a 16,384-GPU cluster's
graph (its fabric; node interiors are held once) and routes hold 100-200 MB, hence the small bounds;
:func:`clear_cluster_cache` empties it.
"""

from __future__ import annotations

import gc
import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from simulator.catalog import Catalog
from simulator.cluster.builders import build_cluster, check_cluster_limits
from simulator.cluster.collectives import CollectivePlanner
from simulator.cluster.graph import ClusterGraph
from simulator.cluster.routing import Router
from simulator.scenario.spec import ClusterSpec

__all__ = ["ClusterSetup", "cluster_setup", "clear_cluster_cache", "CACHE_SIZE", "CACHE_GPUS", "REPLICATE_ABOVE_NODES"]

# clusters kept per process (each with its routes, plans and link classes), and the GPUs they
# may hold together (the newest is kept whatever its size): a kept 16,384-GPU cluster holds
# about 100-200 MB (Llama-3 405B on 16,384 H100: peak RSS +163 MB for a fresh simulate, +225 MB
# before node interiors were held once)
CACHE_SIZE = 4
CACHE_GPUS = 32_768
# above this many nodes, identical node interiors are held once and derived on demand
# (:meth:`ClusterGraph.replicate_nodes`: building stops growing with the nodes); up to it
# every node is copied (a few milliseconds), and links are read from a plain list
REPLICATE_ABOVE_NODES = 16


@dataclass
class ClusterSetup:
    """A built cluster with its router and collective planner (both cache what they compute)."""

    graph: ClusterGraph
    router: Router
    planner: CollectivePlanner
    derived: dict[Hashable, Any] = field(default_factory=dict)


_CACHE: OrderedDict[tuple[ClusterSpec, Catalog, int], ClusterSetup] = OrderedDict()
_LOCK = threading.Lock()


def new_setup(spec: ClusterSpec, catalog: Catalog, seed: int) -> ClusterSetup:
    """A fresh setup, not cached.

    A built graph is long-lived (kept here for the next runs) and large (a 16,384-GPU
    one's fabric holds about 65,000 links; copied node interiors would add 120,000 more). The cyclic garbage collector would scan every
    one of them on its way to the oldest generation: at the first collection after the run
    (which pauses the collector, :func:`simulator.run.simulate`), and again in the middle
    one, about 0.15 s each at that size. ``gc.freeze()`` then ``gc.unfreeze()`` puts every
    object the collector tracks straight into the oldest generation without scanning
    (Python's gc module: unfreeze returns the frozen objects to the oldest generation);
    nothing is kept from collection: a full collection still scans them, and frees any
    garbage among them."""
    graph = build_cluster(spec, catalog, replicated=spec.n_nodes > REPLICATE_ABOVE_NODES)
    gc.freeze()
    gc.unfreeze()
    router = Router(graph, seed=seed)
    return ClusterSetup(graph, router, CollectivePlanner(graph, router))


def cluster_setup(spec: ClusterSpec, catalog: Catalog, seed: int = 0) -> ClusterSetup:
    """The setup of ``spec`` built with ``catalog`` and routed with ``seed``: the cached one
    when this process built it recently, else a new one (then kept)."""
    check_cluster_limits(spec)  # the limits in force now, for a kept cluster too
    key = (spec, catalog, seed)
    with _LOCK:
        found = _CACHE.get(key)
        if found is not None:
            _CACHE.move_to_end(key)
            return found
    setup = new_setup(spec, catalog, seed)  # outside the lock: a build can take a second
    with _LOCK:
        found = _CACHE.setdefault(key, setup)
        _CACHE.move_to_end(key)
        while len(_CACHE) > CACHE_SIZE or (len(_CACHE) > 1 and sum(k[0].world_size for k in _CACHE) > CACHE_GPUS):
            _CACHE.popitem(last=False)
    return found


def clear_cluster_cache() -> None:
    """Forget every kept cluster."""
    with _LOCK:
        _CACHE.clear()
