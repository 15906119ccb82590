"""The lookup tables shared by the pprof and OTLP profile encoders."""

from __future__ import annotations

from offcpu_exporter.formats.interning import Interner, StringTable


def test_string_table_starts_with_the_empty_string_and_writes_each_string_once() -> None:
    table: list[str] = []
    string = StringTable(table)
    assert [string("a"), string("b"), string("a"), string("")] == [1, 2, 1, 0]
    assert table == ["", "a", "b"]


def test_string_table_continues_a_table_that_has_its_empty_string() -> None:
    table = [""]
    assert StringTable(table)("x") == 1 and table == ["", "x"]


def test_interner_writes_each_key_once_and_a_write_may_intern_others() -> None:
    rows: list[tuple[str, int]] = []
    names: Interner[str] = Interner(first=1)
    locations: Interner[tuple[str, int]] = Interner(first=1)

    def write_name(name: str, index: int) -> None:
        rows.append((name, index))

    def write_location(key: tuple[str, int], index: int) -> None:
        rows.append((f"loc {key[0]}+{key[1]} -> name {names.index(key[0], write_name)}", index))

    assert locations.index(("f", 1), write_location) == 1
    assert locations.index(("g", 2), write_location) == 2
    assert locations.index(("f", 1), write_location) == 1
    assert rows == [("f", 1), ("loc f+1 -> name 1", 1), ("g", 2), ("loc g+2 -> name 2", 2)]
