"""The input of every profile encoder: off-CPU time per stack over one interval.

Snapshots carry cumulative totals since the exporter started plus the increase since the
previous snapshot. A `Profile` is what happened between two points in time, computed either as
the difference of cumulative totals of two snapshots (`Profile.between`) or, for a run of
consecutive snapshots, as the sum of their increases (`Profile.over`), which also keeps the time
of rows that vanished from the newer snapshot (an exited process, a stack folded away).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from offcpu_exporter.snapshot import Counter, ProcessInfo, ProcessKey, Reason, Snapshot, Stack, StackSample, Waker

__all__ = ["Accumulator", "Profile", "ProfileFilter", "ProfileSample"]


@dataclass(frozen=True, slots=True)
class ProfileSample:
    """Off-CPU time of one (process, thread, reason, stack) over the profile's interval."""

    process: ProcessInfo
    tid: int  # 0 when the exporter aggregates per process
    thread_name: str
    reason: Reason
    stack: Stack
    value: Counter
    waker: Waker | None = None  # with --wakers on: who woke these blocks


@dataclass(frozen=True, slots=True)
class ProfileFilter:
    """Which processes a profile keeps: any of `pids` (empty: all) and `comm` searched as a regex."""

    pids: frozenset[int] = frozenset()
    comm: re.Pattern[str] | None = None

    def keeps(self, process: ProcessInfo) -> bool:
        if self.pids and process.pid not in self.pids:
            return False
        return self.comm is None or self.comm.search(process.comm) is not None


_KEEP_ALL = ProfileFilter()

_RowKey = tuple[ProcessKey, int, Reason, int, Waker | None]  # the stack as an index, see _RowKeys


@dataclass(frozen=True, slots=True)
class Profile:
    start_ns: int  # wall clock, start of the interval
    end_ns: int  # wall clock, end of the interval
    samples: tuple[ProfileSample, ...]
    processes: Mapping[ProcessKey, ProcessInfo] = field(default_factory=lambda: MappingProxyType({}))
    # What the interval is, for titles: "last 5 minutes", "30 s profile", ...
    description: str = ""
    # Share of the interval's blocks whose stacks were captured, when captures were sampled (the
    # per-stack values are then estimates that sum to the exact per-thread totals); None: all were.
    stack_sampled_ratio: float | None = None

    @property
    def duration_ns(self) -> int:
        return max(0, self.end_ns - self.start_ns)

    @property
    def total(self) -> Counter:
        result = Counter()
        for s in self.samples:
            result += s.value
        return result

    def totals_by_process(self) -> dict[ProcessKey, Counter]:
        result: dict[ProcessKey, Counter] = {}
        for s in self.samples:
            key = s.process.key
            result[key] = result.get(key, Counter()) + s.value
        return result

    @staticmethod
    def between(before: Snapshot, after: Snapshot, keep: ProfileFilter = _KEEP_ALL, description: str = "") -> Profile:
        """The difference of cumulative totals from `before` to `after`.

        A row that `after` has and `before` lacks counts whole (it started inside the interval).
        A row whose total went down was reset (a new exporter or a recreated row): like a
        Prometheus counter reset, its whole new total counts."""
        keys = _RowKeys()
        previous = {keys(s): s.total for s in before.samples}
        rows = [(s, _growth(s.total, previous.get(keys(s)))) for s in after.samples]
        return _build(before.time_ns, after.time_ns, rows, _known((after, before)), keep, description,
                      _sampled_ratio(after, before))

    @staticmethod
    def over(snapshots: Sequence[Snapshot], keep: ProfileFilter = _KEEP_ALL, description: str = "") -> Profile:
        """What happened from the first snapshot to the last (the first one's own increase is
        before the interval): for consecutive snapshots (no sequence gap; a history bucket counts
        from its `merged_from`) the sum of every later snapshot's increase, including rows the last
        snapshot no longer has; with a gap, the difference of the first and the last only (whole
        snapshots then, not the history's)."""
        if not snapshots:
            raise ValueError("no snapshots")
        ordered = sorted(snapshots, key=lambda s: s.sequence)
        first, last = ordered[0], ordered[-1]
        if len(ordered) == 1:
            return Profile.since_previous(first, keep, description)
        if any((b.merged_from or b.sequence) != a.sequence + 1 for a, b in itertools.pairwise(ordered)):
            return Profile.between(first, last, keep, description)
        # Increases only: the history keeps the rows that changed, not every row's total.
        accumulator = Accumulator(keep)
        for snapshot in ordered[1:]:
            accumulator.add(snapshot)
        return accumulator.profile(description, since=first)

    @staticmethod
    def since_previous(snapshot: Snapshot, keep: ProfileFilter = _KEEP_ALL, description: str = "") -> Profile:
        """One snapshot's own increase (the interval from the flush before it)."""
        rows = [(s, s.increase) for s in snapshot.samples if s.increase]
        sampled = snapshot.health.stack_sampled_ratio if snapshot.health.stack_sampling else None
        return _build(snapshot.interval_start_ns, snapshot.time_ns, rows, _known((snapshot,)), keep, description,
                      sampled)

    @staticmethod
    def since_start(snapshot: Snapshot, keep: ProfileFilter = _KEEP_ALL, description: str = "") -> Profile:
        """Everything the exporter counted up to `snapshot`."""
        rows = [(s, s.total) for s in snapshot.samples if s.total]
        return _build(snapshot.start_time_ns, snapshot.time_ns, rows, _known((snapshot,)), keep, description,
                      _sampled_ratio(snapshot))


def _sampled_ratio(last: Snapshot, first: Snapshot | None = None) -> float | None:
    """The share of blocks whose stacks were captured from `first` to `last` (from the probe's
    start without `first`); None when captures were not sampled."""
    h = last.health
    if not h.stack_sampling:
        return None
    blocks, captures = h.blocks, h.stack_captures
    if first is not None:
        blocks -= first.health.blocks
        captures -= first.health.stack_captures
    return min(1.0, captures / blocks) if blocks > 0 else 1.0


def _growth(total: Counter, old: Counter | None) -> Counter:
    """How much a cumulative total grew since `old`; a total that went down was reset (a new
    exporter, a recreated row) and counts whole, as a Prometheus counter reset does."""
    if old is None or total.count < old.count or total.ns < old.ns:
        return total
    return total - old


def _stack_value(stack: Stack) -> tuple[tuple[str, str, str, int, str], ...]:
    return tuple(
        (f.name, f.kind.value, f.module, f.offset, f.build_id) for half in (stack.user, (), stack.kernel) for f in half
    )


class _RowKeys:
    """Row keys that cost a small tuple per lookup. Hashing a Stack hashes every Frame through
    dataclass and Enum __hash__ methods written in Python (tens of microseconds for a deep
    stack), and the aggregator hands out the same Stack objects snapshot after snapshot: each
    object is turned once into an index, through a tuple of plain values that hashes in C. The
    objects are kept alive here, so their ids stay unique."""

    def __init__(self) -> None:
        self.by_id: dict[int, int] = {}
        self._index: dict[tuple[tuple[str, str, str, int, str], ...], int] = {}
        self._alive: list[Stack] = []

    def index_of(self, stack: Stack) -> int:
        index = self.by_id.get(id(stack))
        if index is None:
            index = self._index.setdefault(_stack_value(stack), len(self._index))
            self.by_id[id(stack)] = index
            self._alive.append(stack)
        return index

    def __call__(self, s: StackSample) -> _RowKey:
        return (s.process, s.tid, s.reason, self.index_of(s.stack), s.waker)


class Accumulator:
    """Sums the increases of every snapshot it is given, in order: the profile of a whole run
    (`record`), independent of how long the exporter keeps history or exited processes."""

    def __init__(self, keep: ProfileFilter = _KEEP_ALL) -> None:
        self._keep = keep
        self._keys = _RowKeys()
        self._rows: dict[_RowKey, tuple[StackSample, Counter]] = {}
        self._infos: dict[ProcessKey, ProcessInfo] = {}
        self._start_ns: int | None = None
        self._end_ns = 0
        self._sequence = -1
        self._last: Snapshot | None = None

    def add(self, snapshot: Snapshot) -> None:
        if snapshot.sequence <= self._sequence:
            return  # already counted (the same snapshot handed twice)
        self._sequence = snapshot.sequence
        self._last = snapshot
        if self._start_ns is None:
            self._start_ns = snapshot.interval_start_ns
        self._end_ns = snapshot.time_ns
        for pkey, view in snapshot.processes.items():
            self._infos[pkey] = view.info
        rows, by_id, index_of = self._rows, self._keys.by_id, self._keys.index_of
        for s in snapshot.samples:
            if not s.increase:
                continue
            # The hot loop of a long history (changed rows x snapshots): the key is inlined.
            index = by_id.get(id(s.stack))
            if index is None:
                index = index_of(s.stack)
            key = (s.process, s.tid, s.reason, index, s.waker)
            seen = rows.get(key)
            rows[key] = (s, s.increase if seen is None else seen[1] + s.increase)

    @property
    def stacks(self) -> int:
        return len({key[3] for key in self._rows})

    @property
    def processes(self) -> int:
        return len({key[0] for key in self._rows})

    @property
    def total(self) -> Counter:
        result = Counter()
        for _, value in self._rows.values():
            result += value
        return result

    def profile(self, description: str = "", since: Snapshot | None = None) -> Profile:
        """What was added so far: from the snapshot before the first one added when given (its
        capture counters are the start of the sampled ratio), else from the first one's interval
        start, with the ratio since the probe started (`record`'s, whose probe starts with it)."""
        if since is not None:
            start: int = since.time_ns
        else:
            start = self._start_ns if self._start_ns is not None else self._end_ns
        sampled = _sampled_ratio(self._last, since) if self._last is not None else None
        return _build(start, self._end_ns, list(self._rows.values()), self._infos, self._keep, description, sampled)


def _known(sources: Iterable[Snapshot]) -> dict[ProcessKey, ProcessInfo]:
    """Process information from the newest snapshot that has each process (newest first)."""
    infos: dict[ProcessKey, ProcessInfo] = {}
    for snapshot in sources:
        for key, view in snapshot.processes.items():
            infos.setdefault(key, view.info)
    return infos


def _build(
    start_ns: int,
    end_ns: int,
    rows: Iterable[tuple[StackSample, Counter]],
    known: Mapping[ProcessKey, ProcessInfo],
    keep: ProfileFilter,
    description: str,
    sampled: float | None = None,
) -> Profile:
    """Attaches process information and drops empty and filtered rows."""
    samples = []
    for s, value in rows:
        if not value or value.ns < 0 or value.count < 0:
            continue
        info = known.get(s.process) or ProcessInfo(key=s.process, comm=f"[pid {s.process.pid}]")
        if not keep.keeps(info):
            continue
        samples.append(ProfileSample(info, s.tid, s.thread_name, s.reason, s.stack, value, s.waker))
    # Ties keep the snapshot's order (a stable sort), so equal input gives equal output.
    samples.sort(key=lambda p: (p.process.pid, p.tid, -p.value.ns, p.reason))
    processes = {p.process.key: p.process for p in samples}
    return Profile(start_ns, end_ns, tuple(samples), MappingProxyType(processes), description, sampled)
