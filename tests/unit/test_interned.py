"""Interned: equal values handed out as one object, in a bounded table."""

from __future__ import annotations

from offcpu_exporter.interned import Interned
from offcpu_exporter.snapshot import Frame, Stack


def test_equal_values_are_one_object() -> None:
    table: Interned[Stack] = Interned()
    first = Stack((Frame("main", module="/bin/app", offset=16),), ())
    again = Stack((Frame("main", module="/bin/app", offset=16),), ())
    assert first is not again and table.one(first) is first and table.one(again) is first
    other = Stack((Frame("main", module="/bin/app", offset=32),), ())
    assert table.one(other) is other and len(table) == 2


def test_a_full_table_starts_again() -> None:
    table: Interned[tuple[int, ...]] = Interned(limit=2)
    a, b = (1, 2), (3, 4)
    table.one(a)
    table.one(b)
    c = (5, 6)
    assert table.one(c) is c and len(table) == 1
    assert table.one(tuple([1, 2])) == a  # equal, no longer the same object: still interchangeable
