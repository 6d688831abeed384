"""``flow``: transfers as flows sharing link bandwidth max-min fairly.

A communication operation runs as a sequence of *phases*; a phase is a set of flows that
progress together (a ring step waits for its slowest neighbour), so the model treats it
as one entity: its heaviest flow moves ``bytes_per_flow`` bytes, and on each link (class)
it puts ``flows`` flows' worth of load. Rates come from progressive filling (max-min
fairness per flow, Bertsekas & Gallager, *Data Networks*, 2nd ed. 1992, sec. 6.5): all unfrozen
entities raise their per-flow rate together until a link saturates; entities on saturated
links freeze. Rates are recomputed only when an entity starts or ends, and only for the
entities that share links with it (its connected component, kept up to date as entities
come and go: :mod:`.components`); starts and ends at the same instant are batched into one
recomputation at the end of the instant.

The filling runs over the component's link-class incidence with numpy, one row per *kind*
of entity: entities with the same classes, flows and rate cap get the same max-min rate
(the max-min fair allocation is unique and treats them symmetrically), so they are filled
as one row loading ``count`` times their flows, and all get its rate. Results equal the
solver this one replaced (tests/reference_flow.py) to float round-off (tests/test_flow_solver.py).

Links are grouped into classes (:class:`~simulator.engine.link_classes.LinkClasses`):
without symmetry reduction a class is one link; with it, a class stands for the links
that identical replicas of the simulated ranks load identically.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import simpy

from simulator.engine.lowering import PhaseLoad
from simulator.engine.network.base import FEW_CLASSES, PhasedNetwork, at_end_of_instant
from simulator.engine.network.components import Components

__all__ = ["FlowNetwork"]

_TOL = 1e-9  # relative: a link is saturated, a flow has finished


@dataclass(eq=False, slots=True)
class _Entity:
    """A phase in progress: bytes left per flow, current per-flow rate (bytes/s) since ``last``;
    ``kind``: entities of one kind load the same classes with the same flows and cap."""

    id: int
    load: PhaseLoad
    remaining: float
    on_done: Callable[[], None]
    kind: int
    rate: float = 0.0
    last: float = 0.0
    version: int = 0
    started: float = 0.0


class FlowNetwork(PhasedNetwork):
    """Max-min fair sharing of link-class capacity among the phases in flight."""

    def __init__(self, env: simpy.Environment, capacity_bytes_per_s: np.ndarray, *,
                 record_series: bool = False) -> None:
        super().__init__(env, capacity_bytes_per_s, record_series=record_series)
        self._entities: dict[int, _Entity] = {}
        self._components = Components(len(self.capacity_bytes_per_s))
        self._kinds: dict[tuple[bytes, bytes, float], tuple[int, list[int] | np.ndarray]] = {}
        self._kind_of: dict[int, tuple[PhaseLoad, int, list[int] | np.ndarray]] = {}  # id(load) -> (load, kind, distinct classes)
        self._alone: dict[int, float] = {}  # kind -> its per-flow rate alone
        self._filled: dict[tuple[tuple[int, ...], tuple[int, ...]], dict[int, float]] = {}  # (kinds, counts) -> rates
        self._dirty: set[int] = set()
        self._pending = False
        self._next_id = 0

    def move_bytes(self, load: PhaseLoad, bytes_done: Callable[[], None]) -> None:
        now = self.env.now
        found = self._kind_of.get(id(load))
        if found is None or found[0] is not load:
            found = self._kind_of[id(load)] = (load, *self._kind(load))
        _, kind, distinct = found
        entity = _Entity(self._next_id, load, load.bytes_per_flow, bytes_done, kind, last=now, started=now)
        self._next_id += 1
        self._entities[entity.id] = entity
        self._components.add(entity.id, distinct)
        self._mark_dirty(entity.id)

    def _kind(self, load: PhaseLoad) -> tuple[int, list[int] | np.ndarray]:
        """The kind of ``load`` (same classes, flows and cap: same kind) and its distinct classes
        (a list, or an int64 array beyond ``FEW_CLASSES``: :class:`Components` takes either)."""
        classes = np.asarray(load.classes)
        signature = (classes.tobytes(), np.asarray(load.flows, dtype=float).tobytes(), float(load.rate_cap))
        found = self._kinds.get(signature)
        if found is None:  # a new kind: its distinct classes, for the components
            distinct = np.unique(classes).astype(np.int64)
            found = self._kinds[signature] = (len(self._kinds),
                                              distinct.tolist() if len(distinct) <= FEW_CLASSES else distinct)
        return found

    # -- max-min fair sharing ----------------------------------------------------------------

    def _mark_dirty(self, entity_id: int) -> None:
        self._dirty.add(entity_id)
        if not self._pending:
            self._pending = True
            at_end_of_instant(self.env, self._recompute)

    def _component(self, seeds: set[int]) -> list[int]:
        """Active entities connected to ``seeds`` through shared link classes."""
        components = self._components
        comps = {components.of(e) for e in seeds if e in self._entities}
        ids: list[int] = []
        for comp in sorted(comps):
            for piece in components.settle(comp):
                ids.extend(components.members[piece])
        return sorted(ids)

    def _recompute(self) -> None:
        self._pending = False
        seeds, self._dirty = self._dirty, set()
        now = self.env.now
        # finished entities left their components: what is left of them is seeded
        ids = self._component(seeds)
        if not ids:
            return
        self.recomputations += 1
        entities = [self._entities[i] for i in ids]
        moved_by_kind: dict[int, tuple[PhaseLoad, float]] = {}
        for e in entities:  # bring progress up to now at the old rates
            moved = e.rate * (now - e.last)
            if moved:
                moved = min(moved, e.remaining)
                e.remaining -= moved
                load, total = moved_by_kind.get(e.kind, (e.load, 0.0))
                moved_by_kind[e.kind] = (load, total + moved)
            e.last = now
        for load, total in moved_by_kind.values():  # entities of a kind load the same classes
            self.account(load, total)
        rates = self._rates(entities)
        ends: dict[float, tuple[float, list[tuple[_Entity, int]]]] = {}  # end time -> (delay, entities)
        for e, rate in zip(entities, rates, strict=True):
            e.rate = rate
            e.version += 1
            if rate > 0:
                delay = self._delay(e)
                ends.setdefault(now + delay, (delay, []))[1].append((e, e.version))
        # one event per end time (simpy's now + delay): the entities' own events would sit one
        # after another in simpy's queue (made here in a row), so they end in the same order
        for delay, due in ends.values():
            self.env.timeout(delay).callbacks.append(partial(self._finish_due, due))
        if self.record_series:
            self._snapshot()

    def _rates(self, entities: list[_Entity]) -> list[float]:
        """Per-flow max-min rates (bytes/s) of ``entities``, one filling row per kind (in kind
        order). The rates depend only on the kinds and how many entities of each there are, and
        a run meets the same mixes again and again (every micro-batch, every layer), so each
        mix is filled once per run; an entity alone gets its kind's alone rate."""
        if len(entities) == 1:
            kind = entities[0].kind
            alone = self._alone.get(kind)
            if alone is None:
                alone = self._alone[kind] = self.alone_rate_bytes_per_s(entities[0].load)
            return [alone]
        first: dict[int, int] = {}
        counts: dict[int, int] = {}
        for i, e in enumerate(entities):
            if e.kind in counts:
                counts[e.kind] += 1
            else:
                counts[e.kind] = 1
                first[e.kind] = i
        kinds = sorted(counts)
        mix = (tuple(kinds), tuple([counts[k] for k in kinds]))
        by_kind = self._filled.get(mix)
        if by_kind is None:
            rates = self._fill([entities[first[k]].load for k in kinds], np.array(mix[1], dtype=float))
            by_kind = self._filled[mix] = dict(zip(kinds, rates.tolist(), strict=True))
        return [by_kind[e.kind] for e in entities]

    def _fill(self, loads: list[PhaseLoad], count: np.ndarray) -> np.ndarray:
        """Progressive filling: per-flow rates (bytes/s) of ``count[i]`` entities like ``loads[i]``."""
        capacity = self.capacity_bytes_per_s
        sizes = [len(load.classes) for load in loads]
        rows = np.repeat(np.arange(len(loads)), sizes)
        cls = np.concatenate([load.classes for load in loads])
        flows = np.concatenate([load.flows for load in loads]) * np.repeat(count, sizes)
        uniq, col = np.unique(cls, return_inverse=True)
        cap_of = capacity[uniq]
        remaining = cap_of.astype(float)
        caps = np.array([load.rate_cap for load in loads])
        rate = np.zeros(len(loads))
        frozen = np.zeros(len(loads), dtype=bool)
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
            saturated = (slope > 0) & (remaining <= _TOL * cap_of)
            hit = np.zeros(len(loads), dtype=bool)
            if saturated.any():
                hit[rows[active & saturated[col]]] = True
            hit |= (~frozen) & np.isfinite(caps) & (caps - level <= _TOL * np.maximum(caps, 1.0))
            if not hit.any():  # numerical corner: freeze the tightest link's entities
                tight = np.argmin(np.where(slope > 0, remaining / slope, np.inf))
                hit[rows[active & (col == tight)]] = True
            newly = hit & ~frozen
            rate[newly] = level
            frozen |= newly
        return rate

    @staticmethod
    def _delay(entity: _Entity) -> float:
        """Seconds until ``entity`` has moved its bytes at its current rate (> 0)."""
        return entity.remaining / entity.rate if entity.remaining > _TOL * entity.load.bytes_per_flow else 0.0

    def _finish_due(self, due: list[tuple[_Entity, int]], _event: simpy.Event) -> None:
        for entity, version in due:
            self._maybe_finish(entity, version)

    def _maybe_finish(self, entity: _Entity, version: int) -> None:
        if entity.version != version or entity.id not in self._entities:
            return
        now = self.env.now
        moved = min(entity.rate * (now - entity.last), entity.remaining)
        self.account(entity.load, moved)
        entity.remaining = 0.0
        entity.last = now
        del self._entities[entity.id]
        comp, shared = self._components.remove(entity.id)
        if comp is not None:  # what is left of its component gets new rates (any member stands for it)
            self._mark_dirty(next(iter(self._components.members[comp])))
        if self.record_series and not shared:
            self._snapshot()
        entity.on_done()

    def _snapshot(self) -> None:
        load = np.zeros(len(self.capacity_bytes_per_s))
        for e in self._entities.values():
            np.add.at(load, e.load.classes, e.load.flows * e.rate)
        nz = np.nonzero(load)[0]
        self.series.append((self.env.now, nz, load[nz]))
