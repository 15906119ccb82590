"""Turns what the kernel counted into snapshots: one flush reads the counters (counters.py) and the
blocks in progress (in_progress.py), splits each thread's figures over its stacks (groups.py),
names the stacks (stack_names.py), adds the increases to the totals (stack_rows.py), and builds
the snapshot from the totals, the histograms (histograms.py) and the probe's health
(health_report.py).

Totals are keyed by the *symbolized* stack (kernel stack ids are ephemeral), values are never
truncated, and lost stacks are kept as placeholder frames.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from offcpu_exporter.clock import ktime_ns, wall_ns_at
from offcpu_exporter.counters import CounterDiff
from offcpu_exporter.groups import Group, GroupKey, add_credits, add_row
from offcpu_exporter.health_report import HealthReport
from offcpu_exporter.histograms import Histograms
from offcpu_exporter.in_progress import InProgress
from offcpu_exporter.probe import layout
from offcpu_exporter.probe.maps import KernelMaps, StartEntry
from offcpu_exporter.rollup import Rollups
from offcpu_exporter.snapshot import (
    ZERO,
    Blocked,
    Counter,
    Health,
    LostHalf,
    ProcessInfo,
    ProcessKey,
    ProcessView,
    Reason,
    Snapshot,
    ThreadView,
    Where,
)
from offcpu_exporter.stack_names import StackNames, Symbolizer, lost_halves
from offcpu_exporter.stack_rows import StackRows
from offcpu_exporter.targets import ProcessTable
from offcpu_exporter.waker_names import WakerNames, waker_ids
from offcpu_exporter.wall_bound import WallTimeBound

__all__ = ["AggregateConfig", "Aggregator"]

_REASONS = {r.value: r for r in Reason}  # a dict lookup; Reason(value) is a slow Enum call
# Shared by every view without blocked threads or without threads apart (no --per-thread): made
# once instead of for every process at every flush.
_NOTHING_BLOCKED: Mapping[Reason, Blocked] = MappingProxyType({})
_NO_THREADS: Mapping[int, ThreadView] = MappingProxyType({})

# A snapshot is published at most this long after the moment its figures are counted up to (see
# flush()), unless that many passes in a row each take longer.
_MAX_LAG_NS = 250_000_000
_MAX_PASSES = 4


@dataclass(frozen=True)
class AggregateConfig:
    age_after: int = 3  # flushes a kernel key may stay unchanged before it is drained
    high_water: float = 0.8  # counts-map fill at which every unchanged key is drained
    exited_grace_seconds: float = 60.0  # how long an exited process stays in snapshots
    thread_names: bool = True


class _ViewParts:
    """What a process's view holds that changes only when its totals do, and the last view made
    with them: a process whose totals, histogram and information did not change and that has no
    thread blocked at the flush is shown by the same view again, instead of a new one per flush."""

    __slots__ = ("by_reason", "threads", "total", "view")

    def __init__(self, total: Counter, by_reason: Mapping[Reason, Counter], threads: Mapping[int, ThreadView]) -> None:
        self.total = total
        self.by_reason = by_reason
        self.threads = threads
        self.view: ProcessView | None = None


class Aggregator:
    """The one owner of the kernel maps: each flush reads them, counts and snapshots."""

    def __init__(self, probe: KernelMaps, symbolizer: Symbolizer, processes: ProcessTable,
                 config: AggregateConfig | None = None, *, start_time_ns: int | None = None,
                 in_progress: InProgress | None = None, proc_root: str = "/proc") -> None:
        self.probe = probe
        self.symbolizer = symbolizer
        self.processes = processes
        self.config = config or AggregateConfig()
        self.proc_root = proc_root
        # Seeded blocks' kernel stacks are named back into addresses with kallsyms (stand-ins may not).
        self.in_progress = in_progress or InProgress(probe, proc_root=proc_root,
                                                     kernel_address=getattr(symbolizer, "kernel_address", None))
        self.wall_bound = WallTimeBound(probe)
        self.counters = CounterDiff(probe, age_after=self.config.age_after, high_water=self.config.high_water)
        self.stacks = StackNames(probe, symbolizer)
        self.wakers = WakerNames(self.stacks)  # with --wakers on: who woke each row's blocks
        self.rollups = Rollups()
        self.histograms = Histograms(probe, processes, self.rollups)
        self._health = HealthReport(probe, symbolizer, processes, self.in_progress, self.wall_bound)
        self._rows = StackRows()  # totals per stack, the next snapshot's increases, the last one's samples
        # Sums of the rows' totals kept as they change, and the views of the last snapshot: a snapshot
        # builds anew only what changed (thousands of processes, most unchanged at each flush).
        self._process_totals: dict[ProcessKey, dict[Reason, Counter]] = {}
        self._thread_totals: dict[ProcessKey, dict[int, dict[Reason, Counter]]] = {}
        self._views: dict[ProcessKey, _ViewParts] = {}
        self._counted: set[ProcessKey] = set()  # processes with an increase in the next snapshot
        self._infos_version = -1  # the process table's version _infos has every watched process of
        self._thread_names: dict[tuple[int, int], str] = {}
        self._lost: dict[LostHalf, int] = {}
        self._flushes = 0
        self.start_time_ns = start_time_ns or probe.attached_wall_ns or time.time_ns()
        self._last_time_ns = self.start_time_ns
        self._sequence = 0
        self._children: dict[int, tuple[int, int, str]] = {}
        self._infos: dict[ProcessKey, ProcessInfo] = {}

    # -- one flush -------------------------------------------------------------------------

    def flush(self, *, final: bool = False, until_ns: int | None = None) -> Snapshot:
        """Everything the kernel counted up to now (or up to `until_ns`, CLOCK_MONOTONIC, when
        that is earlier), blocks in progress included. `final`: nothing is counted after it."""
        t0 = time.perf_counter()
        if self._sequence == 0 and self.probe.attached_wall_ns:
            # Counting began when the probe was attached, not when this object was made.
            self.start_time_ns = self._last_time_ns = self.probe.attached_wall_ns
        window_end = final or until_ns is not None
        for _ in range(_MAX_PASSES):
            self.stacks.naming_ns = 0
            now_k = ktime_ns()
            at = now_k if until_ns is None else min(until_ns, now_k)
            if self.probe.cutoff_ns:
                at = min(at, self.probe.cutoff_ns)  # past the window's end nothing counts
            if window_end:
                self.probe.set_cutoff(at)
            at_wall = wall_ns_at(at)  # a window's wall duration is the kernel time it counts
            in_map, blocked = self._count(at)
            # A pass that names many new stacks (a large binary's symbols read for the first time)
            # takes seconds: its figures are as of its start. Published that late, they would be
            # read as the figures of the moment they appear, and a window between such a snapshot
            # and a timely one would hold more off-CPU time than wall time. So the blocks counted
            # meanwhile are counted too, by another pass, whose stacks are mostly named already.
            # (A window's end needs none: the kernel counts nothing after it.) Only a pass that
            # spent at least half its time naming new stacks is repeated: one that is slow by
            # itself (the reads and sums of tens of thousands of threads) would be as slow again,
            # and publish as late, at twice the cost (every flush of a 10,000-process node).
            lag = ktime_ns() - at
            if window_end or lag <= _MAX_LAG_NS or self.stacks.naming_ns * 2 < lag:
                break
        referenced = self.counters.stack_ids() | self.probe.waker_stack_ids()  # (wakers of blocks in progress)
        referenced |= {b.user_stack for b in blocked.values()} | {b.kernel_stack for b in blocked.values()}
        self.stacks.collect(in_map, referenced)
        expired = self._expire_processes(active=self._counted)
        snapshot = self._snapshot(blocked, expired, time.perf_counter() - t0, at_wall, at)
        if window_end:
            # The probe may outlive this pipeline (a probe shared by several): it counts again.
            self.probe.set_cutoff(0)
        return snapshot

    def _count(self, at: int) -> tuple[set[int], dict[int, StartEntry]]:
        """One pass: what the kernel counted since the last pass and the blocks in progress up to
        `at`, added to the totals and to the next snapshot's increases. Returns the stack ids in the map before the
        reads and the blocks in progress after them."""
        groups: dict[GroupKey, Group] = {}
        # The stack map first: a stack in it now was stored before the start entry or counter that
        # references it, so the reads below see that reference (see StackNames.collect()).
        in_map = self.probe.stack_ids()
        credits, blocked = self.in_progress.credit(at)
        add_credits(groups, credits, kprobe=self.probe.mode == "kprobe", per_thread=self.probe.config.per_thread)
        rows = self.probe.read_counts()
        read_at = ktime_ns()
        changed = self.counters.diff(rows)
        if self.probe.config.follow_children:
            self._children = self.probe.children()
        self.stacks.retry_unresolved()
        for key, inc in changed:
            add_row(groups, key, inc)
        self.wall_bound.check(groups, read_at)
        for gkey, group in groups.items():
            self._account(gkey, group)
        self.wall_bound.passed(at)
        return in_map, blocked

    def _account(self, gkey: GroupKey, group: Group, owner: ProcessInfo | None = None) -> None:
        """Adds a group's increase to the totals, split over its stacks; to `owner` instead of the
        process that holds the tgid now when given."""
        tgid, tid, reason_value = gkey
        info = owner or self._process_of(tgid)
        symbol_pid = tgid
        child = self._children.get(tgid)
        if child is not None and child[2] == info.comm and self.processes.latest(child[0]) is not None:
            # Forked by a watched process and (same comm) not exec'd since: the parent's address
            # space, which stays readable when a short-lived child is already gone.
            symbol_pid = child[0]
        reason = _REASONS.get(reason_value, Reason.OTHER)
        rows = group.split()
        pkey = info.key
        add = self._rows.add
        stack_of, waker_of = self.stacks.stack, (self.wakers.of_row if self.probe.config.wakers else None)
        by_reason: dict[Reason, Counter] | None = None
        of_thread: dict[Reason, Counter] | None = None
        for ids, inc in rows:
            user_id, kernel_id = ids[0], ids[1]
            if not inc.count and not inc.ns:  # (not Counter.__bool__: a Python call per row)
                continue
            if by_reason is None:  # made only for a process with something counted
                by_reason = self._process_totals.get(pkey)
                if by_reason is None:
                    by_reason = self._process_totals[pkey] = {}
                    # Every process with totals is in _infos (the snapshot's processes are those).
                    self._infos.setdefault(pkey, info)
                if tid:
                    of_thread = self._thread_totals.setdefault(pkey, {}).setdefault(tid, {})
            stack = stack_of(symbol_pid, user_id, kernel_id)
            add((pkey, tid, reason, stack, waker_of(ids) if waker_of else None), inc)
            # (Counters are immutable: a first increase is the total itself, without an addition.)
            seen = by_reason.get(reason)
            by_reason[reason] = inc if seen is None else seen + inc
            if of_thread is not None:
                seen = of_thread.get(reason)
                of_thread[reason] = inc if seen is None else seen + inc
            for lost in lost_halves(user_id, kernel_id, stack, waker_ids(ids) if waker_of else None):
                self._lost[lost] = self._lost.get(lost, 0) + inc.count
        if by_reason is not None:
            self._counted.add(pkey)  # its view is made again
            self.rollups.add(info.where, reason, group.blocks, group.ns)  # (the rows' sum)
        if tid and self.config.thread_names and (tgid, tid) not in self._thread_names:
            self._thread_names[(tgid, tid)] = _thread_name(self.proc_root, tgid, tid)

    def _process_of(self, tgid: int) -> ProcessInfo:
        info = self.processes.info(tgid)
        if info is None:
            parent, boot_ns, comm = self._children.get(tgid, (None, 0, ""))
            info = self.processes.adopt(tgid, parent=parent, comm=comm, boot_ns=boot_ns)
        self._infos[info.key] = info
        return info

    # -- processes -------------------------------------------------------------------------

    def forget_program(self, pid: int) -> None:
        """Drops what names the user stacks of `pid` (a process that exec'd: they are the old
        program's). Everything already counted stays."""
        self.stacks.forget_process(pid)

    def process_replaced(self, old: ProcessKey) -> None:
        """A new process holds `old`'s pid now: what the kernel holds under that tgid (counters,
        histogram) is the old process's, and is taken out and accounted to it before the new one is
        counted."""
        pid = old.pid
        groups: dict[GroupKey, Group] = {}
        for key, inc in self.counters.take_process(pid):
            add_row(groups, key, inc)
        info = self.processes.info_of(old)
        if info is not None:  # else past its grace already: its series are gone, and stay gone
            # Reported as part of the next snapshot's increase (what outputs of increases sum).
            for gkey, group in groups.items():
                self._account(gkey, group, owner=info)
        self.histograms.take(pid, info)
        self.stacks.forget_process(pid)

    def take_truncated(self) -> set[int]:
        """Processes named since the last call with a user stack that stops short of its thread's
        root (a frame-pointer walk through code built without them): candidates for unwind tables."""
        return self.stacks.take_truncated()

    def _expire_processes(self, active: set[ProcessKey]) -> list[ProcessInfo]:
        """Forgets processes past their grace, except those counted in this flush: their last
        increase must reach the outputs first (they go at the next flush)."""
        gone = self.processes.expire(self.config.exited_grace_seconds, keep=active)
        if not gone:
            return gone
        keys = {info.key for info in gone}
        self._rows.forget(keys)
        for pkey in keys:
            self._process_totals.pop(pkey, None)
            self._thread_totals.pop(pkey, None)
            self._views.pop(pkey, None)
        for key in keys:
            self._infos.pop(key, None)
        self.histograms.forget(keys)
        for info in gone:
            if self.processes.latest(info.pid) is not None:
                continue  # the pid is held by a newer process now: its state is not ours to drop
            self.stacks.forget_process(info.pid)
            self.wall_bound.forget(info.pid)
            self.histograms.take(info.pid, None)
            if self.probe.config.follow_children:
                self.probe.forget_child(info.pid)
            for thread_key in [k for k in self._thread_names if k[0] == info.pid]:
                del self._thread_names[thread_key]
        return gone

    # -- the snapshot ----------------------------------------------------------------------

    def _snapshot(self, blocked: dict[int, StartEntry], expired: list[ProcessInfo], duration: float, now_ns: int,
                  at_ktime: int) -> Snapshot:
        self._sequence += 1
        self._flushes += 1
        samples = self._rows.samples(self._thread_names)
        for pkey in self._counted:
            self._views.pop(pkey, None)
        self._counted = set()
        hist_entries = self.histograms.read()
        if self.processes.version != self._infos_version:
            # Only the processes changed since (see ProcessTable.changed_since()).
            changed = self.processes.changed_since(self._infos_version)
            self._infos_version = self.processes.version
            watched = self.processes.watched
            for pid in self.processes.watched_pids() if changed is None else [p for p in changed if watched(p)]:
                info = self.processes.info(pid)
                if info is not None:
                    self._infos[info.key] = info
        off_cpu = _blocked_now(blocked, at_ktime, self.processes)
        views: dict[ProcessKey, ProcessView] = {}
        wheres: set[Where] = set()
        info_of, histogram_of, made = self.processes.info_of, self.histograms.get, self._views
        # (Every process with totals is in _infos: see _account().)
        for pkey, known in self._infos.items():
            info = info_of(pkey) or known
            wheres.add((info.namespace, info.pod, info.container))  # (info.where, without its call)
            parts = made.get(pkey)
            if parts is None:
                parts = made[pkey] = self._view_parts(pkey)
            now = off_cpu.get(pkey)
            histogram = histogram_of(pkey)
            view = parts.view
            if view is None or now is not None or view.blocked is not _NOTHING_BLOCKED or view.info is not info \
                    or view.histogram is not histogram:
                view = parts.view = ProcessView(info, parts.total, parts.by_reason, histogram,
                                                _NOTHING_BLOCKED if now is None else MappingProxyType(now),
                                                parts.threads)
            views[pkey] = view

        health = self._health_now(duration, counts=len(self.counters), start=len(blocked), hist=hist_entries)
        snapshot = Snapshot(
            sequence=self._sequence,
            time_ns=now_ns,
            interval_start_ns=self._last_time_ns,
            start_time_ns=self.start_time_ns,
            processes=MappingProxyType(views),
            samples=tuple(samples),
            health=health,
            everything=self.rollups.everything(),
            containers=self.rollups.containers(wheres),
        )
        self._last_time_ns = now_ns
        return snapshot

    def _view_parts(self, pkey: ProcessKey) -> _ViewParts:
        """A process's totals as a snapshot shows them, made again only after they changed."""
        by_reason = self._process_totals.get(pkey, {})
        of_threads = self._thread_totals.get(pkey)
        threads = MappingProxyType({
            tid: ThreadView(tid, self._thread_names.get((pkey.pid, tid), ""), _sum(of_thread.values()),
                            MappingProxyType(dict(of_thread)))
            for tid, of_thread in of_threads.items()
        }) if of_threads else _NO_THREADS
        return _ViewParts(_sum(by_reason.values()), MappingProxyType(dict(by_reason)), threads)

    def _health_now(self, duration: float, **sizes_known: int) -> Health:
        if self.stacks.entries is not None:
            sizes_known[layout.MAP_STACKS] = self.stacks.entries
        return self._health.health(duration, flushes=self._flushes, lost_stacks=self._lost, **sizes_known)

    def initial_snapshot(self) -> Snapshot:
        """The snapshot outputs see until the first flush, with the probe's health filled in once
        it is attached: a scrape right after start must not read as "probe not attached"."""
        start = self.probe.attached_wall_ns or self.start_time_ns
        if not self.probe.attached:
            return Snapshot.empty(start)
        return replace(Snapshot.empty(start), health=self._health_now(0.0, counts=len(self.counters)))

    def prepare(self, pid: int) -> None:
        """Read what names a new target's stacks while it is alive (it may exit before a flush)."""
        self.symbolizer.prepare(pid)


def _sum(counters: Iterable[Counter]) -> Counter:
    """The sum of a few counters (most processes block for one reason: no addition made then)."""
    total: Counter | None = None
    for counter in counters:
        total = counter if total is None else total + counter
    return total or ZERO


def _thread_name(proc_root: str, tgid: int, tid: int) -> str:
    try:
        with open(f"{proc_root}/{tgid}/task/{tid}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().rstrip("\n")
    except OSError:
        return ""


def _blocked_now(blocked: dict[int, StartEntry], at: int,
                 processes: ProcessTable) -> dict[ProcessKey, dict[Reason, Blocked]]:
    """The blocks going on at `at`, per process and reason: how many threads, and the longest."""
    # Summed by (tgid, reason) first: tens of thousands of blocked threads, a few per process.
    earliest: dict[tuple[int, int], list[int]] = {}  # -> [threads, earliest start]
    for ts_ns, _, _, tgid, reason_value, _ in blocked.values():  # (unpacked: no attribute calls)
        seen = earliest.get((tgid, reason_value))
        if seen is None:
            earliest[(tgid, reason_value)] = [1, ts_ns]
        else:
            seen[0] += 1
            if ts_ns < seen[1]:
                seen[1] = ts_ns
    out: dict[ProcessKey, dict[Reason, Blocked]] = {}
    latest = processes.latest
    for (tgid, reason_value), (threads, since) in earliest.items():
        holder = latest(tgid)
        if holder is None:
            continue
        reasons = out.get(holder.key)
        if reasons is None:
            reasons = out[holder.key] = {}
        reason = _REASONS.get(reason_value, Reason.OTHER)
        longest = at - since if at > since else 0
        seen_blocked = reasons.get(reason)  # several kernel reasons shown as OTHER
        reasons[reason] = Blocked(threads, longest) if seen_blocked is None else Blocked(
            seen_blocked.threads + threads, max(seen_blocked.longest_ns, longest))
    return out
