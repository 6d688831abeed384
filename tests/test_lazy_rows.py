"""LazyMemRow (a row whose memory changes are made when read) reads, compares, hashes,
pickles and replaces like the plain Row with the same fields."""

from __future__ import annotations

import dataclasses
import pickle

from simulator.results.rows import LazyMemRow, Row

CHANGES = ((0.0, 0.25), (8.0, -8.0), ("activations", "activations"))


def lazy() -> LazyMemRow:
    return LazyMemRow.at(3, "compute", "block0.fwd", "compute", 1.5, 2.0, None, CHANGES, None, None)


def test_changes_are_start_plus_offset() -> None:
    """start 1.5 s, offsets 0 and 0.25 s: changes at 1.5 s (+8 B) and 1.75 s (-8 B)."""
    assert lazy().mem == ((1.5, 8.0, "activations"), (1.75, -8.0, "activations"))


def test_equal_to_the_plain_row() -> None:
    plain = Row(3, "compute", "block0.fwd", "compute", 1.5, 2.0, None,
                ((1.5, 8.0, "activations"), (1.75, -8.0, "activations")))
    row = lazy()
    assert row == plain and plain == row and hash(row) == hash(plain)
    assert row != dataclasses.replace(plain, end_s=2.5)
    assert dataclasses.asdict(row) == dataclasses.asdict(plain)


def test_pickle_and_replace_give_plain_rows() -> None:
    row = lazy()
    back = pickle.loads(pickle.dumps(row))
    assert type(back) is Row and back == row
    moved = dataclasses.replace(row, name="block1.fwd")
    assert type(moved) is Row and moved.mem == row.mem and moved.name == "block1.fwd"
