"""The snapshot history: profiles over it equal the sums of every flush's increases (rows of
processes gone since included), at a bucket's resolution past the last minute, in memory that
stays the same however many flushes went by."""

from __future__ import annotations

import itertools
from dataclasses import replace
from types import MappingProxyType

import pytest

from offcpu_exporter.formats.profile import Profile
from offcpu_exporter.history import History
from offcpu_exporter.snapshot import (
    ZERO,
    Blocked,
    Counter,
    Frame,
    Health,
    ProcessInfo,
    ProcessKey,
    ProcessView,
    Reason,
    Snapshot,
    Stack,
    StackSample,
    Waker,
    WakerKind,
)

SECOND = 1_000_000_000
INTERVAL = 5 * SECOND
PROCESSES = 12
EXITS_AT = 250  # process 0 is gone from the flushes after this one
REASONS = (Reason.SLEEPING, Reason.UNINTERRUPTIBLE)

_Row = tuple[int, Reason, str]  # pid, reason, leaf function


def _flushes(count: int) -> tuple[list[Snapshot], list[dict[_Row, Counter]]]:
    """Flush n (n >= 1) ends at n * 5 s; a row grows in two flushes of three, by an amount of its
    own; Stack objects are reused flush after flush, as the aggregator hands them out."""
    stacks = {(p, r): Stack(user=(Frame(f"wait_{p}_{r.name}"), Frame("main")), kernel=())
              for p in range(PROCESSES) for r in REASONS}
    totals: dict[tuple[int, Reason], Counter] = {}
    flushes, increases = [], []
    for n in range(1, count + 1):
        samples, views, grew = [], {}, {}
        for p in range(PROCESSES):
            if p == 0 and n > EXITS_AT:
                continue
            key = ProcessKey(100 + p, 7 + p)
            for r in REASONS:
                inc = Counter(1, 1_000 * (n + p) + r) if (n + p + r) % 3 else ZERO
                total = totals[(p, r)] = totals.get((p, r), ZERO) + inc
                samples.append(StackSample(key, 0, "", r, stacks[(p, r)], total, inc))
                if inc:
                    grew[(key.pid, r, stacks[(p, r)].user[0].name)] = inc
            views[key] = ProcessView(ProcessInfo(key, f"app{p}"), ZERO, MappingProxyType({}), histogram=(1, 2, 3),
                                     blocked=MappingProxyType({Reason.SLEEPING: Blocked(1, n)}))
        t = 1_000 * SECOND + n * INTERVAL
        flushes.append(Snapshot(n, t, t - INTERVAL, 1_000 * SECOND, MappingProxyType(views), tuple(samples), Health()))
        increases.append(grew)
    return flushes, increases


def _values(profile: Profile) -> dict[_Row, Counter]:
    out: dict[_Row, Counter] = {}
    for s in profile.samples:
        row = (s.process.pid, s.reason, s.stack.user[0].name)
        out[row] = out.get(row, ZERO) + s.value
    return out


def _expected(increases: list[dict[_Row, Counter]], after: int, through: int) -> dict[_Row, Counter]:
    """Every flush's increase from flush `after` (excluded) through flush `through`."""
    out: dict[_Row, Counter] = {}
    for grew in increases[after:through]:
        for row, inc in grew.items():
            out[row] = out.get(row, ZERO) + inc
    return out


@pytest.mark.parametrize("minutes", [0.5, 1, 5, 15, 30])
def test_a_profile_over_the_history_sums_every_flush_in_it(minutes: float) -> None:
    flushes, increases = _flushes(300)  # 25 minutes
    history = History(900.0, exact_seconds=60.0, bucket_seconds=60.0)
    for snapshot in flushes:
        history.add(snapshot)
    last = flushes[-1]
    entries = history.since(last.time_ns - int(minutes * 60 * SECOND))
    profile = Profile.over(entries)
    first = entries[0].sequence  # its own increase is before the profile
    assert _values(profile) == _expected(increases, first, last.sequence)
    assert (profile.start_ns, profile.end_ns) == (flushes[first - 1].time_ns, last.time_ns)
    # As far back as asked, give or take one bucket; no further back than the history keeps.
    asked = min(minutes, 15) * 60 * SECOND
    assert asked - 60 * SECOND - INTERVAL <= profile.duration_ns <= asked
    if minutes >= 5:  # process 0 exited 50 flushes (250 s) before the end: its rows still count
        assert any(pid == 100 for pid, _, _ in _values(profile))
        assert profile.processes[ProcessKey(100, 7)].comm == "app0"


def test_its_memory_stays_the_same_however_many_flushes_went_by() -> None:
    flushes, _ = _flushes(600)
    history = History(900.0, exact_seconds=60.0, bucket_seconds=60.0)
    held = []
    for snapshot in flushes:
        history.add(snapshot)
        if snapshot.sequence in (450, 600):  # (process 0 gone from both)
            entries = history.since(0)
            held.append((len(entries), sum(len(e.samples) for e in entries)))
    # 15 one-minute buckets (and the one being filled) beside the last minute's 12 flushes.
    assert held[0] == held[1]
    assert held[0][0] <= 16 + 12
    assert held[0][1] <= (16 + 12) * PROCESSES * len(REASONS)


def test_a_flush_is_kept_as_its_changes_and_the_names_of_who_changed() -> None:
    flushes, _ = _flushes(3)
    history = History(900.0)
    history.add(flushes[0])
    (entry,) = history.since(0)
    assert entry.sequence == 1 and entry.samples == tuple(flushes[0].changed())
    assert {s.process for s in entry.samples} == set(entry.processes)
    for view in entry.processes.values():
        assert view.info.comm.startswith("app")
        assert view.histogram == () and not view.blocked  # what only the newest snapshot shows


def test_entries_are_consecutive_across_buckets() -> None:
    flushes, _ = _flushes(100)
    history = History(900.0, exact_seconds=60.0, bucket_seconds=60.0)
    for snapshot in flushes:
        history.add(snapshot)
    entries = history.since(0)
    assert entries[0].merged_from == 1
    for a, b in itertools.pairwise(entries):
        assert (b.merged_from or b.sequence) == a.sequence + 1
        assert b.interval_start_ns == a.time_ns


def test_a_bucket_keeps_the_rows_of_one_stack_apart_by_waker() -> None:
    """With --wakers on a stack has a row per waker: merged into a bucket they stay apart."""
    writer = Waker(WakerKind.TASK, 9, 10, "writer", (Frame("writer_write"),), ())
    timer = Waker(WakerKind.TIMER, 0, 0, "", (), (Frame("hrtimer_wakeup"),))
    flushes, _ = _flushes(200)
    history = History(900.0, exact_seconds=60.0, bucket_seconds=60.0)
    for snapshot in flushes:
        samples = tuple(w for s in snapshot.samples for w in (replace(s, waker=writer), replace(s, waker=timer)))
        history.add(replace(snapshot, samples=samples))
    merged = history.since(0)[0]  # a bucket of many flushes
    assert merged.merged_from and merged.sequence > merged.merged_from
    by_waker: dict[Waker | None, Counter] = {}
    for s in merged.samples:
        by_waker[s.waker] = by_waker.get(s.waker, ZERO) + s.increase
    assert set(by_waker) == {writer, timer} and by_waker[writer] == by_waker[timer] != ZERO
