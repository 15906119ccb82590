"""Blocks still going on: counted as they happen, not only when they end.

The kernel charges a block when the thread runs again. A thread stuck for minutes (in D state, on a
lock, in a long sleep) would show nothing until it wakes, and then everything at once, in whatever
interval it happened to wake. So at each flush, the time of every block in progress is counted up
to the flush, and the kernel is told, per thread, from when the rest of that block counts: a
*mark* (tid -> block start, counted until) in the `marks` map, which the BPF program reads at the
switch-in (bpf/offcpu.bpf.c, switch_in()).

Writing a mark races with the block's end. The protocol, with T the flush's time:
  1. read the blocks in progress (the `start` map);
  2. write a mark (start, T) for each;
  3. read them again. A block still there at 3 is still going on: whenever it ends, the kernel
     finds the mark and counts from T, so [previous mark, T] is ours to count. A block gone at 3
     ended in between: if its mark is still in the map, the kernel ended it before the mark was
     written (it counted from the previous mark; ours is stale and is deleted); if the mark is gone,
     the kernel consumed it (it counts from T, and [previous mark, T] is ours).
Nothing is counted twice and nothing is missed, whatever the interleaving.

Threads that were already off CPU when they became watched are *seeded*: their block is stored
with the time watching began, so a thread stuck since before the exporter started shows up too,
with its stacks as /proc shows them at that moment (blocked_stacks.py) where they can be read.
The stacks are read between the two looks at the thread's state, so they are the ones of the
block that is seeded: a thread that ran in between has its seeded block taken back.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Iterator, Mapping
from typing import NamedTuple

from offcpu_exporter.blocked_stacks import BlockedStacks, KernelAddress
from offcpu_exporter.clock import ktime_ns
from offcpu_exporter.probe.maps import KernelMaps, StartEntry
from offcpu_exporter.snapshot import Reason

__all__ = ["Credit", "InProgress"]

log = logging.getLogger(__name__)

# /proc/PID/task/TID/stat state letters of threads that are off CPU and not runnable.
_SEED_REASONS = {
    "S": Reason.SLEEPING,
    "I": Reason.SLEEPING,  # TASK_IDLE
    "D": Reason.UNINTERRUPTIBLE,
    "T": Reason.OTHER,
    "t": Reason.OTHER,
}


class Credit(NamedTuple):
    """Time of a block in progress counted by this flush (a NamedTuple: one per blocked thread per
    flush, tens of thousands on a large node)."""

    tid: int
    block: StartEntry
    ns: int


# Credit(...) without the Python frame of a NamedTuple's __new__: one per blocked thread per flush.
_AS_CREDIT = functools.partial(tuple.__new__, Credit)


class InProgress:
    """The marks protocol's user half: what has been counted of each block in progress."""

    def __init__(self, probe: KernelMaps, *, proc_root: str = "/proc", kernel_address: KernelAddress | None = None,
                 stacks: BlockedStacks | None = None) -> None:
        """`kernel_address`: kernel function name -> start (Symbolizer.kernel_address), to store
        seeded blocks' kernel stacks; without it their kernel half is the placeholder."""
        self.probe = probe
        self.stacks = stacks or BlockedStacks(probe, kernel_address, proc_root=proc_root)
        self.proc_root = proc_root
        self._counted: dict[int, tuple[int, int]] = {}  # tid -> (block start, counted until)

    def credit(self, at_ns: int) -> tuple[list[Credit], dict[int, StartEntry]]:
        """Count every block in progress up to `at_ns` (CLOCK_MONOTONIC). Returns the credits and
        the blocks in progress afterwards (tid -> block)."""
        probe = self.probe
        before = probe.read_starts()
        if not probe.config.in_progress_credit:
            return [], before
        min_ns = probe.config.min_block_ns
        # A block shorter than --min-block so far may yet end below it and not count at all.
        latest = at_ns - max(min_ns, 1)
        eligible = {tid: b for tid, b in before.items() if b.ts_ns <= latest}
        marks = {tid: (b.ts_ns, at_ns) for tid, b in eligible.items()}
        probe.write_marks(marks)
        after = probe.read_starts()
        ended = {tid for tid, mark in marks.items() if (b := after.get(tid)) is None or b.ts_ns != mark[0]}
        left = probe.read_marks() if ended else {}
        stale = []
        credits = []
        counted = self._counted
        # Made anew (every blocked thread, at every flush): what is counted of the blocks still going on.
        self._counted = still = {}
        for tid, block in eligible.items():
            ts_ns = block.ts_ns
            if tid in ended:
                if left.get(tid) == marks[tid]:
                    stale.append(tid)  # ended before the mark was written: counted by the kernel from `since`
                    continue
            else:
                still[tid] = (ts_ns, at_ns)
            previous = counted.get(tid)
            since = previous[1] if previous is not None and previous[0] == ts_ns else ts_ns
            if at_ns > since:
                credits.append(_AS_CREDIT((tid, block, at_ns - since)))
        probe.delete_marks(stale)
        probe.set_marks_active(bool(still))
        return credits, after

    # -- seeding ---------------------------------------------------------------------------

    def seed(self, tgid: int, *, since_ns: int | None = None) -> int:
        """Store the blocks of `tgid`'s threads that are off CPU now (the probe saw them begin
        before it watched the process, or not at all), counted from `since_ns` (CLOCK_MONOTONIC:
        when the probe began to see the process's switches; default now); returns how many were
        stored."""
        seeded = 0
        for tid in self._threads(tgid):
            seeded += self._seed_thread(tgid, tid, since_ns)
        return seeded

    def _threads(self, tgid: int) -> Iterator[int]:
        try:
            names = os.listdir(f"{self.proc_root}/{tgid}/task")
        except OSError:
            return
        for name in names:
            if name.isdigit():
                yield int(name)

    @property
    def seeded_stacks(self) -> Mapping[str, int]:
        """Seeded blocks by what their stacks are (blocked_stacks.OUTCOMES), cumulative."""
        return dict(self.stacks.outcomes)

    def _seed_thread(self, tgid: int, tid: int, since_ns: int | None) -> int:
        before = self._thread_state(tgid, tid)
        if before is None or before[0] not in _SEED_REASONS:
            return 0  # running or runnable (the probe sees its next switch-out), or gone
        if self.probe.read_start(tid) is not None:
            return 0  # the probe has seen it switch out already: no stacks to read
        # The stacks go into the stack map first; if the block is not seeded after all, nothing
        # references them and the next flush frees them (Aggregator._collect_stacks()).
        user, kernel, outcome = self.stacks.ids(tgid, tid)
        since = ktime_ns() if since_ns is None else since_ns
        block = StartEntry(since, user, kernel, tgid, _SEED_REASONS[before[0]].value, 1)
        if not self.probe.seed_start(tid, block):
            return 0  # the probe has seen it switch out already
        after = self._thread_state(tgid, tid)
        if after != before:
            # It ran in between (its run count moved, or its state changed): the seeded block is
            # not the one it is in, if any, nor are the stacks read. Taken back unless the kernel
            # replaced it already.
            self.probe.unseed_start(tid, block.ts_ns)
            return 0
        self.stacks.count(outcome)
        return 1

    def _thread_state(self, tgid: int, tid: int) -> tuple[str, int] | None:
        """(state letter, times it was switched in) of a thread off CPU, or None if it is gone or
        not really off CPU: a thread that set its sleep state but has not left the CPU yet (it may
        never do so, when what it waits for comes first) reads as sleeping in `stat`, but is still
        on its run queue, and `wchan` is "0" for such a thread (get_wchan() in kernel/sched/core.c)."""
        base = f"{self.proc_root}/{tgid}/task/{tid}"
        try:
            with open(f"{base}/stat", encoding="utf-8", errors="replace") as f:
                stat = f.read()
            with open(f"{base}/schedstat", encoding="ascii") as f:
                runs = int(f.read().split()[2])
            with open(f"{base}/wchan", encoding="ascii", errors="replace") as f:
                wchan = f.read().strip()
        except (OSError, ValueError, IndexError):
            return None
        fields = stat[stat.rfind(")") + 2 :].split()
        if not fields or wchan in ("", "0"):
            return None
        return fields[0], runs
