"""The network model: transfers as flows sharing link bandwidth max-min fairly.

A communication operation runs as a sequence of *phases*; a phase is a set of flows that
progress together (a ring step waits for its slowest neighbour), so the engine treats it
as one entity: its heaviest flow moves ``bytes_per_flow`` bytes, and on each link (class)
it puts ``n`` flows' worth of load. Rates come from progressive filling (max-min fairness
per flow): all unfrozen entities raise their per-flow rate together until a link
saturates; entities on saturated links freeze. Rates are recomputed only when an entity
starts or ends, and only for the entities that share links with it (its connected
component); starts and ends at the same instant are batched into one recomputation.

``analytical`` mode gives every entity the rate it would have alone (no contention): the
closed-form alpha-beta time over its bottleneck link, which is also the test oracle.

Links are grouped into *classes*. Without symmetry reduction a class is one link. With it,
the links that identical replicas of the simulated ranks load identically (the same link
of every block of nodes; a tier of switch links) form one class whose load is the average
over its members: the simulated ranks' traffic stands in for all replicas' traffic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import simpy

__all__ = ["PhaseLoad", "Network", "END_OF_INSTANT"]

# simpy priority for work that must see every event of the current instant first
END_OF_INSTANT = 2
_TOL = 1e-9


@dataclass(frozen=True)
class PhaseLoad:
    """One phase of a transfer on link classes.

    ``classes``/``flows``: the link classes it crosses and how many of its flows (fractional
    under multipath spraying or symmetry averaging) cross each; ``bytes_per_flow``: bytes
    its heaviest flow moves (protocol overhead included); ``latency_s``: fixed time added
    after the bytes; ``rate_cap``: per-flow rate limit in bytes/s (TCP), ``inf`` if none.
    """

    classes: np.ndarray
    flows: np.ndarray
    bytes_per_flow: float
    latency_s: float
    rate_cap: float = float("inf")


@dataclass
class _Entity:
    id: int
    load: PhaseLoad
    remaining: float
    on_done: Callable[[], None]
    rate: float = 0.0
    last: float = 0.0
    version: int = 0
    started: float = 0.0


@dataclass
class Network:
    env: simpy.Environment
    capacity: np.ndarray  # bytes/s per link class
    mode: str = "flow"
    record_series: bool = False
    _entities: dict[int, _Entity] = field(default_factory=dict)
    _by_class: dict[int, set[int]] = field(default_factory=dict)
    _dirty: set[int] = field(default_factory=set)
    _pending: bool = False
    _next_id: int = 0
    bytes_carried: np.ndarray | None = None  # bytes per class (one representative link)
    series: list[tuple[float, np.ndarray, np.ndarray]] = field(default_factory=list)
    recomputations: int = 0
    entities_started: int = 0

    def __post_init__(self) -> None:
        self.bytes_carried = np.zeros(len(self.capacity))

    # -- public ----------------------------------------------------------------------------

    def transfer(self, phases: list[PhaseLoad], on_done: Callable[[], None]) -> None:
        """Run ``phases`` one after another, then call ``on_done``."""
        if not phases:
            self.env.schedule(_callback_event(self.env, on_done))
            return
        self._run_phase(phases, 0, on_done)

    def alone_time_s(self, load: PhaseLoad) -> float:
        """Time of one phase with the network to itself (bandwidth + latency)."""
        return load.bytes_per_flow / self._alone_rate(load) + load.latency_s if load.bytes_per_flow > 0 else load.latency_s

    # -- phases ----------------------------------------------------------------------------

    def _run_phase(self, phases: list[PhaseLoad], index: int, on_done: Callable[[], None]) -> None:
        load = phases[index]

        def finished() -> None:
            if index + 1 < len(phases):
                self._run_phase(phases, index + 1, on_done)
            else:
                on_done()

        def bytes_done() -> None:
            if load.latency_s > 0:
                timeout = self.env.timeout(load.latency_s)
                timeout.callbacks.append(lambda _e: finished())
            else:
                finished()

        if load.bytes_per_flow <= 0 or len(load.classes) == 0:
            bytes_done()
            return
        self.entities_started += 1
        entity = _Entity(self._next_id, load, load.bytes_per_flow, bytes_done, last=self.env.now, started=self.env.now)
        self._next_id += 1
        if self.mode == "analytical":
            entity.rate = self._alone_rate(load)
            self._account(entity, entity.remaining)
            timeout = self.env.timeout(entity.remaining / entity.rate)
            timeout.callbacks.append(lambda _e: bytes_done())
            return
        self._entities[entity.id] = entity
        for c in load.classes.tolist():
            self._by_class.setdefault(c, set()).add(entity.id)
        self._mark_dirty(entity.id)

    def _alone_rate(self, load: PhaseLoad) -> float:
        with np.errstate(divide="ignore"):
            rate = float(np.min(self.capacity[load.classes] / load.flows)) if len(load.classes) else float("inf")
        return min(rate, load.rate_cap)

    def _account(self, entity: _Entity, nbytes: float) -> None:
        assert self.bytes_carried is not None
        np.add.at(self.bytes_carried, entity.load.classes, entity.load.flows * nbytes)

    # -- max-min fair sharing ----------------------------------------------------------------

    def _mark_dirty(self, entity_id: int) -> None:
        self._dirty.add(entity_id)
        if not self._pending:
            self._pending = True
            event = simpy.Event(self.env)
            event._ok = True
            event._value = None
            event.callbacks.append(self._recompute)
            self.env.schedule(event, priority=END_OF_INSTANT)  # type: ignore[arg-type]

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

    def _recompute(self, _event: simpy.Event | None = None) -> None:
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
                self._account(e, moved)
            e.last = now
        rates = self._fill(entities)
        for e, rate in zip(entities, rates, strict=True):
            e.rate = rate
            e.version += 1
            self._schedule_end(e)
        if self.record_series:
            self._snapshot()

    def _fill(self, entities: list[_Entity]) -> list[float]:
        """Progressive filling: per-flow rates of ``entities`` (max-min fair)."""
        if len(entities) == 1:
            return [self._alone_rate(entities[0].load)]
        sizes = [len(e.load.classes) for e in entities]
        rows = np.repeat(np.arange(len(entities)), sizes)
        cls = np.concatenate([e.load.classes for e in entities])
        flows = np.concatenate([e.load.flows for e in entities])
        uniq, col = np.unique(cls, return_inverse=True)
        remaining = self.capacity[uniq].astype(float)
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
            saturated = (slope > 0) & (remaining <= _TOL * self.capacity[uniq])
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
        timeout = self.env.timeout(delay)
        timeout.callbacks.append(lambda _e: self._maybe_finish(entity, version))

    def _maybe_finish(self, entity: _Entity, version: int) -> None:
        if entity.version != version or entity.id not in self._entities:
            return
        now = self.env.now
        moved = min(entity.rate * (now - entity.last), entity.remaining)
        self._account(entity, moved)
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
        load = np.zeros(len(self.capacity))
        for e in self._entities.values():
            np.add.at(load, e.load.classes, e.load.flows * e.rate)
        nz = np.nonzero(load)[0]
        self.series.append((self.env.now, nz, load[nz]))


def _callback_event(env: simpy.Environment, fn: Callable[[], None]) -> simpy.Event:
    event = simpy.Event(env)
    event._ok = True
    event._value = None
    event.callbacks.append(lambda _e: fn())
    return event
