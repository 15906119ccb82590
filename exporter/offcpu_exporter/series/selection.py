"""Which processes and stacks get series of their own (Prometheus, OTLP metrics), decided once per
snapshot.

Two rules keep every exported counter monotonic while bounding cardinality:

- Processes: whether a process gets its own series is decided when it is first seen. While fewer
  than `max_processes` selected processes are present, new ones are selected (the largest first);
  the others are folded into one ``pid="other"`` process for as long as they live. The folded
  series accumulates the increases of folded processes, so it never goes down when one of them
  exits, and no time is counted twice when a process would change sides.
- Stacks: each selected process exports its top K stacks by recent off-CPU time (a score with a
  5-minute half-life, so a stack that became hot later takes the slot of one that went cold),
  aggregated over threads and reasons. A stack's series counts from the moment it got its slot
  (its earlier time stays in ``other``), and ``other`` is the process total minus the K series,
  so the stack series of a process always sum exactly to its total. A stack that loses its slot
  (only when a rival scores twice as high, to avoid flapping) ends its series and its count moves
  into ``other``, which therefore only goes up.
- Threads (with --per-thread): the same rule per process, with ``tid="other"`` for the rest: each
  selected process exports its top K threads by recent off-CPU time, and ``other`` is the process's
  total per reason minus those series.
- Block-duration histograms per container (``--prometheus.histogram-by container``): every process,
  selected or folded, adds its increases to the histogram of its (namespace, pod, container), host
  processes to the one with empty names (read from Snapshot.containers). A group's series last as long as one of
  its processes is in the snapshot (so through the exited grace of the last one), then end.
"""

from __future__ import annotations

import logging
import operator
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from offcpu_exporter.ratelimit import RateLimitedLog
from offcpu_exporter.snapshot import (
    Counter,
    ProcessInfo,
    ProcessKey,
    ProcessView,
    Reason,
    Snapshot,
    Stack,
    ThreadView,
)

__all__ = [
    "FoldedProcesses",
    "GroupHistogram",
    "ProcessSeries",
    "Selection",
    "SelectionView",
    "StackSeries",
    "ThreadSeries",
    "one_per_pid",
]

log = logging.getLogger(__name__)

ZERO = Counter()
_HALF_LIFE_NS = 300e9
_EVICT_RATIO = 2.0


@dataclass(frozen=True)
class StackSeries:
    stack: Stack
    value: Counter


@dataclass(frozen=True)
class ThreadSeries:
    thread: ThreadView
    by_reason: Mapping[Reason, Counter]


@dataclass(frozen=True)
class ProcessSeries:
    view: ProcessView
    stacks: tuple[StackSeries, ...]
    other: Counter  # view.total minus the stack series
    threads: tuple[ThreadSeries, ...] = ()  # with --per-thread: the top K threads
    other_threads: Mapping[Reason, Counter] = field(default_factory=dict)  # view.by_reason minus `threads`


def one_per_pid(processes: Sequence[ProcessSeries]) -> Iterator[ProcessSeries]:
    """A pid reused while the exited process is still in its grace period would give two processes
    the same labels (or attributes): export the live (newer) one, by pid."""
    best: dict[int, ProcessSeries] = {}
    for p in processes:
        cur = best.get(p.view.info.pid)
        if cur is None or _newer(p.view.info, cur.view.info):
            best[p.view.info.pid] = p
    for pid in sorted(best):
        yield best[pid]


def _newer(a: ProcessInfo, b: ProcessInfo) -> bool:
    return (not a.exited, a.key.start_ticks) > (not b.exited, b.key.start_ticks)


@dataclass(frozen=True)
class FoldedProcesses:
    """Everything folded into ``pid="other"``: accumulated increases of folded processes."""

    processes: int  # folded processes present in this snapshot
    total: Counter
    by_reason: Mapping[Reason, Counter]
    histogram: tuple[int, ...]


@dataclass(frozen=True)
class GroupHistogram:
    """Block durations of the processes of one container (namespace, pod, container); all three empty
    for processes outside pods. Accumulated increases, so a process's exit never lowers it."""

    where: tuple[str, str, str]
    histogram: tuple[int, ...]
    total: Counter


@dataclass(frozen=True)
class SelectionView:
    sequence: int
    processes: tuple[ProcessSeries, ...]
    folded: FoldedProcesses | None  # None until some process was ever folded
    overflow: Mapping[str, int]  # what -> items folded away since start
    groups: tuple[GroupHistogram, ...] = ()  # with group_histograms, sorted by `where`


Id = TypeVar("Id", str, int)
Base = TypeVar("Base")


@dataclass
class _Slots(Generic[Id, Base]):
    """K series slots of one process, held by the ids (stacks, threads) with the most recent off-CPU
    time. `chosen` maps each holder to its value when it got the slot: its series counts from there."""

    chosen: dict[Id, Base] = field(default_factory=dict)
    score: dict[Id, float] = field(default_factory=dict)
    last: dict[Id, Counter] = field(default_factory=dict)
    last_time_ns: int = 0

    def update(self, k: int, totals: Mapping[Id, Counter], values: Mapping[Id, Base], zero: Base, time_ns: int) -> int:
        """Rescores and reassigns the slots; returns how many ids seen for the first time got none."""
        self._score(totals, time_ns)
        return self._choose(k, totals, values, zero)

    def _score(self, totals: Mapping[Id, Counter], time_ns: int) -> None:
        dt = max(time_ns - self.last_time_ns, 0) if self.last_time_ns else 0
        decay = 0.5 ** (dt / _HALF_LIFE_NS)
        score = {}
        for i, total in totals.items():
            inc = max(total.ns - self.last.get(i, ZERO).ns, 0)
            score[i] = self.score.get(i, 0.0) * decay + inc
        self.score = score
        self.last_time_ns = time_ns
        # A holder gone from the snapshot cannot be exported; its time stays in `other`.
        for i in [i for i in self.chosen if i not in totals]:
            del self.chosen[i]

    def _choose(self, k: int, totals: Mapping[Id, Counter], values: Mapping[Id, Base], zero: Base) -> int:
        seen_before = self.last
        candidates = sorted(
            (i for i in totals if i not in self.chosen),
            key=lambda i: (-self.score[i], -totals[i].ns, i),
        )
        new_refused = 0
        for i in candidates:
            if len(self.chosen) < k:
                # Time an id had while in `other` stays there; a brand-new one starts at its total.
                self.chosen[i] = values[i] if i in seen_before else zero
                continue
            weakest = min(self.chosen, key=lambda c: (self.score[c], c), default=None)
            if weakest is not None and self.score[i] > _EVICT_RATIO * self.score[weakest]:
                del self.chosen[weakest]
                self.chosen[i] = values[i] if i in seen_before else zero
            elif i not in seen_before:
                new_refused += 1
        self.last = dict(totals)
        return new_refused


_NO_REASONS: Mapping[Reason, Counter] = {}


@dataclass(frozen=True, slots=True)
class SeriesLimits:
    """How many series the selection lets through; the defaults of --prometheus.* and --otlp.*."""

    max_processes: int = 200  # 0: no limit
    top_stacks: int = 10  # per process
    top_threads: int = 10  # per process, with --per-thread


DEFAULT_LIMITS = SeriesLimits()


class Selection:
    def __init__(
        self,
        max_processes: int = DEFAULT_LIMITS.max_processes,
        top_stacks: int = DEFAULT_LIMITS.top_stacks,
        top_threads: int = DEFAULT_LIMITS.top_threads,
        group_histograms: bool = False,
        flags: str = "--prometheus",
    ) -> None:
        """`flags`: the prefix of the output's own limit flags, which its messages name."""
        self.flags = flags
        self.max_processes = max_processes  # 0: no limit
        self.top_stacks = top_stacks
        self.top_threads = top_threads
        self.group_histograms = group_histograms
        self._lock = threading.Lock()
        self._view: SelectionView | None = None
        self._selected: set[ProcessKey] = set()
        self._folded: set[ProcessKey] = set()  # folded into pid="other", present in the last view
        self._ever_folded = False
        # pid="other" is everything counted (Snapshot.everything) less the processes shown on their
        # own: those shown now, and those shown until they left the snapshots (`_left`, as last seen).
        self._shown_last: dict[ProcessKey, ProcessView] = {}
        self._left_total = ZERO
        self._left_by_reason: dict[Reason, Counter] = {}
        self._left_hist: list[int] = []
        self._stacks: dict[ProcessKey, _Slots[str, Counter]] = {}
        self._threads: dict[ProcessKey, _Slots[int, Mapping[Reason, Counter]]] = {}
        self._overflow = {"processes": 0, "stacks": 0, "threads": 0}
        self._log = RateLimitedLog(log, interval=300.0)

    def view(self, snapshot: Snapshot) -> SelectionView:
        """The view of `snapshot`; computed once per sequence (callers may be concurrent)."""
        with self._lock:
            if self._view is not None and self._view.sequence == snapshot.sequence:
                return self._view
            self._view = self._update(snapshot)
            return self._view

    # ---- one update ---------------------------------------------------------------------------

    def _update(self, snapshot: Snapshot) -> SelectionView:
        present = snapshot.processes
        for key in [k for k in self._selected if k not in present]:
            self._left(self._shown_last.pop(key))
        self._selected.intersection_update(present)
        self._folded.intersection_update(present)
        for slots in (self._stacks, self._threads):
            for key in [k for k in slots if k not in self._selected]:
                del slots[key]
        self._choose_processes(present)

        samples_by_process: dict[ProcessKey, list[tuple[Stack, Counter]]] = {}
        for s in snapshot.samples:
            if s.process in self._selected:
                samples_by_process.setdefault(s.process, []).append((s.stack, s.total))

        series = []
        for key in sorted(self._selected, key=lambda k: (k.pid, k.start_ticks)):
            view = self._shown_last[key] = present[key]
            series.append(self._process_series(view, samples_by_process.get(key, ()), snapshot.time_ns))
        folded = self._fold(snapshot)
        groups = tuple(GroupHistogram(where, rollup.histogram, rollup.total)
                       for where, rollup in sorted(snapshot.containers.items())) if self.group_histograms else ()
        return SelectionView(snapshot.sequence, tuple(series), folded, dict(self._overflow), groups)

    def _choose_processes(self, present: Mapping[ProcessKey, ProcessView]) -> None:
        new = [v for k, v in present.items() if k not in self._selected and k not in self._folded]
        if not new:
            return
        new.sort(key=lambda v: (-v.total.ns, v.info.pid))
        free = len(new) if not self.max_processes else max(self.max_processes - len(self._selected), 0)
        for v in new[:free]:
            self._selected.add(v.info.key)
        refused = new[free:]
        for v in refused:
            # Folded from the start: its whole total is an increase of pid="other".
            self._folded.add(v.info.key)
        if refused:
            self._ever_folded = True
            self._overflow["processes"] += len(refused)
            self._log.warning(
                'more than %s.max-processes=%d processes: %d folded into pid="other" (%d since start)',
                self.flags,
                self.max_processes,
                len(refused),
                self._overflow["processes"],
            )

    def _left(self, last: ProcessView) -> None:
        """A shown process left the snapshots (past its grace): what it had stays out of pid="other"
        (its increases after the last view, which no series of its own showed, go there)."""
        self._left_total += last.total
        for reason, value in last.by_reason.items():
            self._left_by_reason[reason] = self._left_by_reason.get(reason, ZERO) + value
        _add_slots(self._left_hist, last.histogram)

    def _fold(self, snapshot: Snapshot) -> FoldedProcesses | None:
        if not self._ever_folded:
            return None
        shown = [self._shown_last[key] for key in self._selected]
        everything = snapshot.everything
        total = everything.total - self._left_total
        by_reason = dict(everything.by_reason)
        hist = list(everything.histogram)
        for reason, value in self._left_by_reason.items():
            by_reason[reason] = by_reason.get(reason, ZERO) - value
        _sub_slots(hist, self._left_hist)
        for view in shown:
            total -= view.total
            for reason, value in view.by_reason.items():
                by_reason[reason] = by_reason.get(reason, ZERO) - value
            _sub_slots(hist, view.histogram)
        return FoldedProcesses(len(self._folded), total, {r: c for r, c in by_reason.items() if c}, tuple(hist))

    def _process_series(
        self, view: ProcessView, samples: Sequence[tuple[Stack, Counter]], time_ns: int
    ) -> ProcessSeries:
        totals: dict[str, Counter] = {}
        stacks: dict[str, Stack] = {}
        for stack, total in samples:
            sid = stack.stack_id
            totals[sid] = totals.get(sid, ZERO) + total
            stacks[sid] = stack
        slots = self._stacks.setdefault(view.info.key, _Slots())
        refused = slots.update(self.top_stacks, totals, totals, ZERO, time_ns)
        self._count_refused("stacks", refused, view, f"{self.flags}.top-stacks", self.top_stacks, 'stack_id="other"')
        out = []
        used = ZERO
        for sid, base in slots.chosen.items():
            value = _increase(totals[sid], base)
            used += value
            out.append(StackSeries(stacks[sid], value))
        other = Counter(max(view.total.count - used.count, 0), max(view.total.ns - used.ns, 0))
        out.sort(key=lambda s: (-s.value.ns, s.stack.stack_id))
        threads, other_threads = self._thread_series(view, time_ns)
        return ProcessSeries(view, tuple(out), other, threads, other_threads)

    def _thread_series(
        self, view: ProcessView, time_ns: int
    ) -> tuple[tuple[ThreadSeries, ...], Mapping[Reason, Counter]]:
        slots = self._threads.setdefault(view.info.key, _Slots())
        totals = {tid: t.total for tid, t in view.threads.items()}
        values = {tid: t.by_reason for tid, t in view.threads.items()}
        refused = slots.update(self.top_threads, totals, values, _NO_REASONS, time_ns)
        self._count_refused("threads", refused, view, f"{self.flags}.top-threads", self.top_threads, 'tid="other"')
        out = []
        used: dict[Reason, Counter] = {}
        for tid, base in slots.chosen.items():
            thread = view.threads[tid]
            by_reason = {}
            for reason, now in thread.by_reason.items():
                by_reason[reason] = value = _increase(now, base.get(reason, ZERO))
                used[reason] = used.get(reason, ZERO) + value
            out.append(ThreadSeries(thread, by_reason))
        other = {reason: _increase(total, used.get(reason, ZERO)) for reason, total in view.by_reason.items()}
        out.sort(key=lambda t: (-t.thread.total.ns, t.thread.tid))
        return tuple(out), other

    def _count_refused(self, what: str, n: int, view: ProcessView, option: str, k: int, other: str) -> None:
        if not n:
            return
        self._overflow[what] += n
        self._log.log(
            logging.INFO,
            "process %d (%s): %d %s beyond %s=%d folded into %s",
            view.info.pid,
            view.info.comm,
            n,
            what,
            option,
            k,
            other,
        )


def _add_slots(slots: list[int], more: Sequence[int]) -> None:
    if len(slots) < len(more):
        slots.extend([0] * (len(more) - len(slots)))
    slots[: len(more)] = map(operator.add, slots, more)  # (in C)


def _sub_slots(slots: list[int], less: Sequence[int]) -> None:
    if len(slots) < len(less):
        slots.extend([0] * (len(less) - len(slots)))
    slots[: len(less)] = map(operator.sub, slots, less)


def _increase(now: Counter, before: Counter) -> Counter:
    return Counter(max(now.count - before.count, 0), max(now.ns - before.ns, 0))

