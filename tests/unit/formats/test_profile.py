from __future__ import annotations

import re
from dataclasses import replace

import pytest

from offcpu_exporter.formats import Profile, ProfileFilter
from offcpu_exporter.snapshot import Counter, Reason, Snapshot
from testkit.snapshots import OTHER, WORKLOAD, WORKLOAD_LOCK, WORKLOAD_SLEEP, workload_snapshot


def values(profile: Profile) -> dict[tuple[int, int], Counter]:
    return {(s.process.pid, s.tid): s.value for s in profile.samples}


def test_between_differences_cumulative_totals(before: Snapshot, after: Snapshot) -> None:
    p = Profile.between(before, after)
    assert values(p) == {
        (4242, 4242): Counter(15, 1_500_000_000),
        (4242, 4243): Counter(4, 250_000_000),
        (4242, 4244): Counter(3, 1_234_567),
        (777, 779): Counter(2, 40_000_499),
    }
    assert p.start_ns == before.time_ns and p.end_ns == after.time_ns
    assert p.processes[WORKLOAD.key].comm == "offcpu_workload"
    assert p.total == Counter(24, 1_791_235_066)


def test_counter_reset_counts_the_new_total(before: Snapshot) -> None:
    restarted = workload_snapshot(
        9, [(WORKLOAD, 4242, "w", Reason.SLEEPING, WORKLOAD_SLEEP, Counter(2, 100), Counter(2, 100))]
    )
    assert values(Profile.between(before, restarted)) == {(4242, 4242): Counter(2, 100)}


def test_over_sums_increases_and_keeps_vanished_rows(before: Snapshot, after: Snapshot) -> None:
    # A third snapshot in which the OTHER process exited and is gone.
    third = workload_snapshot(
        3,
        [(WORKLOAD, 4242, "w", Reason.SLEEPING, WORKLOAD_SLEEP, Counter(26, 2_600_000_000), Counter(1, 100_000_000))],
    )
    p = Profile.over([third, before, after])  # order does not matter
    v = values(p)
    assert v[(4242, 4242)] == Counter(16, 1_600_000_000)
    assert v[(777, 779)] == Counter(2, 40_000_499)  # kept although the last snapshot lacks it
    assert p.processes[OTHER.key].comm == OTHER.comm
    # With a gap in the sequence (a snapshot missing) totals are differenced instead.
    gap = replace(third, sequence=5)
    v = values(Profile.over([before, gap]))
    assert v == {(4242, 4242): Counter(16, 1_600_000_000)}


def test_over_one_snapshot_is_its_increase(after: Snapshot) -> None:
    p = Profile.over([after])
    assert p.start_ns == after.interval_start_ns
    assert values(p)[(4242, 4243)] == Counter(4, 250_000_000)
    with pytest.raises(ValueError):
        Profile.over([])


def test_filters(before: Snapshot, after: Snapshot) -> None:
    by_pid = Profile.between(before, after, ProfileFilter(pids=frozenset({777})))
    assert {s.process.pid for s in by_pid.samples} == {777}
    by_comm = Profile.between(before, after, ProfileFilter(comm=re.compile("work")))
    assert {s.process.pid for s in by_comm.samples} == {4242}
    neither = Profile.between(before, after, ProfileFilter(pids=frozenset({777}), comm=re.compile("^offcpu")))
    assert neither.samples == ()


def test_unknown_process_gets_a_placeholder_name(after: Snapshot) -> None:
    snap = replace(after, processes={})
    p = Profile.since_previous(snap)
    assert {i.comm for i in p.processes.values()} == {"[pid 4242]", "[pid 777]"}
    assert WORKLOAD_LOCK not in {s.stack for s in p.samples}  # no increase, not in the profile
