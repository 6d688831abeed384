"""Connected components of the flows in flight, kept up to date as flows start and end.

Two entities (phases in flight, :mod:`.flow`) are connected when they load a common link
class; max-min rates only couple entities of one component, so a start or an end changes
the rates of its component alone. Instead of walking the entities and their classes in
Python on every recomputation, the components are maintained as entities come and go:

* per link class, how many entities load it (``occupancy``) and the component that owns it
  (``owner``, -1 if none): numpy arrays indexed by class;
* a start looks up the owners of its classes (one vectorised lookup): none, and it is a
  component of its own; otherwise the components found are merged, the smaller relabelled
  into the larger (each entity changes component O(log n) times over a run);
* an end frees the classes only it loaded and marks its component as possibly split; the
  split is resolved lazily (:meth:`Components.settle`) by label propagation over the
  component's class incidence, once per batch of starts and ends of one instant.
"""

from __future__ import annotations

import numpy as np

__all__ = ["Components"]


class Components:
    """Components of entities linked by shared link classes (``n_classes`` classes)."""

    def __init__(self, n_classes: int) -> None:
        self.occupancy = np.zeros(n_classes, dtype=np.int64)
        self.owner = np.full(n_classes, -1, dtype=np.int64)
        self.members: dict[int, set[int]] = {}  # component -> its entities
        self.classes_of: dict[int, np.ndarray] = {}  # entity -> the classes it loads
        self._split: set[int] = set()  # components an entity left since they were last settled
        self._next = 0

    def add(self, entity: int, classes: np.ndarray) -> None:
        """``entity`` starts loading ``classes`` (at least one, no class twice)."""
        self.classes_of[entity] = classes
        found = self.owner[classes]
        found = found[found >= 0]
        if not len(found):
            target = self._new({entity})
        elif (found == found[0]).all():
            target = int(found[0])
            self.members[target].add(entity)
        else:
            ids = np.unique(found).tolist()
            target = max(ids, key=lambda c: (len(self.members[c]), -c))  # the largest absorbs the rest
            for other in ids:
                if other != target:
                    self._merge(other, target)
            self.members[target].add(entity)
        self.occupancy[classes] += 1
        self.owner[classes] = target

    def remove(self, entity: int) -> tuple[int | None, bool]:
        """``entity`` ends: the component it leaves behind (None if it was the last one) and
        whether it shared a class with an entity still in flight."""
        classes = self.classes_of.pop(entity)
        comp = int(self.owner[classes[0]])
        self.occupancy[classes] -= 1
        left = self.occupancy[classes]
        self.owner[classes[left == 0]] = -1
        members = self.members[comp]
        members.discard(entity)
        if not members:
            del self.members[comp]
            self._split.discard(comp)
            return None, False
        self._split.add(comp)
        return comp, bool((left > 0).any())

    def of(self, entity: int) -> int:
        """The component of an entity in flight."""
        return int(self.owner[self.classes_of[entity][0]])

    def settle(self, comp: int) -> list[int]:
        """The components ``comp`` is made of now (itself, or its pieces if an end split it)."""
        if comp not in self._split:
            return [comp]
        self._split.discard(comp)
        ids = sorted(self.members[comp])
        if len(ids) == 1:
            return [comp]
        arrays = [self.classes_of[i] for i in ids]
        rows = np.repeat(np.arange(len(ids)), [len(a) for a in arrays])
        _, col = np.unique(np.concatenate(arrays), return_inverse=True)
        label = np.arange(len(ids))
        while True:  # each entity takes the smallest label reachable through one shared class
            by_class = np.full(int(col.max()) + 1, len(ids))
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
            self.owner[np.concatenate([self.classes_of[i] for i in part])] = piece
            pieces.append(piece)
        return pieces

    # -- internals ---------------------------------------------------------------------------

    def _new(self, members: set[int]) -> int:
        comp = self._next
        self._next += 1
        self.members[comp] = members
        return comp

    def _merge(self, source: int, target: int) -> None:
        moved = self.members.pop(source)
        self.owner[np.concatenate([self.classes_of[i] for i in moved])] = target
        self.members[target] |= moved
        if source in self._split:
            self._split.discard(source)
            self._split.add(target)
