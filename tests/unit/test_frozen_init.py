"""quick_init: the same construction as the dataclass's own __init__, stores through the slots."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field
from typing import Any

import pytest

from offcpu_exporter.frozen_init import quick_init
from offcpu_exporter.snapshot import Counter, Frame, ProcessView, Stack


def _example() -> Any:
    @dataclass(frozen=True, slots=True)
    class Example:
        name: str
        size: int = 3
        items: list[int] = field(default_factory=list)
        derived: int = field(init=False, repr=False, compare=False)
        fixed: int = field(init=False, default=7)

        def __post_init__(self) -> None:
            object.__setattr__(self, "derived", len(self.name) + self.size)

    return Example


def test_the_same_values_as_the_dataclass_init() -> None:
    plain, quick = _example(), quick_init(_example())
    calls: list[tuple[tuple[object, ...], dict[str, Any]]] = [
        (("ab",), {}), (("ab", 5), {}), ((), {"name": "x", "items": [1]}), (("y",), {"size": 0})]
    for args, kwargs in calls:
        a, b = plain(*args, **kwargs), quick(*args, **kwargs)
        assert [getattr(a, f.name) for f in dataclasses.fields(a)] == \
            [getattr(b, f.name) for f in dataclasses.fields(b)]
    assert str(inspect.signature(plain)).split(",")[:2] == str(inspect.signature(quick)).split(",")[:2]


def test_factories_give_each_object_its_own_value_and_frozen_stays_frozen() -> None:
    quick = quick_init(_example())
    a, b = quick("a"), quick("b")
    assert a.items == [] and a.items is not b.items
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.size = 4
    with pytest.raises(TypeError):
        quick()
    assert dataclasses.replace(a, size=9).derived == 10


def test_refuses_classes_it_cannot_speed_up() -> None:
    @dataclass
    class Mutable:
        x: int

    with pytest.raises(TypeError):
        quick_init(Mutable)


def test_snapshot_values_hash_and_compare_as_before() -> None:
    assert Counter(1, 2) + Counter(3, 4) == Counter(4, 6)
    assert hash(Frame("f")) == hash(Frame("f")) and Stack((Frame("f"),), ()) == Stack((Frame("f"),), ())
    assert ProcessView(info=None, total=Counter(), by_reason={}).threads == {}  # type: ignore[arg-type]
