"""Which processes and stacks get their own Prometheus series, decided once per snapshot.

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
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from offcpu_exporter.ratelimit import RateLimitedLog
from offcpu_exporter.snapshot import Counter, ProcessInfo, ProcessKey, ProcessView, Reason, Snapshot, Stack

__all__ = ["FoldedProcesses", "ProcessSeries", "Selection", "SelectionView", "StackSeries", "one_per_pid"]

log = logging.getLogger(__name__)

ZERO = Counter()
_HALF_LIFE_NS = 300e9
_EVICT_RATIO = 2.0


@dataclass(frozen=True)
class StackSeries:
    stack: Stack
    value: Counter


@dataclass(frozen=True)
class ProcessSeries:
    view: ProcessView
    stacks: tuple[StackSeries, ...]
    other: Counter  # view.total minus the stack series


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
class SelectionView:
    sequence: int
    processes: tuple[ProcessSeries, ...]
    folded: FoldedProcesses | None  # None until some process was ever folded
    overflow: Mapping[str, int]  # what -> items folded away since start


@dataclass
class _StackChoice:
    chosen: dict[str, Counter] = field(default_factory=dict)  # stack id -> base (total when chosen)
    score: dict[str, float] = field(default_factory=dict)
    last: dict[str, Counter] = field(default_factory=dict)
    last_time_ns: int = 0


class Selection:
    def __init__(self, max_processes: int = 200, top_stacks: int = 10) -> None:
        self.max_processes = max_processes  # 0: no limit
        self.top_stacks = top_stacks
        self._lock = threading.Lock()
        self._view: SelectionView | None = None
        self._selected: set[ProcessKey] = set()
        self._folded_last: dict[ProcessKey, ProcessView] = {}
        self._folded_total = ZERO
        self._folded_by_reason: dict[Reason, Counter] = {}
        self._folded_hist: list[int] = []
        self._ever_folded = False
        self._stacks: dict[ProcessKey, _StackChoice] = {}
        self._overflow = {"processes": 0, "stacks": 0}
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
        self._selected.intersection_update(present)
        for key in [k for k in self._stacks if k not in self._selected]:
            del self._stacks[key]
        self._choose_processes(present)

        samples_by_process: dict[ProcessKey, list[tuple[Stack, Counter]]] = {}
        for s in snapshot.samples:
            if s.process in self._selected:
                samples_by_process.setdefault(s.process, []).append((s.stack, s.total))

        series = []
        for key in sorted(self._selected, key=lambda k: (k.pid, k.start_ticks)):
            view = present[key]
            series.append(self._process_series(view, samples_by_process.get(key, ()), snapshot.time_ns))
        folded = self._fold(present)
        return SelectionView(snapshot.sequence, tuple(series), folded, dict(self._overflow))

    def _choose_processes(self, present: Mapping[ProcessKey, ProcessView]) -> None:
        new = [v for k, v in present.items() if k not in self._selected and k not in self._folded_last]
        if not new:
            return
        new.sort(key=lambda v: (-v.total.ns, v.info.pid))
        free = len(new) if not self.max_processes else max(self.max_processes - len(self._selected), 0)
        for v in new[:free]:
            self._selected.add(v.info.key)
        refused = new[free:]
        for v in refused:
            # Folded from the start: its whole total is an increase of pid="other".
            self._folded_last[v.info.key] = _empty_like(v)
        if refused:
            self._ever_folded = True
            self._overflow["processes"] += len(refused)
            self._log.warning(
                'more than --prometheus.max-processes=%d processes: %d folded into pid="other" (%d since start)',
                self.max_processes,
                len(refused),
                self._overflow["processes"],
            )

    def _fold(self, present: Mapping[ProcessKey, ProcessView]) -> FoldedProcesses | None:
        for key in [k for k in self._folded_last if k not in present]:
            del self._folded_last[key]  # exited: what it had is already accumulated
        for key, last in self._folded_last.items():
            now = present[key]
            self._folded_total += _increase(now.total, last.total)
            for reason in Reason:
                inc = _increase(now.by_reason.get(reason, ZERO), last.by_reason.get(reason, ZERO))
                if inc:
                    self._folded_by_reason[reason] = self._folded_by_reason.get(reason, ZERO) + inc
            if len(self._folded_hist) < len(now.histogram):
                self._folded_hist.extend([0] * (len(now.histogram) - len(self._folded_hist)))
            for i, n in enumerate(now.histogram):
                before = last.histogram[i] if i < len(last.histogram) else 0
                self._folded_hist[i] += max(n - before, 0)
            self._folded_last[key] = now
        if not self._ever_folded:
            return None
        return FoldedProcesses(
            len(self._folded_last), self._folded_total, dict(self._folded_by_reason), tuple(self._folded_hist)
        )

    def _process_series(
        self, view: ProcessView, samples: Sequence[tuple[Stack, Counter]], time_ns: int
    ) -> ProcessSeries:
        totals: dict[str, Counter] = {}
        stacks: dict[str, Stack] = {}
        for stack, total in samples:
            sid = stack.stack_id
            totals[sid] = totals.get(sid, ZERO) + total
            stacks[sid] = stack
        choice = self._stacks.setdefault(view.info.key, _StackChoice())
        self._score(choice, totals, time_ns)
        self._choose_stacks(choice, totals, view)
        out = []
        used = ZERO
        for sid, base in choice.chosen.items():
            value = _increase(totals[sid], base)
            used += value
            out.append(StackSeries(stacks[sid], value))
        other = Counter(max(view.total.count - used.count, 0), max(view.total.ns - used.ns, 0))
        out.sort(key=lambda s: (-s.value.ns, s.stack.stack_id))
        return ProcessSeries(view, tuple(out), other)

    @staticmethod
    def _score(choice: _StackChoice, totals: Mapping[str, Counter], time_ns: int) -> None:
        dt = max(time_ns - choice.last_time_ns, 0) if choice.last_time_ns else 0
        decay = 0.5 ** (dt / _HALF_LIFE_NS)
        score = {}
        for sid, total in totals.items():
            inc = max(total.ns - choice.last.get(sid, ZERO).ns, 0)
            score[sid] = choice.score.get(sid, 0.0) * decay + inc
        choice.score = score
        choice.last_time_ns = time_ns
        # A chosen stack gone from the snapshot cannot be exported; its time stays in `other`.
        for sid in [s for s in choice.chosen if s not in totals]:
            del choice.chosen[sid]

    def _choose_stacks(self, choice: _StackChoice, totals: Mapping[str, Counter], view: ProcessView) -> None:
        k = self.top_stacks
        seen_before = choice.last
        candidates = sorted(
            (sid for sid in totals if sid not in choice.chosen),
            key=lambda sid: (-choice.score[sid], -totals[sid].ns, sid),
        )
        new_refused = 0
        for sid in candidates:
            if len(choice.chosen) < k:
                # Time a stack had while in `other` stays there; a brand-new stack starts at its total.
                choice.chosen[sid] = totals[sid] if sid in seen_before else ZERO
                continue
            weakest = min(choice.chosen, key=lambda s: (choice.score[s], s), default=None)
            if weakest is not None and choice.score[sid] > _EVICT_RATIO * choice.score[weakest]:
                del choice.chosen[weakest]
                choice.chosen[sid] = totals[sid] if sid in seen_before else ZERO
            elif sid not in seen_before:
                new_refused += 1
        choice.last = dict(totals)
        if new_refused:
            self._overflow["stacks"] += new_refused
            self._log.log(
                logging.INFO,
                'process %d (%s): %d stacks beyond --prometheus.top-stacks=%d folded into stack_id="other"',
                view.info.pid,
                view.info.comm,
                new_refused,
                k,
            )


def _increase(now: Counter, before: Counter) -> Counter:
    return Counter(max(now.count - before.count, 0), max(now.ns - before.ns, 0))


def _empty_like(view: ProcessView) -> ProcessView:
    return ProcessView(view.info, ZERO, {}, ())
