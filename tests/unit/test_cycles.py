"""The cycle collector paced to the flush: what a flush leaves alive is out of collections, and a
cycle made between full collections is gone once `full_every` has passed."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from offcpu_exporter.cycles import CyclePacer


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycle() -> weakref.ref[_Node]:
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Iterator[_Clock]:
    thresholds = gc.get_threshold()
    yield _Clock()
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_what_a_flush_leaves_alive_is_left_out_of_collections(clock: _Clock) -> None:
    pacer = CyclePacer(full_every=600.0, clock=clock)
    garbage = _cycle()
    pacer.after_flush()
    assert gc.get_freeze_count() > 0
    gc.collect()
    assert garbage() is not None  # frozen: an ordinary collection does not look at it
    assert pacer.full_collections == 0


def test_a_cycle_outlives_no_more_than_full_every(clock: _Clock) -> None:
    pacer = CyclePacer(full_every=600.0, clock=clock)
    garbage = _cycle()
    pacer.after_flush()
    clock.now += 599.0
    pacer.after_flush()
    assert garbage() is not None
    clock.now += 1.0
    pacer.after_flush()
    assert garbage() is None
    assert pacer.full_collections == 1
    assert gc.get_freeze_count() > 0  # frozen again after the full collection


def test_close_gives_everything_back_to_the_collector(clock: _Clock) -> None:
    pacer = CyclePacer(full_every=600.0, clock=clock)
    garbage = _cycle()
    pacer.after_flush()
    pacer.close()
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert garbage() is None


def test_objects_dropped_while_frozen_are_still_freed(clock: _Clock) -> None:
    pacer = CyclePacer(full_every=600.0, clock=clock)
    snapshot = [_Node() for _ in range(10)]
    alive = weakref.ref(snapshot[0])
    pacer.after_flush()
    del snapshot  # reference counting frees what a newer flush replaced; freezing does not hold it
    assert alive() is None


def test_no_collection_runs_during_a_flush(clock: _Clock) -> None:
    """What a flush builds survives every collection until it is frozen: none runs meanwhile, and
    the collector runs again after."""
    pacer = CyclePacer(full_every=600.0, clock=clock)
    pacer.before_flush()
    collections = [g["collections"] for g in gc.get_stats()]
    snapshot = [[i] for i in range(50_000)]
    assert [g["collections"] for g in gc.get_stats()] == collections
    pacer.after_flush()
    assert gc.isenabled()
    garbage = _cycle()
    [[i] for i in range(10_000)]  # enough allocations for a young collection
    gc.collect(0)
    assert garbage() is None
    del snapshot
    pacer.close()


def test_a_pacer_leaves_a_collector_that_was_off_off(clock: _Clock) -> None:
    gc.disable()
    try:
        pacer = CyclePacer(full_every=600.0, clock=clock)
        pacer.before_flush()
        pacer.after_flush()
        assert not gc.isenabled()
        pacer.close()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_oldest_generation_is_collected_only_by_the_pacer(clock: _Clock) -> None:
    """A flush's survivors (its snapshot: views, samples, counters) reach the oldest generation;
    however many there are beside the last full collection's, the collector leaves it alone."""
    thresholds = gc.get_threshold()
    pacer = CyclePacer(full_every=600.0, clock=clock)
    gc.collect()
    pacer.after_flush()
    oldest, younger = gc.get_stats()[2]["collections"], gc.get_stats()[1]["collections"]
    # More survivors than all the objects the full collection above counted: a quarter of those
    # would have started an oldest-generation collection.
    snapshot = [[i] for i in range(max(200_000, len(gc.get_objects())))]
    assert gc.get_stats()[2]["collections"] == oldest
    assert gc.get_stats()[1]["collections"] > younger  # the younger generations as usual
    del snapshot
    pacer.close()
    assert gc.get_threshold() == thresholds
