"""The flow solver as it was before issue 17 (a Python walk of the component on every
recomputation, water-filling per entity): the oracle the incremental, merged solver of
:mod:`simulator.engine.network.flow` is checked against (tests/test_flow_solver.py) and
timed against (bench/bench_solver.py). Not a network model of the simulator.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import simpy

from simulator.engine.lowering import PhaseLoad
from simulator.engine.network.base import PhasedNetwork, at_end_of_instant

__all__ = ["ReferenceFlowNetwork"]

_TOL = 1e-9  # relative: a link is saturated, a flow has finished


@dataclass
class _Entity:
    """A phase in progress: bytes left per flow, current per-flow rate (bytes/s) since ``last``."""

    id: int
    load: PhaseLoad
    remaining: float
    on_done: Callable[[], None]
    rate: float = 0.0
    last: float = 0.0
    version: int = 0
    started: float = 0.0


class ReferenceFlowNetwork(PhasedNetwork):
    """Max-min fair sharing of link-class capacity among the phases in flight."""

    def __init__(self, env: simpy.Environment, capacity_bytes_per_s: np.ndarray, *,
                 record_series: bool = False) -> None:
        super().__init__(env, capacity_bytes_per_s, record_series=record_series)
        self._entities: dict[int, _Entity] = {}
        self._by_class: dict[int, set[int]] = {}
        self._dirty: set[int] = set()
        self._pending = False
        self._next_id = 0

    def move_bytes(self, load: PhaseLoad, bytes_done: Callable[[], None]) -> None:
        now = self.env.now
        entity = _Entity(self._next_id, load, load.bytes_per_flow, bytes_done, last=now, started=now)
        self._next_id += 1
        self._entities[entity.id] = entity
        for c in load.classes.tolist():
            self._by_class.setdefault(c, set()).add(entity.id)
        self._mark_dirty(entity.id)

    # -- max-min fair sharing ----------------------------------------------------------------

    def _mark_dirty(self, entity_id: int) -> None:
        self._dirty.add(entity_id)
        if not self._pending:
            self._pending = True
            at_end_of_instant(self.env, self._recompute)

    def _component(self, seeds: set[int]) -> list[int]:
        """Active entities connected to ``seeds`` through shared link classes."""
        seen = {e for e in seeds if e in self._entities}
        stack = list(seen)
        done_classes: set[int] = set()
        while stack:
            entity = self._entities[stack.pop()]
            for c in entity.load.classes.tolist():
                if c in done_classes:
                    continue
                done_classes.add(c)
                for other in self._by_class.get(c, ()):
                    if other not in seen:
                        seen.add(other)
                        stack.append(other)
        return sorted(seen)

    def _recompute(self) -> None:
        self._pending = False
        seeds, self._dirty = self._dirty, set()
        now = self.env.now
        # finished entities left their classes: their neighbours are the seeds
        ids = self._component(seeds)
        if not ids:
            return
        self.recomputations += 1
        entities = [self._entities[i] for i in ids]
        for e in entities:  # bring progress up to now at the old rates
            moved = e.rate * (now - e.last)
            if moved:
                moved = min(moved, e.remaining)
                e.remaining -= moved
                self.account(e.load, moved)
            e.last = now
        rates = self._fill(entities)
        for e, rate in zip(entities, rates, strict=True):
            e.rate = rate
            e.version += 1
            self._schedule_end(e)
        if self.record_series:
            self._snapshot()

    def _fill(self, entities: list[_Entity]) -> list[float]:
        """Progressive filling: per-flow rates (bytes/s) of ``entities`` (max-min fair)."""
        if len(entities) == 1:
            return [self.alone_rate_bytes_per_s(entities[0].load)]
        capacity = self.capacity_bytes_per_s
        sizes = [len(e.load.classes) for e in entities]
        rows = np.repeat(np.arange(len(entities)), sizes)
        cls = np.concatenate([e.load.classes for e in entities])
        flows = np.concatenate([e.load.flows for e in entities])
        uniq, col = np.unique(cls, return_inverse=True)
        remaining = capacity[uniq].astype(float)
        caps = np.array([e.load.rate_cap for e in entities])
        rate = np.zeros(len(entities))
        frozen = np.zeros(len(entities), dtype=bool)
        level = 0.0
        while not frozen.all():
            active = ~frozen[rows]
            slope = np.bincount(col[active], weights=flows[active], minlength=len(uniq))
            with np.errstate(divide="ignore", invalid="ignore"):
                room = np.where(slope > 0, remaining / slope, np.inf)
            step = float(room.min())
            cap_step = float((caps[~frozen] - level).min())
            step = min(step, cap_step)
            if not np.isfinite(step):
                rate[~frozen] = np.inf
                break
            level += step
            remaining -= slope * step
            saturated = (slope > 0) & (remaining <= _TOL * capacity[uniq])
            hit = np.zeros(len(entities), dtype=bool)
            if saturated.any():
                hit[np.unique(rows[active & saturated[col]])] = True
            hit |= (~frozen) & np.isfinite(caps) & (caps - level <= _TOL * np.maximum(caps, 1.0))
            if not hit.any():  # numerical corner: freeze the tightest link's entities
                tight = np.argmin(np.where(slope > 0, remaining / slope, np.inf))
                hit[np.unique(rows[active & (col == tight)])] = True
            newly = hit & ~frozen
            rate[newly] = level
            frozen |= newly
        return rate.tolist()

    def _schedule_end(self, entity: _Entity) -> None:
        if entity.rate <= 0:
            return
        delay = entity.remaining / entity.rate if entity.remaining > _TOL * entity.load.bytes_per_flow else 0.0
        version = entity.version
        self.env.timeout(delay).callbacks.append(lambda _e: self._maybe_finish(entity, version))

    def _maybe_finish(self, entity: _Entity, version: int) -> None:
        if entity.version != version or entity.id not in self._entities:
            return
        now = self.env.now
        moved = min(entity.rate * (now - entity.last), entity.remaining)
        self.account(entity.load, moved)
        entity.remaining = 0.0
        entity.last = now
        del self._entities[entity.id]
        neighbours: set[int] = set()
        for c in entity.load.classes.tolist():
            members = self._by_class[c]
            members.discard(entity.id)
            neighbours |= members
            if not members:
                del self._by_class[c]
        for other in neighbours:
            self._mark_dirty(other)
        if self.record_series and not neighbours:
            self._snapshot()
        entity.on_done()

    def _snapshot(self) -> None:
        load = np.zeros(len(self.capacity_bytes_per_s))
        for e in self._entities.values():
            np.add.at(load, e.load.classes, e.load.flows * e.rate)
        nz = np.nonzero(load)[0]
        self.series.append((self.env.now, nz, load[nz]))
