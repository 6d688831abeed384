"""Connected components of the flows in flight, kept up to date as flows start and end.

Two entities (phases in flight, :mod:`.flow`) are connected when they load a common link
class; max-min rates only couple entities of one component, so a start or an end changes
the rates of its component alone. Instead of walking the entities and their classes in
Python on every recomputation, the components are maintained as entities come and go:

* per link class, how many entities load it (``occupancy``) and the component that owns it
  (``owner``, -1 if none), in arrays indexed by class: an entity usually loads a handful of
  classes (a plain list of them: indexing a few elements from Python is several times
  cheaper than numpy calls, and a run without symmetry starts and ends ~170,000 entities),
  but one standing for a whole pipeline stage of copies loads thousands (an array of them:
  one array operation each);
* a start looks up the owners of its classes: none, and it is a component of its own;
  otherwise the components found are merged, the smaller relabelled into the larger (each
  entity changes component O(log n) times over a run);
* an end frees the classes only it loaded and marks its component as possibly split; the
  split is resolved lazily (:meth:`Components.settle`) by label propagation over the
  component's class incidence (numpy), once per batch of starts and ends of one instant.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

__all__ = ["Components"]


class Components:
    """Components of entities linked by shared link classes (``n_classes`` classes)."""

    def __init__(self, n_classes: int) -> None:
        self._occupancy = np.zeros(n_classes, dtype=np.int64)
        self._owner = np.full(n_classes, -1, dtype=np.int64)
        self.members: dict[int, set[int]] = {}  # component -> its entities
        self.classes_of: dict[int, list[int] | np.ndarray] = {}  # entity -> the classes it loads
        self._split: set[int] = set()  # components an entity left since they were last settled
        self._next = 0
        self._spot = np.zeros(n_classes, dtype=np.int64)  # settle's scratch: class -> a place it occurs

    @property
    def occupancy(self) -> np.ndarray:
        """Entities loading each class."""
        return self._occupancy.copy()

    @property
    def owner(self) -> np.ndarray:
        """The component owning each class (-1: none)."""
        return self._owner.copy()

    def add(self, entity: int, classes: Iterable[int] | np.ndarray) -> None:
        """``entity`` starts loading ``classes`` (at least one, no class twice; a list is kept as
        given, an int64 array is worked on by array operations)."""
        loaded: list[int] | np.ndarray
        if isinstance(classes, (list, np.ndarray)):
            loaded = classes  # kept, never changed
        else:
            loaded = list(classes)
        self.classes_of[entity] = loaded
        owner = self._owner
        found: list[int]
        if isinstance(loaded, np.ndarray):
            owners = owner[loaded]
            found = np.unique(owners[owners >= 0]).tolist()
        else:
            found = []
            for c in loaded:
                o = int(owner[c])
                if o >= 0 and o not in found:
                    found.append(o)
        if not found:
            target = self._new({entity})
        else:
            target = found[0]
            if len(found) > 1:
                ids = sorted(found)
                target = max(ids, key=lambda c: (len(self.members[c]), -c))  # the largest absorbs the rest
                for other in ids:
                    if other != target:
                        self._merge(other, target)
            self.members[target].add(entity)
        if isinstance(loaded, np.ndarray):
            self._occupancy[loaded] += 1
            owner[loaded] = target
        else:
            occupancy = self._occupancy
            for c in loaded:
                occupancy[c] += 1
                owner[c] = target

    def remove(self, entity: int) -> tuple[int | None, bool]:
        """``entity`` ends: the component it leaves behind (None if it was the last one) and
        whether it shared a class with an entity still in flight."""
        classes = self.classes_of.pop(entity)
        owner, occupancy = self._owner, self._occupancy
        comp = int(owner[classes[0]])
        shared = False
        if isinstance(classes, np.ndarray):
            left = occupancy[classes] - 1
            occupancy[classes] = left
            shared = bool(left.any())
            owner[classes[left == 0]] = -1
        else:
            for c in classes:
                n = occupancy[c] - 1
                occupancy[c] = n
                if n:
                    shared = True
                else:
                    owner[c] = -1
        members = self.members[comp]
        members.discard(entity)
        if not members:
            del self.members[comp]
            self._split.discard(comp)
            return None, False
        self._split.add(comp)
        return comp, shared

    def of(self, entity: int) -> int:
        """The component of an entity in flight."""
        return int(self._owner[self.classes_of[entity][0]])

    def settle(self, comp: int) -> list[int]:
        """The components ``comp`` is made of now (itself, or its pieces if an end split it)."""
        if comp not in self._split:
            return [comp]
        self._split.discard(comp)
        ids = sorted(self.members[comp])
        if len(ids) == 1:
            return [comp]
        lists = [self.classes_of[i] for i in ids]
        rows = np.repeat(np.arange(len(ids)), [len(a) for a in lists])
        if any(isinstance(a, np.ndarray) for a in lists):  # thousands of classes: no sort
            flat = np.concatenate(lists)  # each class named by the last place it occurs (the labels
            spot = self._spot  # depend only on which entities share a class)
            spot[flat] = np.arange(len(flat))
            col = spot[flat]
        else:  # a few: numbered densely
            _, col = np.unique(np.array([c for a in lists for c in a]), return_inverse=True)
        label = np.arange(len(ids))
        n_cols = int(col.max()) + 1
        while True:  # each entity takes the smallest label reachable through one shared class
            by_class = np.full(n_cols, len(ids))
            np.minimum.at(by_class, col, label[rows])
            new = label.copy()
            np.minimum.at(new, rows, by_class[col])
            new = new[new]  # jump: a label's own label is at most as large
            if np.array_equal(new, label):
                break
            label = new
        roots = np.unique(label).tolist()
        if len(roots) == 1:
            return [comp]
        pieces = [comp]
        keep = roots[0]
        self.members[comp] = {ids[i] for i in np.flatnonzero(label == keep).tolist()}
        for root in roots[1:]:
            part = [ids[i] for i in np.flatnonzero(label == root).tolist()]
            piece = self._new(set(part))
            self._relabel(part, piece)
            pieces.append(piece)
        return pieces

    # -- internals ---------------------------------------------------------------------------

    def _new(self, members: set[int]) -> int:
        comp = self._next
        self._next += 1
        self.members[comp] = members
        return comp

    def _relabel(self, entities: Iterable[int], comp: int) -> None:
        owner, classes_of = self._owner, self.classes_of
        for e in entities:
            classes = classes_of[e]
            if isinstance(classes, np.ndarray):
                owner[classes] = comp
            else:
                for c in classes:
                    owner[c] = comp

    def _merge(self, source: int, target: int) -> None:
        moved = self.members.pop(source)
        self._relabel(moved, target)
        self.members[target] |= moved
        if source in self._split:
            self._split.discard(source)
            self._split.add(target)
