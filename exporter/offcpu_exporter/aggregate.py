"""Turns the kernel's cumulative counters into snapshots.

The reference semantics: the kernel keeps cumulative counters per key; each flush computes the
increase against the value read at the previous flush and adds it to user-space totals. Unlike the
reference, totals are keyed by the *symbolized* stack (kernel stack ids are ephemeral), values are
never truncated, lost stacks are kept as placeholder frames, and the kernel maps are drained so they
never fill silently:
- a key unchanged for `age_after` flushes is deleted with lookup-and-delete (its last value is
  accounted), and so are all unchanged keys once the map passes its high-water mark;
- a kernel entry that reads lower than before was deleted and re-created: its value is the increase;
- stacks no longer referenced by any counter or block in progress are freed from the stack map.

Exact and sampled figures. Every block adds to its key's exact (count, ns); a block whose stacks
were captured (all of them, or a bounded sample: see bpf/offcpu.bpf.c) also adds its weight (1 /
the probability of its capture) times its figures to the weighted pair. Per thread (or process)
and reason, each flush splits the exact increase over the stacks in proportion to their weighted
increases (a ratio estimate: unbiased as the sample grows, and the stacks always sum to the exact
total); what no captured stack carries is shown as `[stack not sampled]`.
"""

from __future__ import annotations

import errno
import logging
import operator
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import NamedTuple, Protocol

from offcpu_exporter.clock import ktime_ns, wall_ns_at
from offcpu_exporter.in_progress import Credit, InProgress
from offcpu_exporter.probe import layout
from offcpu_exporter.probe.loader import CounterKey, CounterValue, StartEntry
from offcpu_exporter.probe.maps import KernelMaps
from offcpu_exporter.ratelimit import RateLimitedLog
from offcpu_exporter.rollup import Rollups
from offcpu_exporter.snapshot import (
    ZERO,
    Blocked,
    Counter,
    Frame,
    FrameKind,
    Health,
    LostHalf,
    ProcessInfo,
    ProcessKey,
    ProcessView,
    Reason,
    Snapshot,
    Stack,
    StackSample,
    ThreadView,
    Where,
)
from offcpu_exporter.symbols import UNKNOWN as _UNMAPPED  # the frame of an address in no mapping
from offcpu_exporter.targets import ProcessTable
from offcpu_exporter.wall_bound import WallTimeBound

__all__ = ["AggregateConfig", "Aggregator", "Symbolizer", "apportion", "increase", "lost_frame", "reaches_root"]

log = logging.getLogger(__name__)


class Symbolizer(Protocol):
    def kernel(self, addresses: Sequence[int]) -> tuple[Frame, ...]: ...

    def user(self, pid: int, addresses: Sequence[int]) -> tuple[Frame, ...]: ...

    def prepare(self, pid: int) -> None: ...

    def generation(self, pid: int) -> int: ...

    def refresh(self, pid: int) -> int: ...

    def forget(self, pid: int) -> None: ...

    @property
    def failures(self) -> int: ...


def increase(current: CounterValue, previous: CounterValue | None) -> CounterValue:
    """The increase of a cumulative kernel counter since the previous read. A value lower than
    the previous one means the entry was deleted and re-created in between: all of it is new."""
    if previous is None:
        return current
    # In C (map, min): this runs for every changed key of every flush.
    diff = tuple(map(operator.sub, current, previous))
    return current if min(diff) < 0 else CounterValue._make(diff)


def apportion(total: int, weights: Sequence[int]) -> list[int]:
    """`total` split in proportion to `weights`, in integers that sum to `total` exactly (largest
    remainders get the units left over). All-zero weights get nothing."""
    if len(weights) == 1:  # most groups: one stack
        return [total if total > 0 and weights[0] > 0 else 0]
    whole = sum(weights)
    if whole <= 0 or total <= 0:
        return [0] * len(weights)
    shares = [total * w // whole for w in weights]
    left = total - sum(shares)
    if left:
        by_remainder = sorted(range(len(weights)), key=lambda i: (total * weights[i]) % whole, reverse=True)
        for i in by_remainder[:left]:
            shares[i] += 1
    return shares


_LOST_WHY = {
    "ENOMEM": "stack map full",
    "EFAULT": "not captured",
    "RECLAIMED": "reclaimed",
    "COUNTERS": "counter map full",
}


def lost_frame(why: int | str) -> Frame:
    """`why`: an errno number or a key of _LOST_WHY."""
    name = errno.errorcode.get(why, str(why)) if isinstance(why, int) else why
    return Frame(f"[lost stack: {_LOST_WHY.get(name, name)}]", FrameKind.PLACEHOLDER)


def _placeholder(name: str) -> Stack:
    return Stack((Frame(name, FrameKind.PLACEHOLDER),), ())


# Stacks that are not captured stacks, as (user id, kernel id) pairs no kernel id takes.
_NOT_SAMPLED = (-1, -1)
_IN_PROGRESS = (-2, -2)
_FOLDED = (-3, -3)
_SPECIAL_STACKS = {
    _NOT_SAMPLED: _placeholder("[stack not sampled]"),
    # kprobe mode captures stacks when the thread wakes: a block still going on has none yet.
    _IN_PROGRESS: _placeholder("[still off CPU: stack taken when it wakes]"),
    _FOLDED: Stack((lost_frame("COUNTERS"),), ()),
}
_RECLAIMED = (lost_frame("RECLAIMED"),)
_SEEDED_FRAME = Frame("[off CPU since before it was watched]", FrameKind.PLACEHOLDER)
# Reason.STOLEN's one stack: the time went somewhere in a run, no stack says where.
_STOLEN_FRAME = Frame("[stolen: the CPU ran something else without a switch]", FrameKind.PLACEHOLDER)

_REASONS = {r.value: r for r in Reason}  # a dict lookup; Reason(value) is a slow Enum call

# A user stack with an address no mapping held is symbolized again at each flush at which the
# process's maps or perf map changed (Symbolizer.refresh): the code may have been mapped (dlopen) or
# JIT-compiled (perf map written) just after the first look, and counts go to the stack as it was
# named when they were read. Most such stacks only end in the stray address of a frame-pointer walk
# through code built without frame pointers; they are given up on after a while.
_UNRESOLVED_WINDOW_SECONDS = 30.0
# Each process's maps are re-read for this at most at 1, 2, 4, 8, 16 s intervals, and for at most
# this many processes per flush (the longest waiting first): thousands of processes starting at
# once (a node's pods scheduled, the exporter restarted) do not make each flush read thousands of
# /proc/PID/maps.
_RETRY_FIRST_SECONDS = 1.0
_RETRY_BUDGET = 64
# Freed stacks' addresses are kept this many flushes: a counter the kernel created while the stack
# was being freed still names them (stack ids are content hashes: an id always means the same frames).
_FREED_KEPT_FLUSHES = 3
# Symbolized stacks neither in the kernel nor used for this many flushes are forgotten.
_NAMES_KEPT_FLUSHES = 12
# A snapshot is published at most this long after the moment its figures are counted up to (see
# flush()), unless that many passes in a row each take longer.
_MAX_LAG_NS = 250_000_000
_MAX_PASSES = 4


@dataclass
class _KeyState:
    value: CounterValue
    idle: int = 0


_GroupKey = tuple[int, int, int]  # (tgid, tid, reason)
_StackIds = tuple[int, int]  # (user stack id, kernel stack id)


@dataclass(slots=True)
class _Group:
    """One thread's (or process's) blocks for one reason in one flush: the exact increase and the
    weighted increase of each stack."""

    blocks: int = 0
    ns: int = 0
    stacks: dict[_StackIds, list[int]] = field(default_factory=dict)  # ids -> [weighted blocks, weighted ns]

    def weigh(self, ids: _StackIds, blocks: int, ns: int) -> None:
        w = self.stacks.get(ids)
        if w is None:
            self.stacks[ids] = [blocks, ns]
        else:
            w[0] += blocks
            w[1] += ns


@dataclass(frozen=True)
class AggregateConfig:
    age_after: int = 3  # flushes a kernel key may stay unchanged before it is drained
    high_water: float = 0.8  # counts-map fill at which every unchanged key is drained
    exited_grace_seconds: float = 60.0  # how long an exited process stays in snapshots
    thread_names: bool = True


_RowKey = tuple[ProcessKey, int, Reason, Stack]


class _ViewParts(NamedTuple):
    """What a process's view holds that changes only when its totals do."""

    total: Counter
    by_reason: Mapping[Reason, Counter]
    threads: Mapping[int, ThreadView]


class Aggregator:
    """The one owner of the kernel maps: reads, diffs, drains, symbolizes, snapshots."""

    def __init__(self, probe: KernelMaps, symbolizer: Symbolizer, processes: ProcessTable,
                 config: AggregateConfig | None = None, *, start_time_ns: int | None = None,
                 in_progress: InProgress | None = None) -> None:
        self.probe = probe
        self.symbolizer = symbolizer
        self.processes = processes
        self.config = config or AggregateConfig()
        # Seeded blocks' kernel stacks are named back into addresses with kallsyms (stand-ins may not).
        self.in_progress = in_progress or InProgress(probe, kernel_address=getattr(symbolizer, "kernel_address", None))
        self.wall_bound = WallTimeBound(probe)
        self._keys: dict[CounterKey, _KeyState] = {}
        self._totals: dict[_RowKey, Counter] = {}
        # Sums of _totals kept as they change, and the samples of the last snapshot: a snapshot
        # builds anew only what changed (thousands of processes, most unchanged at each flush).
        self._process_totals: dict[ProcessKey, dict[Reason, Counter]] = {}
        self._thread_totals: dict[ProcessKey, dict[int, dict[Reason, Counter]]] = {}
        self._samples: dict[_RowKey, StackSample] = {}
        self._views: dict[ProcessKey, _ViewParts] = {}
        self._infos_version = -1  # the process table's version _infos has every watched process of
        self._kernel_stacks: dict[int, tuple[Frame, ...]] = {}
        self._user_stacks: dict[tuple[int, int], tuple[Frame, ...]] = {}
        self._used: dict[int, int] = {}  # stack id -> the flush that last named a stack with it
        self._freed: dict[int, tuple[tuple[int, ...], int]] = {}  # id -> (addresses, flush freed at)
        # (pid, user stack id) -> (symbolizer generation it was named at, give up after)
        self._unresolved: dict[tuple[int, int], tuple[int, float]] = {}
        self._retry_due: dict[int, tuple[float, float]] = {}  # pid -> (next re-read, the delay after it)
        # (symbol pid, user stack id, kernel stack id) -> the Stack made of the two cached halves:
        # the same object (and its cached hash) every flush, instead of a new one per changed key.
        self._stacks: dict[tuple[int, int, int], Stack] = {}
        self._thread_names: dict[tuple[int, int], str] = {}
        self._lost: dict[LostHalf, int] = {}
        self._hist: dict[ProcessKey, list[int]] = {}  # cumulative block counts per duration slot
        self._hist_read: dict[int, list[int]] = {}  # tgid -> the kernel's slots at the last read
        self._flushes = 0
        self._naming_ns = 0  # the time this pass spent naming stacks for the first time
        self._stats_read: list[int] = [0] * layout.STAT_MAX
        self._warn = RateLimitedLog(log, interval=300.0)
        self._sampled_ratio = 1.0
        self.start_time_ns = start_time_ns or probe.attached_wall_ns or time.time_ns()
        self._last_time_ns = self.start_time_ns
        self._sequence = 0
        self._children: dict[int, tuple[int, int, str]] = {}
        self._infos: dict[ProcessKey, ProcessInfo] = {}
        self._carried: dict[_RowKey, Counter] = {}  # increases taken between flushes (process_replaced)
        self.rollups = Rollups()
        # Called with a pid whose user stack stops before its thread's root (a frame-pointer walk
        # through code built without them): the pipeline may have its unwind tables built.
        self.on_truncated: Callable[[int], None] | None = None

    # -- one flush -------------------------------------------------------------------------

    def flush(self, *, final: bool = False, until_ns: int | None = None) -> Snapshot:
        """Everything the kernel counted up to now (or up to `until_ns`, CLOCK_MONOTONIC, when
        that is earlier), blocks in progress included. `final`: nothing is counted after it."""
        t0 = time.perf_counter()
        if self._sequence == 0 and self.probe.attached_wall_ns:
            # Counting began when the probe was attached, not when this object was made.
            self.start_time_ns = self._last_time_ns = self.probe.attached_wall_ns
        window_end = final or until_ns is not None
        increases, self._carried = self._carried, {}
        for _ in range(_MAX_PASSES):
            self._naming_ns = 0
            now_k = ktime_ns()
            at = now_k if until_ns is None else min(until_ns, now_k)
            if self.probe.cutoff_ns:
                at = min(at, self.probe.cutoff_ns)  # past the window's end nothing counts
            if window_end:
                self.probe.set_cutoff(at)
            at_wall = wall_ns_at(at)  # a window's wall duration is the kernel time it counts
            in_map, blocked = self._count(at, increases)
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
            if window_end or lag <= _MAX_LAG_NS or self._naming_ns * 2 < lag:
                break
        self._collect_stacks(in_map, blocked)
        expired = self._expire_processes(active={k[0] for k in increases})
        snapshot = self._snapshot(increases, blocked, expired, time.perf_counter() - t0, at_wall, at)
        if window_end:
            # The probe may outlive this pipeline (a probe shared by several): it counts again.
            self.probe.set_cutoff(0)
        return snapshot

    def _count(self, at: int, increases: dict[_RowKey, Counter]) -> tuple[set[int], dict[int, StartEntry]]:
        """One pass: what the kernel counted since the last pass and the blocks in progress up to
        `at`, added to the totals and to `increases`. Returns the stack ids in the map before the
        reads and the blocks in progress after them."""
        groups: dict[_GroupKey, _Group] = {}
        # The stack map first: a stack in it now was stored before the start entry or counter that
        # references it, so the reads below see that reference (see _collect_stacks()).
        in_map = self.probe.stack_ids()
        credits, blocked = self.in_progress.credit(at)
        self._add_credits(groups, credits)
        rows = self.probe.read_counts()
        read_at = ktime_ns()
        changed = self._diff(rows)
        self._refresh_children()
        self._retry_unresolved()
        for key, inc in changed:
            self._add_row(groups, key, inc)
        self.wall_bound.check(groups, read_at)
        for gkey, group in groups.items():
            self._account(gkey, group, increases)
        self.wall_bound.passed(at)
        return in_map, blocked

    def _diff(self, rows: list[tuple[CounterKey, CounterValue]]) -> list[tuple[CounterKey, CounterValue]]:
        changed: list[tuple[CounterKey, CounterValue]] = []
        unchanged: list[CounterKey] = []
        known = self._keys
        for key, value in rows:
            state = known.get(key)
            if state is None:
                known[key] = state = _KeyState(value)
                inc = value
            elif value == state.value:  # most keys at a flush (compared in C, no increase built)
                state.idle += 1
                unchanged.append(key)
                continue
            else:
                inc = increase(value, state.value)
                state.value = value
            if any(inc):
                changed.append((key, inc))
                state.idle = 0
            else:
                state.idle += 1
                unchanged.append(key)
        if len(known) > len(rows):
            # Keys we knew that the kernel no longer has (deleted behind our back): forget them.
            seen = {key for key, _ in rows}
            for key in [k for k in known if k not in seen]:
                del known[key]
        changed.extend(self._drain(len(rows), [k for k, _ in rows], unchanged))
        return changed

    def _drain(self, entries: int, keys: list[CounterKey],
               unchanged: list[CounterKey]) -> list[tuple[CounterKey, CounterValue]]:
        cap = self.probe.config.max_counts
        if entries >= self.config.high_water * cap:
            victims = unchanged
            if entries - len(victims) >= self.config.high_water * cap:
                # Everything is busy: drain it all; the kernel re-creates keys on the next switch.
                victims = keys
            log.info("counts map at %d/%d entries: draining %d keys", entries, cap, len(victims))
        else:
            victims = [key for key in unchanged if self._keys[key].idle >= self.config.age_after]
        if not victims:
            return []
        extra = []
        final = self.probe.take_counts(victims)
        for key in victims:
            state = self._keys.pop(key, None)
            value = final.get(key)
            if value is not None and state is not None:
                inc = increase(value, state.value)
                if any(inc):
                    extra.append((key, inc))
        return extra

    # -- exact and sampled figures -> per-stack increases -----------------------------------

    @staticmethod
    def _add_row(groups: dict[_GroupKey, _Group], key: CounterKey, inc: CounterValue) -> None:
        tgid, tid, reason, user_stack, kernel_stack = key
        blocks, ns, weighted_blocks, weighted_ns = inc
        group = groups.get((tgid, tid, reason))
        if group is None:
            group = groups[(tgid, tid, reason)] = _Group()
        group.blocks += blocks
        group.ns += ns
        if user_stack or kernel_stack:
            group.weigh((user_stack, kernel_stack), weighted_blocks, weighted_ns)
        elif weighted_blocks or weighted_ns:
            # Captured blocks whose own counter could not be created (the map was full).
            group.weigh(_FOLDED, weighted_blocks, weighted_ns)

    def _add_credits(self, groups: dict[_GroupKey, _Group], credits: list[Credit]) -> None:
        kprobe = self.probe.mode == "kprobe"
        per_thread = self.probe.config.per_thread
        for tid, block, ns in credits:
            _, user_stack, kernel_stack, tgid, reason, weight = block
            # Keyed as the kernel keys its counters: without --per-thread, tid 0.
            gkey = (tgid, tid if per_thread else 0, reason)
            group = groups.get(gkey)
            if group is None:
                group = groups[gkey] = _Group()
            group.ns += ns
            if weight and user_stack:
                group.weigh((user_stack, kernel_stack), 0, ns * weight)
            elif kprobe:
                group.weigh(_IN_PROGRESS, 0, ns)
            # Else a block whose stacks were not sampled: its time is spread like the thread's
            # other unsampled blocks, over its sampled stacks.

    def _account(self, gkey: _GroupKey, group: _Group, increases: dict[_RowKey, Counter],
                 owner: ProcessInfo | None = None) -> None:
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
        ids = list(group.stacks)
        blocks = apportion(group.blocks, [group.stacks[i][0] for i in ids])
        nss = apportion(group.ns, [group.stacks[i][1] for i in ids])
        rest = Counter(group.blocks - sum(blocks), group.ns - sum(nss))
        rows = [(i, Counter(b, n)) for i, b, n in zip(ids, blocks, nss, strict=True)]
        if rest:
            rows.append((_NOT_SAMPLED, rest))
        pkey = info.key
        totals = self._totals
        by_reason: dict[Reason, Counter] | None = None
        of_thread: dict[Reason, Counter] | None = None
        for (user_id, kernel_id), inc in rows:
            if not inc:
                continue
            if by_reason is None:  # made only for a process with something counted
                by_reason = self._process_totals.setdefault(pkey, {})
                if tid:
                    of_thread = self._thread_totals.setdefault(pkey, {}).setdefault(tid, {})
            stack = self._stack(symbol_pid, user_id, kernel_id)
            key = (pkey, tid, reason, stack)
            totals[key] = totals.get(key, ZERO) + inc
            increases[key] = increases.get(key, ZERO) + inc
            by_reason[reason] = by_reason.get(reason, ZERO) + inc
            if of_thread is not None:
                of_thread[reason] = of_thread.get(reason, ZERO) + inc
            # Special ids are below STACK_RESERVED; a captured stack's frames may be reclaimed.
            if user_id < layout.STACK_RESERVED or kernel_id < layout.STACK_RESERVED or \
                    stack.user == _RECLAIMED or stack.kernel == _RECLAIMED:
                for lost in _lost_halves(user_id, kernel_id, stack):
                    self._lost[lost] = self._lost.get(lost, 0) + inc.count
        if by_reason is not None:
            self._views.pop(pkey, None)
            self.rollups.add(info.where, reason, group.blocks, group.ns)  # (the rows' sum)
        if tid and self.config.thread_names and (tgid, tid) not in self._thread_names:
            self._thread_names[(tgid, tid)] = _thread_name(tgid, tid)

    # -- stacks ----------------------------------------------------------------------------

    def _process_of(self, tgid: int) -> ProcessInfo:
        info = self.processes.info(tgid)
        if info is None:
            parent, boot_ns, comm = self._children.get(tgid, (None, 0, ""))
            info = self.processes.adopt(tgid, parent=parent, comm=comm, boot_ns=boot_ns)
        self._infos[info.key] = info
        return info

    def _stack(self, pid: int, user_id: int, kernel_id: int) -> Stack:
        special = _SPECIAL_STACKS.get((user_id, kernel_id))
        if special is not None:
            return special
        key = (pid, user_id, kernel_id)
        self._used[user_id] = self._used[kernel_id] = self._flushes
        stack = self._stacks.get(key)
        if stack is not None:
            return stack
        stack = Stack(self._user_frames(pid, user_id), self._kernel_frames(kernel_id))
        if (pid, user_id) in self._user_stacks and kernel_id in self._kernel_stacks:
            self._stacks[key] = stack
        return stack

    def _addresses(self, stack_id: int) -> tuple[int, ...] | None:
        addresses = self.probe.stack(stack_id)
        if addresses is None and stack_id in self._freed:
            addresses = self._freed[stack_id][0]
        return addresses

    def _special_half(self, stack_id: int) -> tuple[Frame, ...] | None:
        """The frames of an id that is not a captured stack; None for a captured one."""
        if stack_id >= layout.STACK_RESERVED:
            return None
        if stack_id == layout.STACK_SEEDED:
            return (_SEEDED_FRAME,)
        if stack_id == layout.STACK_STOLEN:
            return (_STOLEN_FRAME,)
        if stack_id >= layout.STACK_ERRNO_BASE:
            return (lost_frame(stack_id - layout.STACK_ERRNO_BASE),)
        return ()  # STACK_EMPTY: a kernel thread has no user half

    def _kernel_frames(self, stack_id: int) -> tuple[Frame, ...]:
        special = self._special_half(stack_id)
        if special is not None:
            return special
        frames = self._kernel_stacks.get(stack_id)
        if frames is None:
            addresses = self._addresses(stack_id)
            if addresses is None:
                return _RECLAIMED
            t0 = time.perf_counter_ns()
            frames = _without_probe_frames(self.symbolizer.kernel(addresses))
            self._naming_ns += time.perf_counter_ns() - t0
            self._kernel_stacks[stack_id] = frames
        return frames

    def _user_frames(self, pid: int, stack_id: int) -> tuple[Frame, ...]:
        special = self._special_half(stack_id)
        if special is not None:
            return special
        frames = self._user_stacks.get((pid, stack_id))
        if frames is None:
            addresses = self._addresses(stack_id)
            if addresses is None:
                return _RECLAIMED
            # Taken before naming: a re-read during it makes the next flush try again, not never.
            generation = self.symbolizer.generation(pid)
            t0 = time.perf_counter_ns()
            frames = self.symbolizer.user(pid, _call_sites(addresses))
            self._naming_ns += time.perf_counter_ns() - t0
            if self.on_truncated is not None and not reaches_root(frames):
                self.on_truncated(pid)
            self._user_stacks[(pid, stack_id)] = frames
            if _UNMAPPED in frames:
                self._unresolved[(pid, stack_id)] = (generation, time.monotonic() + _UNRESOLVED_WINDOW_SECONDS)
        return frames

    def _collect_stacks(self, in_map: set[int], blocked: dict[int, StartEntry]) -> None:
        """Frees the stacks of `in_map` (read before the counters and blocks) that no counter and no
        block in progress references. A block that starts after those reads may capture a stack
        that is freed here (the same frames, already in the map): the freed stacks' addresses are
        kept while a block or counter references them, and a few flushes more (ids are content
        hashes, so they still name the same frames)."""
        referenced = {k.user_stack for k in self._keys} | {k.kernel_stack for k in self._keys}
        referenced |= {b.user_stack for b in blocked.values()} | {b.kernel_stack for b in blocked.values()}
        for sid in referenced & self._freed.keys():
            self._freed[sid] = (self._freed[sid][0], self._flushes)  # still in use: kept
        free = in_map - referenced
        for sid in free:
            addresses = self.probe.stack(sid)
            if addresses is not None:
                self._freed[sid] = (addresses, self._flushes)
        self.probe.delete_stacks(free)
        self._stack_entries = len(in_map) - len(free)
        for sid in [s for s, (_, at) in self._freed.items() if self._flushes - at > _FREED_KEPT_FLUSHES]:
            del self._freed[sid]
        # Names of stacks gone from the kernel and not seen for a while.
        stale = {sid for sid, at in self._used.items()
                 if self._flushes - at > _NAMES_KEPT_FLUSHES and sid not in referenced and sid not in self._freed}
        if stale:
            self._forget_names(stale)

    def _forget_names(self, ids: set[int]) -> None:
        """Drops the symbolized stacks of these stack ids."""
        for sid in ids:
            self._kernel_stacks.pop(sid, None)
            self._used.pop(sid, None)
        for key in [k for k in self._user_stacks if k[1] in ids]:
            del self._user_stacks[key]
            self._unresolved.pop(key, None)
        for skey in [k for k in self._stacks if k[1] in ids or k[2] in ids]:
            del self._stacks[skey]

    def _refresh_children(self) -> None:
        if self.probe.config.follow_children:
            self._children = self.probe.children()

    def forget_program(self, pid: int) -> None:
        """Drops what names the user stacks of `pid`: its maps and the symbolized stacks. For a
        process that exec'd (they are the old program's) or expired. Kernel stacks and
        everything already counted stay."""
        self.symbolizer.forget(pid)
        for key in [k for k in self._user_stacks if k[0] == pid]:
            del self._user_stacks[key]
            self._unresolved.pop(key, None)
        for skey in [k for k in self._stacks if k[0] == pid]:
            del self._stacks[skey]

    def process_replaced(self, old: ProcessKey) -> None:
        """A new process holds `old`'s pid now: what the kernel holds under that tgid (counters,
        histogram) is the old process's, and is taken out and accounted to it before the new one is
        counted."""
        pid = old.pid
        keys = [k for k in self._keys if k.tgid == pid]
        taken = self.probe.take_counts(keys)
        groups: dict[_GroupKey, _Group] = {}
        for key in keys:
            state = self._keys.pop(key)
            value = taken.get(key)
            if value is not None and any(inc := increase(value, state.value)):
                self._add_row(groups, key, inc)
        slots = self.probe.take_hist(pid)
        info = self.processes.info_of(old)
        if info is not None:  # else past its grace already: its series are gone, and stay gone
            # Reported as part of the next snapshot's increase (what outputs of increases sum).
            for gkey, group in groups.items():
                self._account(gkey, group, self._carried, owner=info)
            self._add_hist(info, pid, slots)
        self._hist_read.pop(pid, None)
        self.forget_program(pid)

    def _retry_unresolved(self) -> None:
        if not self._unresolved:
            self._retry_due.clear()
            return
        now = time.monotonic()
        pids = {pid for pid, _ in self._unresolved}
        for pid in [pid for pid in self._retry_due if pid not in pids]:
            del self._retry_due[pid]
        due = []
        for pid in pids:
            at, _ = self._retry_due.setdefault(pid, (now, _RETRY_FIRST_SECONDS))
            if at <= now:
                due.append((at, pid))
        due.sort()
        generations = {}
        for _, pid in due[:_RETRY_BUDGET]:
            generations[pid] = self.symbolizer.refresh(pid)
            delay = self._retry_due[pid][1]
            self._retry_due[pid] = (now + delay, delay * 2)
        for key, (seen, give_up_at) in list(self._unresolved.items()):
            pid, stack_id = key
            if generations.get(pid, seen) == seen:
                if now >= give_up_at:
                    del self._unresolved[key]
                continue
            addresses = self._addresses(stack_id)
            if addresses is None or key not in self._user_stacks:
                del self._unresolved[key]
                continue
            frames = self.symbolizer.user(pid, _call_sites(addresses))
            if frames != self._user_stacks[key]:
                # Counts from now on go to the better-named stack; what was counted stays where it was.
                self._user_stacks[key] = frames
                for skey in [k for k in self._stacks if k[0] == pid and k[1] == stack_id]:
                    del self._stacks[skey]
            if _UNMAPPED not in frames or now >= give_up_at:
                del self._unresolved[key]
            else:
                self._unresolved[key] = (generations[pid], give_up_at)

    # -- processes -------------------------------------------------------------------------

    def _expire_processes(self, active: set[ProcessKey]) -> list[ProcessInfo]:
        """Forgets processes past their grace, except those counted in this flush: their last
        increase must reach the outputs first (they go at the next flush)."""
        gone = self.processes.expire(self.config.exited_grace_seconds, keep=active)
        if not gone:
            return gone
        keys = {info.key for info in gone}
        for k in [k for k in self._totals if k[0] in keys]:
            del self._totals[k]
            self._samples.pop(k, None)
        for pkey in keys:
            self._process_totals.pop(pkey, None)
            self._thread_totals.pop(pkey, None)
            self._views.pop(pkey, None)
        for key in keys:
            self._infos.pop(key, None)
            self._hist.pop(key, None)
        for info in gone:
            if self.processes.latest(info.pid) is not None:
                continue  # the pid is held by a newer process now: its state is not ours to drop
            self.forget_program(info.pid)
            self.wall_bound.forget(info.pid)
            self.probe.take_hist(info.pid)
            self._hist_read.pop(info.pid, None)
            if self.probe.config.follow_children:
                self.probe.forget_child(info.pid)
            for thread_key in [k for k in self._thread_names if k[0] == info.pid]:
                del self._thread_names[thread_key]
        return gone

    def _add_hist(self, info: ProcessInfo, tgid: int, slots: list[int]) -> None:
        last = self._hist_read.get(tgid)
        self._hist_read[tgid] = slots
        if last is None:
            inc = slots
        elif slots == last:
            return
        else:
            # In C (map, min): every process's histogram is read at every flush.
            inc = list(map(operator.sub, slots, last))
            if min(inc) < 0:
                inc = slots  # deleted and re-created since
        if any(inc):
            total = self._hist.setdefault(info.key, [0] * layout.HIST_SLOTS)
            total[:] = map(operator.add, total, inc)
            self.rollups.add_blocks(info.where, inc)

    def _read_hist(self) -> int:
        """Returns how many entries the kernel's map holds (what map_sizes() would otherwise
        count with a system call per entry)."""
        hist = self.probe.read_hist()
        for tgid, slots in hist.items():
            holder = self.processes.latest(tgid)
            if holder is not None:
                self._add_hist(holder, tgid, slots)
        return len(hist)

    # -- the snapshot ----------------------------------------------------------------------

    def _snapshot(self, increases: dict[_RowKey, Counter], blocked: dict[int, StartEntry],
                  expired: list[ProcessInfo], duration: float, now_ns: int, at_ktime: int) -> Snapshot:
        self._sequence += 1
        self._flushes += 1
        samples = []
        cache = self._samples
        for key, total in self._totals.items():
            increase = increases.get(key, ZERO)
            sample = cache.get(key)
            # Reused when neither changed: the same total object, and no increase now or before.
            if sample is None or sample.total is not total or increase is not ZERO or sample.increase is not ZERO:
                pkey, tid, reason, stack = key
                cache[key] = sample = StackSample(
                    process=pkey,
                    tid=tid,
                    thread_name=self._thread_names.get((pkey.pid, tid), "") if tid else "",
                    reason=reason,
                    stack=stack,
                    total=total,
                    increase=increase,
                )
            samples.append(sample)

        hist_entries = self._read_hist()
        if self.processes.version != self._infos_version:
            self._infos_version = self.processes.version
            for pid in self.processes.watched_pids():
                info = self.processes.info(pid)
                if info is not None:
                    self._infos[info.key] = info
        off_cpu = self._blocked_now(blocked, at_ktime)
        views: dict[ProcessKey, ProcessView] = {}
        wheres: set[Where] = set()
        for pkey in self._infos.keys() | self._process_totals.keys():
            info = self.processes.info_of(pkey) or self._infos.get(pkey) or ProcessInfo(pkey, "[exited]", exited=True)
            wheres.add(info.where)
            parts = self._views.get(pkey)
            if parts is None:
                parts = self._views[pkey] = self._view_parts(pkey)
            slots = self._hist.get(pkey)
            views[pkey] = ProcessView(info=info, total=parts.total, by_reason=parts.by_reason,
                                      histogram=tuple(slots) if slots else (),
                                      blocked=MappingProxyType(off_cpu.get(pkey, {})),
                                      threads=parts.threads)

        health = self._health(duration, counts=len(self._keys), start=len(blocked), hist=hist_entries)
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
        threads = {
            tid: ThreadView(tid, self._thread_names.get((pkey.pid, tid), ""), _sum(of_thread.values()),
                            MappingProxyType(dict(of_thread)))
            for tid, of_thread in of_threads.items()
        } if of_threads else {}
        return _ViewParts(_sum(by_reason.values()), MappingProxyType(dict(by_reason)), MappingProxyType(threads))

    def _blocked_now(self, blocked: dict[int, StartEntry], at: int) -> dict[ProcessKey, dict[Reason, Blocked]]:
        # Summed by (tgid, reason) first: tens of thousands of blocked threads, a few per process.
        earliest: dict[tuple[int, int], list[int]] = {}  # -> [threads, earliest start]
        for block in blocked.values():
            seen = earliest.get((block.tgid, block.reason))
            if seen is None:
                earliest[(block.tgid, block.reason)] = [1, block.ts_ns]
            else:
                seen[0] += 1
                seen[1] = min(seen[1], block.ts_ns)
        out: dict[ProcessKey, dict[Reason, Blocked]] = {}
        for (tgid, reason_value), (threads, since) in earliest.items():
            holder = self.processes.latest(tgid)
            if holder is None:
                continue
            reasons = out.setdefault(holder.key, {})
            reason = _REASONS.get(reason_value, Reason.OTHER)
            longest = max(0, at - since)
            seen_blocked = reasons.get(reason)  # several kernel reasons shown as OTHER
            reasons[reason] = Blocked(threads, longest) if seen_blocked is None else Blocked(
                seen_blocked.threads + threads, max(seen_blocked.longest_ns, longest))
        return out

    def _health(self, duration: float, **sizes_known: int) -> Health:
        stats = self.probe.stats()
        if getattr(self, "_stack_entries", None) is not None:
            sizes_known[layout.MAP_STACKS] = self._stack_entries
        sizes = self.probe.map_sizes(**sizes_known)
        blocks = stats[layout.STAT_BLOCKS] - self._stats_read[layout.STAT_BLOCKS]
        captures = stats[layout.STAT_CAPTURES] - self._stats_read[layout.STAT_CAPTURES]
        if blocks > 0:
            self._sampled_ratio = min(1.0, captures / blocks)
        missed = stats[layout.STAT_MISSED_SWITCH_INS] - self._stats_read[layout.STAT_MISSED_SWITCH_INS]
        if missed > 0:
            self._warn.log(logging.WARNING, "%d blocks ended by a switch-in the kernel did not report: counted up "
                           "to when the thread was picked to run (offcpu_exporter_missed_switch_ins_total)", missed)
        self._stats_read = stats
        run_ns, runs = self.probe.run_time()
        walks: dict[str, int] = {}
        frames: dict[str, int] = {}
        unwinder = self.probe.unwinder
        if unwinder is not None:
            for name, n in unwinder.maps_stats().items():
                if name.startswith("frames_"):
                    frames[name.removeprefix("frames_")] = n
                elif name != "walks_without_tables":
                    walks[name] = n
        return Health(
            unwind_walks=MappingProxyType(walks),
            unwind_frames=MappingProxyType(frames),
            unwind_processes=unwinder.processes if unwinder is not None else 0,
            unwind_no_space=unwinder.no_space if unwinder is not None else 0,
            seeded_stacks=MappingProxyType(dict(self.in_progress.seeded_stacks)),
            attach_mode=self.probe.mode,
            hooked_symbols=self.probe.hooked,
            probe_attached=self.probe.attached,
            lost_stacks=MappingProxyType(dict(self._lost)),
            map_entries=MappingProxyType({k: v[0] for k, v in sizes.items()}),
            map_capacity=MappingProxyType({k: v[1] for k, v in sizes.items()}),
            map_dropped=MappingProxyType({
                layout.MAP_COUNTS: stats[layout.STAT_COUNTS_DROPPED],
                layout.MAP_START: stats[layout.STAT_START_DROPPED],
                layout.MAP_HIST: stats[layout.STAT_HIST_DROPPED],
                layout.MAP_STACKS: stats[layout.STAT_STACKS_DROPPED],
                layout.MAP_PROC_EVENTS: stats[layout.STAT_PROC_EVENTS_DROPPED],
            }),
            dropped_ns=stats[layout.STAT_COUNTS_DROPPED_NS],
            clamped_ns=self.wall_bound.clamped_ns,
            filtered_blocks=stats[layout.STAT_FILTERED],
            filtered_ns=stats[layout.STAT_FILTERED_NS],
            blocks=stats[layout.STAT_BLOCKS],
            missed_switch_ins=stats[layout.STAT_MISSED_SWITCH_INS],
            stack_captures=stats[layout.STAT_CAPTURES],
            stack_sampling=self.probe.config.stack_sampling,
            stack_sampled_ratio=self._sampled_ratio,
            probe_run_ns=run_ns,
            probe_runs=runs,
            symbolization_failures=self.symbolizer.failures,
            flush_duration_seconds=duration,
            flushes=self._flushes,
            targets=len(self.processes),
        )

    def initial_snapshot(self) -> Snapshot:
        """The snapshot outputs see until the first flush, with the probe's health filled in once
        it is attached: a scrape right after start must not read as "probe not attached"."""
        start = self.probe.attached_wall_ns or self.start_time_ns
        if not self.probe.attached:
            return Snapshot.empty(start)
        return replace(Snapshot.empty(start), health=self._health(0.0, counts=len(self._keys)))

    def prepare(self, pid: int) -> None:
        """Read what names a new target's stacks while it is alive (it may exit before a flush)."""
        self.symbolizer.prepare(pid)


# The probe's own frames at the leaf of a kernel stack captured in a (raw) tracepoint or kprobe:
# the BPF program, the tracepoint iterator, the perf/kprobe glue. They say nothing about the wait.
_PROBE_FRAME_PREFIXES = ("bpf_prog_", "bpf_trace_run", "__traceiter_", "__bpf_trace_", "trace_call_bpf",
                         "perf_trace_", "kprobe_", "aggr_pre_handler", "pre_handler_kretprobe")


def _without_probe_frames(frames: tuple[Frame, ...]) -> tuple[Frame, ...]:
    i = 0
    while i < len(frames) - 1 and frames[i].name.startswith(_PROBE_FRAME_PREFIXES):
        i += 1
    return frames[i:]


# The outermost frames of threads: a user stack that ends in one of these is complete.
_ROOT_FUNCTIONS = frozenset({
    "_start", "__libc_start_main", "__libc_start_call_main", "start_thread", "clone", "clone3", "__clone",
    "__clone3", "__clone_internal", "thread_start", "runtime.goexit", "runtime.rt0_go", "runtime.mstart",
})


def reaches_root(frames: Sequence[Frame]) -> bool:
    """Whether a user stack (leaf first) goes down to its thread's first function."""
    return bool(frames) and frames[-1].name.split(" ", 1)[0].split("@", 1)[0] in _ROOT_FUNCTIONS


def _sum(counters: Iterable[Counter]) -> Counter:
    """The sum of a few counters (most processes block for one reason: no addition made then)."""
    total: Counter | None = None
    for counter in counters:
        total = counter if total is None else total + counter
    return total or ZERO


def _call_sites(addresses: Sequence[int]) -> tuple[int, ...]:
    """The leaf's pc, then each return address minus one: the call instruction, which belongs to the
    caller even when the call is its last instruction (a call to a function that never returns),
    where the return address itself would be the next function's first byte. gdb names frames so."""
    return (addresses[0], *(a - 1 for a in addresses[1:])) if addresses else ()


def _lost_halves(user_id: int, kernel_id: int, stack: Stack) -> list[LostHalf]:
    """Each half of a stack that was lost, and why."""
    out = []
    for half, sid, frames in (("user", user_id, stack.user), ("kernel", kernel_id, stack.kernel)):
        if layout.STACK_ERRNO_BASE <= sid < layout.STACK_RESERVED:
            number = sid - layout.STACK_ERRNO_BASE
            out.append(LostHalf(half, errno.errorcode.get(number, str(number))))
        elif frames == _RECLAIMED:
            out.append(LostHalf(half, "RECLAIMED"))
    return out


def _thread_name(tgid: int, tid: int) -> str:
    try:
        with open(f"/proc/{tgid}/task/{tid}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().rstrip("\n")
    except OSError:
        return ""


