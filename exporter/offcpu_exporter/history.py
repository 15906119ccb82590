"""The snapshots that profiles of the past are made from (/flamegraph?minutes=N and the flushes
of a /debug/pprof/profile request), in memory that does not grow with every flush.

A snapshot as published holds every process's view (histogram, blocked threads) and every row's
total: a few MB per flush at 2,000 busy processes, ~500 MB over the default 15 minutes of history
if each were kept (issue 27). Profiles only need what changed and who it was (Profile.over sums
the increases of consecutive snapshots), so the history keeps, per flush, the rows that changed and
their processes' names; and flushes older than `exact_seconds` are summed into buckets of
`bucket_seconds`, each one snapshot whose `merged_from` is the first flush it holds. A bucket costs
about what one flush's changes cost, so 15 minutes hold 15 buckets beside the last minute's flushes.
Profiles of the past are as exact as before; they start and end at a bucket's edges, a minute's
resolution that /flamegraph's minutes ask for anyway.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Collection
from dataclasses import replace
from types import MappingProxyType

from offcpu_exporter.snapshot import ZERO, Counter, ProcessKey, ProcessView, Reason, Snapshot, StackSample, Waker

__all__ = ["History"]

# process, tid, reason, id() of the Stack (held by the row), waker (with --wakers on)
_RowId = tuple[ProcessKey, int, int, int, Waker | None]


class _Bucket:
    """Flushes summed in order: the increase of each row, its newest sample, its process's name.
    Once closed, only the snapshot made of them is kept."""

    def __init__(self, first: Snapshot) -> None:
        self.first = first
        self.last = first
        self.rows: dict[_RowId, tuple[StackSample, Counter]] = {}
        self.views: dict[ProcessKey, ProcessView] = {}
        self._made: Snapshot | None = None
        self.add(first)

    @property
    def time_ns(self) -> int:
        return self.last.time_ns

    def close(self) -> None:
        made = self.snapshot()
        self.rows, self.views = {}, {}
        self.first = self.last = made

    def add(self, snapshot: Snapshot) -> None:
        self.last = snapshot
        self._made = None
        rows = self.rows
        for s in snapshot.samples:
            key = (s.process, s.tid, s.reason, id(s.stack), s.waker)
            seen = rows.get(key)
            rows[key] = (s, s.increase if seen is None else seen[1] + s.increase)
        self.views.update(snapshot.processes)

    def snapshot(self) -> Snapshot:
        if self._made is None:
            samples = tuple(s if s.increase is increase else replace(s, increase=increase)
                            for s, increase in self.rows.values())
            self._made = replace(self.last, interval_start_ns=self.first.interval_start_ns,
                                 merged_from=self.first.merged_from or self.first.sequence,
                                 processes=MappingProxyType(dict(self.views)), samples=samples)
        return self._made


class _Names:
    """Per process, a view that names it and nothing else, made again only when its information
    changed (one per process for the whole history, not one per flush)."""

    def __init__(self) -> None:
        self._views: dict[ProcessKey, ProcessView] = {}

    def of(self, view: ProcessView) -> ProcessView:
        named = self._views.get(view.info.key)
        if named is None or named.info is not view.info:
            named = self._views[view.info.key] = ProcessView(info=view.info, total=ZERO, by_reason=_NONE)
        return named

    def forget_all_but(self, keys: Collection[ProcessKey]) -> None:
        if len(self._views) > 2 * len(keys):
            self._views = {k: v for k, v in self._views.items() if k in keys}


_NONE: MappingProxyType[Reason, Counter] = MappingProxyType({})


def _changes(snapshot: Snapshot, names: _Names) -> Snapshot:
    """What a profile needs of a flush: the rows that changed, and the names of their processes
    (not their totals, histograms and blocked threads, which only the newest snapshot shows)."""
    samples = tuple(s for s in snapshot.samples if s.increase)
    views: dict[ProcessKey, ProcessView] = {}
    for s in samples:
        if s.process not in views and (view := snapshot.processes.get(s.process)) is not None:
            views[s.process] = names.of(view)
    return replace(snapshot, processes=MappingProxyType(views), samples=samples)


class History:
    def __init__(self, seconds: float, *, exact_seconds: float = 60.0, bucket_seconds: float = 60.0) -> None:
        self._keep_ns = int(seconds * 1e9)
        self._exact_ns = int(exact_seconds * 1e9)
        self._bucket_ns = int(bucket_seconds * 1e9)
        self._exact: collections.deque[Snapshot] = collections.deque()
        self._buckets: collections.deque[_Bucket] = collections.deque()
        self._names = _Names()
        self._lock = threading.Lock()

    def add(self, snapshot: Snapshot) -> None:
        """The next flush's snapshot (in order of sequence)."""
        changes = _changes(snapshot, self._names)
        self._names.forget_all_but(snapshot.processes.keys())
        with self._lock:
            self._exact.append(changes)
            exact_from = snapshot.time_ns - self._exact_ns
            while self._exact and self._exact[0].time_ns < exact_from:
                old = self._exact.popleft()
                last = self._buckets[-1] if self._buckets else None
                if last is not None and old.time_ns - last.first.interval_start_ns <= self._bucket_ns:
                    last.add(old)
                else:
                    if last is not None:
                        last.close()
                    self._buckets.append(_Bucket(old))
            keep_from = snapshot.time_ns - self._keep_ns
            while self._buckets and self._buckets[0].time_ns < keep_from:
                self._buckets.popleft()
            while self._exact and self._exact[0].time_ns < keep_from:
                self._exact.popleft()

    def since(self, cutoff_ns: int) -> list[Snapshot]:
        """The entries that end at or after `cutoff_ns` (wall clock), oldest first: consecutive
        flushes (each entry's first flush follows the previous entry's last)."""
        with self._lock:
            return ([b.snapshot() for b in self._buckets if b.time_ns >= cutoff_ns]
                    + [s for s in self._exact if s.time_ns >= cutoff_ns])
