"""What the engine core asks of a network model, and the phase sequencing models share.

Interface (:class:`NetworkModel`): the engine core calls ``transfer(resolved, on_done)``
when a communication task starts and expects ``on_done()`` once it has ended; results read
the counters ``bytes_carried`` (bytes per link class), ``series`` (link load samples),
``entities_started`` and ``recomputations``. A model is built by a :class:`NetworkFactory`
from the simpy environment and the capacity of every link class, and registered by name
in :mod:`simulator.engine.network.registry`.

:class:`PhasedNetwork` is the common base of models that run a transfer's folded phases
(:class:`~simulator.engine.lowering.PhaseLoad`) one after another: each phase moves its
bytes (how fast is the subclass's business), then waits its fixed latency.

Only public simpy API is used: ``env.timeout`` with callbacks, and ``env.peek`` to run
work after every other event of the current instant (:func:`at_end_of_instant`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Protocol

import numpy as np
import simpy

from simulator.engine.lowering import PhaseLoad, Resolved

__all__ = ["NetworkModel", "NetworkFactory", "PhasedNetwork", "Series", "call_soon", "at_end_of_instant"]

# link load samples: (time_s, class indices, load in bytes/s on one link of each class)
Series = list[tuple[float, np.ndarray, np.ndarray]]

# a load crossing more classes than this is accounted by one array operation (base.account)
FEW_CLASSES = 16


class NetworkModel(Protocol):
    """A network model as the engine core and the results see it."""

    env: simpy.Environment
    series: Series
    entities_started: int
    recomputations: int

    @property
    def bytes_carried(self) -> np.ndarray:
        """Bytes per link class (one representative link); a plain attribute will do."""
        ...

    def transfer(self, comm: Resolved, on_done: Callable[[], None]) -> None:
        """Start moving ``comm`` now; call ``on_done()`` (from a simpy callback) when it ends."""
        ...


class NetworkFactory(Protocol):
    """Builds a model for one run: ``capacity_bytes_per_s`` per link class."""

    def __call__(self, env: simpy.Environment, capacity_bytes_per_s: np.ndarray, *,
                 record_series: bool = False) -> NetworkModel: ...


def call_soon(env: simpy.Environment, fn: Callable[[], None]) -> None:
    """Call ``fn`` at the current instant, after the events already scheduled for it."""
    env.timeout(0).callbacks.append(lambda _e: fn())


def at_end_of_instant(env: simpy.Environment, fn: Callable[[], None]) -> None:
    """Call ``fn`` once no other event is left at the current instant.

    A zero-delay timeout goes behind every event already scheduled for now; when it fires
    and ``env.peek()`` shows more events at this instant (scheduled meanwhile), it goes
    behind those again. So ``fn`` runs exactly when a lowest-priority event of this instant
    would, and the relative order of all other events is unchanged.
    """

    def check(_event: simpy.Event) -> None:
        if env.peek() == env.now:
            env.timeout(0).callbacks.append(check)
        else:
            fn()

    env.timeout(0).callbacks.append(check)


class PhasedNetwork(ABC):
    """Base of models that run folded phases in order; subclasses implement :meth:`move_bytes`."""

    def __init__(self, env: simpy.Environment, capacity_bytes_per_s: np.ndarray, *,
                 record_series: bool = False) -> None:
        self.env = env
        self.capacity_bytes_per_s = np.asarray(capacity_bytes_per_s, dtype=float)
        self.record_series = record_series
        self._carried = np.zeros(len(self.capacity_bytes_per_s))  # bytes per class
        # id(load) -> its classes and flows: plain lists for a few classes, else arrays
        self._shapes: dict[int, tuple[PhaseLoad, Any, Any]] = {}
        self.series: Series = []
        self.entities_started = 0
        self.recomputations = 0

    @property
    def bytes_carried(self) -> np.ndarray:
        """Bytes carried per link class (one representative link)."""
        return self._carried.copy()

    # -- public ----------------------------------------------------------------------------

    def transfer(self, comm: Resolved, on_done: Callable[[], None]) -> None:
        """Run ``comm``'s folded phases one after another, then call ``on_done``."""
        self.transfer_phases(comm.phases, on_done)

    def transfer_phases(self, phases: Sequence[PhaseLoad], on_done: Callable[[], None]) -> None:
        """Run ``phases`` one after another, then call ``on_done`` (at once if there are none)."""
        if not phases:
            call_soon(self.env, on_done)
            return
        self._run_phase(phases, 0, on_done)

    def alone_rate_bytes_per_s(self, load: PhaseLoad) -> float:
        """Per-flow rate of ``load`` with the network to itself: min over its classes of
        capacity / flows on the class, and the per-flow cap."""
        with np.errstate(divide="ignore"):
            rate = (float(np.min(self.capacity_bytes_per_s[load.classes] / load.flows))
                    if len(load.classes) else float("inf"))
        return min(rate, load.rate_cap)

    # -- for subclasses --------------------------------------------------------------------

    @abstractmethod
    def move_bytes(self, load: PhaseLoad, bytes_done: Callable[[], None]) -> None:
        """Move the bytes of ``load`` (which has some) and call ``bytes_done`` when moved:
        how fast is each model's business (flow: max-min sharing; analytical: alone)."""

    def account(self, load: PhaseLoad, nbytes: float) -> None:
        """Add ``nbytes`` moved by each of ``load``'s flows to the classes it crosses. Each class
        gets ``flow * nbytes`` added once (a load's classes are distinct), so a loop over a few
        classes and one array operation over many (a phase standing for a whole pipeline stage
        of copies crosses thousands) add the same doubles."""
        _, classes, flows = self._shape(load)
        carried = self._carried
        if isinstance(classes, list):
            for c, f in zip(classes, flows, strict=True):
                carried[c] += f * nbytes
        else:
            carried[classes] += flows * nbytes

    def _shape(self, load: PhaseLoad) -> tuple[PhaseLoad, Any, Any]:
        """``load``'s classes and flows, worked out once per load (the record keeps ``load``
        alive, so its id is not reused while it is cached): plain lists up to
        ``FEW_CLASSES`` classes (indexing a few array elements from Python is cheaper than an
        array operation), else arrays."""
        found = self._shapes.get(id(load))
        if found is None or found[0] is not load:
            classes = np.asarray(load.classes, dtype=np.int64)
            flows = np.asarray(load.flows, dtype=float)
            if len(classes) <= FEW_CLASSES:
                found = (load, classes.tolist(), flows.tolist())
            else:
                found = (load, classes, flows)
            self._shapes[id(load)] = found
        return found

    # -- phases ----------------------------------------------------------------------------

    def _run_phase(self, phases: Sequence[PhaseLoad], index: int, on_done: Callable[[], None]) -> None:
        load = phases[index]
        if load.bytes_per_flow <= 0 or len(load.classes) == 0:
            self._bytes_done(phases, index, on_done)
            return
        self.entities_started += 1
        self.move_bytes(load, partial(self._bytes_done, phases, index, on_done))

    def _bytes_done(self, phases: Sequence[PhaseLoad], index: int, on_done: Callable[[], None]) -> None:
        """Phase ``index`` has moved its bytes: its latency, then the next phase (or ``on_done``)."""
        latency = phases[index].latency_s
        if latency > 0:
            self.env.timeout(latency).callbacks.append(partial(self._phase_over, phases, index, on_done))
        else:
            self._phase_over(phases, index, on_done)

    def _phase_over(self, phases: Sequence[PhaseLoad], index: int, on_done: Callable[[], None],
                    _event: simpy.Event | None = None) -> None:
        if index + 1 < len(phases):
            self._run_phase(phases, index + 1, on_done)
        else:
            on_done()
