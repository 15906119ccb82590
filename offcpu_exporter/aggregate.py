"""Turns the kernel's cumulative per-key counters into snapshots.

The reference semantics: the kernel keeps cumulative (count, ns) per key; each flush computes the
increase against the value read at the previous flush, skips zero increases, and adds the increase
to user-space totals. Unlike the reference, totals are keyed by the *symbolized* stack (kernel stack
ids are ephemeral), values are never truncated, lost stacks are kept as placeholder frames, and the
kernel maps are drained so they never fill silently:
- a key unchanged for `age_after` flushes is deleted with lookup-and-delete (its last value is
  accounted), and so are all unchanged keys once the map passes its high-water mark;
- a kernel entry that reads lower than before was deleted and re-created: its value is the increase;
- stack ids no longer referenced by any counter or pending switch-out are freed from the stack map.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Protocol

from offcpu_exporter.probe import layout
from offcpu_exporter.probe.loader import Probe, RawKey
from offcpu_exporter.snapshot import (
    ZERO,
    Counter,
    Frame,
    FrameKind,
    Health,
    ProcessInfo,
    ProcessKey,
    ProcessView,
    Reason,
    Snapshot,
    Stack,
    StackSample,
    ThreadView,
)
from offcpu_exporter.symbols import UNKNOWN as _UNMAPPED  # the frame of an address in no mapping
from offcpu_exporter.targets import ProcessTable

__all__ = ["Aggregator", "Symbolizer", "increase", "lost_frame"]

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


def increase(current: tuple[int, int], previous: tuple[int, int] | None) -> tuple[int, int]:
    """The increase of a cumulative kernel counter since the previous read. A value lower than
    the previous one means the entry was deleted and re-created in between: all of it is new."""
    if previous is None or current[0] < previous[0] or current[1] < previous[1]:
        return current
    return current[0] - previous[0], current[1] - previous[1]


def _errno_name(stack_id: int) -> str:
    return errno.errorcode.get(-stack_id, str(-stack_id))


_LOST_WHY = {
    "EEXIST": "stack map collision",  # another stack owns the bucket (no BPF_F_REUSE_STACKID)
    "ENOMEM": "stack map full",
    "EFAULT": "not captured",
    "RECLAIMED": "reclaimed",
}


_REASONS = {r.value: r for r in Reason}  # a dict lookup; Reason(value) is a slow Enum call

# A user stack with an address no mapping held is symbolized again at each flush at which the
# process's maps or perf map changed (Symbolizer.refresh): the code may have been mapped (dlopen) or
# JIT-compiled (perf map written) just after the first look, and counts go to the stack as it was
# named when they were read. Most such stacks only end in the stray address of a frame-pointer walk
# through code built without frame pointers; they are given up on after a while.
_UNRESOLVED_WINDOW_SECONDS = 30.0


def lost_frame(stack_id_or_reason: int | str) -> Frame:
    name = _errno_name(stack_id_or_reason) if isinstance(stack_id_or_reason, int) else stack_id_or_reason
    return Frame(f"[lost stack: {_LOST_WHY.get(name, name)}]", FrameKind.PLACEHOLDER)


@dataclass
class _KeyState:
    value: tuple[int, int]
    idle: int = 0


@dataclass
class AggregateConfig:
    age_after: int = 3  # flushes a kernel key may stay unchanged before it is drained
    high_water: float = 0.8  # counts-map fill at which every unchanged key is drained
    exited_grace_seconds: float = 60.0  # how long an exited process stays in snapshots
    thread_names: bool = True


class Aggregator:
    """The one owner of the kernel maps: reads, diffs, drains, symbolizes, snapshots."""

    def __init__(self, probe: Probe, symbolizer: Symbolizer, processes: ProcessTable,
                 config: AggregateConfig | None = None, *, start_time_ns: int | None = None) -> None:
        self.probe = probe
        self.symbolizer = symbolizer
        self.processes = processes
        self.config = config or AggregateConfig()
        self._keys: dict[RawKey, _KeyState] = {}
        self._totals: dict[tuple[ProcessKey, int, Reason, Stack], Counter] = {}
        self._kernel_stacks: dict[int, tuple[Frame, ...]] = {}
        self._user_stacks: dict[tuple[int, int], tuple[Frame, ...]] = {}
        # (pid, user stack id) -> (symbolizer generation it was named at, give up after)
        self._unresolved: dict[tuple[int, int], tuple[int, float]] = {}
        # (symbol pid, user stack id, kernel stack id) -> the Stack made of the two cached halves:
        # the same object (and its cached hash) every flush, instead of a new one per changed key.
        self._stacks: dict[tuple[int, int, int], Stack] = {}
        self._thread_names: dict[tuple[int, int], str] = {}
        self._lost: dict[str, int] = {}
        self._flushes = 0
        self._last_time_ns = start_time_ns or time.time_ns()
        self.start_time_ns = self._last_time_ns
        self._sequence = 0
        self._children: dict[int, tuple[int, int, str]] = {}
        self._latest = Snapshot.empty(self.start_time_ns)
        self._reclaimable: set[int] = set()
        self._infos: dict[ProcessKey, ProcessInfo] = {}

    # -- one flush -------------------------------------------------------------------------

    def flush(self) -> Snapshot:
        t0 = time.perf_counter()
        read_at_ns = time.time_ns()  # the snapshot's time: the increases run up to this read
        rows = list(self.probe.read_counts())
        changed: list[tuple[RawKey, tuple[int, int]]] = []
        unchanged: list[RawKey] = []
        seen: set[RawKey] = set()
        for raw, count, ns in rows:
            seen.add(raw)
            state = self._keys.get(raw)
            inc = increase((count, ns), state.value if state else None)
            if state is None:
                self._keys[raw] = _KeyState((count, ns))
            else:
                state.value = (count, ns)
            if inc[0] or inc[1]:
                changed.append((raw, inc))
                self._keys[raw].idle = 0
            else:
                self._keys[raw].idle += 1
                unchanged.append(raw)
        # Keys we knew that the kernel no longer has (deleted behind our back): forget them.
        for raw in [k for k in self._keys if k not in seen]:
            del self._keys[raw]

        changed.extend(self._drain(rows, unchanged))
        self._refresh_children()
        self._retry_unresolved()
        increases: dict[tuple[ProcessKey, int, Reason, Stack], Counter] = {}
        for raw, inc in changed:
            self._account(raw, Counter(*inc), increases)
        self._reclaim_stacks()
        expired = self._expire_processes()
        snapshot = self._snapshot(increases, expired, time.perf_counter() - t0, read_at_ns)
        self._latest = snapshot
        return snapshot

    def _drain(self, rows: list[tuple[RawKey, int, int]],
               unchanged: list[RawKey]) -> list[tuple[RawKey, tuple[int, int]]]:
        cap = self.probe.config.max_counts
        if len(rows) >= self.config.high_water * cap:
            victims = unchanged
            if len(rows) - len(victims) >= self.config.high_water * cap:
                # Everything is busy: drain it all; the kernel re-creates keys on the next switch.
                victims = [raw for raw, _, _ in rows]
            log.info("counts map at %d/%d entries: draining %d keys", len(rows), cap, len(victims))
        else:
            victims = [raw for raw in unchanged if self._keys[raw].idle >= self.config.age_after]
        if not victims:
            return []
        extra = []
        final = self.probe.take_counts(victims)
        for raw in victims:
            state = self._keys.pop(raw, None)
            value = final.get(raw)
            if value is not None and state is not None:
                inc = increase(value, state.value)
                if inc[0] or inc[1]:
                    extra.append((raw, inc))
            self._reclaimable.update(sid for sid in (raw[2], raw[3]) if sid >= 0)
        return extra

    def _reclaim_stacks(self) -> None:
        if not self._reclaimable:
            return
        referenced = {sid for raw in self._keys for sid in (raw[2], raw[3])}
        referenced |= self.probe.pending_stack_ids()
        free = self._reclaimable - referenced
        self._reclaimable = set()
        if not free:
            return
        self.probe.delete_stacks(free)
        for sid in free:
            self._kernel_stacks.pop(sid, None)
        for key in [k for k in self._user_stacks if k[1] in free]:
            del self._user_stacks[key]
            self._unresolved.pop(key, None)
        for skey in [k for k in self._stacks if k[1] in free or k[2] in free]:
            del self._stacks[skey]

    def _refresh_children(self) -> None:
        if self.probe.config.follow_children:
            self._children = self.probe.children()

    def _process_of(self, tgid: int) -> ProcessInfo:
        info = self.processes.info(tgid)
        if info is None:
            parent, boot_ns, comm = self._children.get(tgid, (None, 0, ""))
            info = self.processes.adopt(tgid, parent=parent, comm=comm, boot_ns=boot_ns)
        self._infos[info.key] = info
        return info

    def _account(self, raw: RawKey, inc: Counter,
                 increases: dict[tuple[ProcessKey, int, Reason, Stack], Counter]) -> None:
        tgid, tid, user_id, kernel_id, reason_value = raw
        info = self._process_of(tgid)
        symbol_pid = tgid
        child = self._children.get(tgid)
        if child is not None and child[2] == info.comm and self.processes.latest(child[0]) is not None:
            # Forked by a watched process and (same comm) not exec'd since: the parent's address
            # space, which stays readable when a short-lived child is already gone.
            symbol_pid = child[0]
        stack = self._stack(symbol_pid, user_id, kernel_id, inc.count)
        reason = _REASONS.get(reason_value, Reason.OTHER)
        key = (info.key, tid, reason, stack)
        self._totals[key] = self._totals.get(key, ZERO) + inc
        increases[key] = increases.get(key, ZERO) + inc
        if tid and self.config.thread_names and (tgid, tid) not in self._thread_names:
            self._thread_names[(tgid, tid)] = _thread_name(tgid, tid)

    def _stack(self, pid: int, user_id: int, kernel_id: int, count: int) -> Stack:
        key = (pid, user_id, kernel_id)
        stack = self._stacks.get(key)
        if stack is not None:
            return stack
        stack = Stack(self._user_frames(pid, user_id, count), self._kernel_frames(kernel_id, count))
        # Only stacks whose halves are both cached: lost and reclaimed halves are counted (and
        # may resolve differently) every time.
        if (pid, user_id) in self._user_stacks and kernel_id in self._kernel_stacks:
            self._stacks[key] = stack
        return stack

    def _lost_half(self, half: str, stack_id: int, count: int) -> None:
        name = f"{half}:{_errno_name(stack_id)}"
        self._lost[name] = self._lost.get(name, 0) + count

    def _kernel_frames(self, stack_id: int, count: int) -> tuple[Frame, ...]:
        if stack_id < 0:
            self._lost_half("kernel", stack_id, count)
            return (lost_frame(stack_id),)
        frames = self._kernel_stacks.get(stack_id)
        if frames is None:
            addresses = self.probe.stack(stack_id)
            if addresses is None:
                self._lost_half("kernel", -errno.ENOENT, count)
                return (lost_frame("RECLAIMED"),)
            frames = _without_probe_frames(self.symbolizer.kernel(addresses))
            self._kernel_stacks[stack_id] = frames
        return frames

    def _user_frames(self, pid: int, stack_id: int, count: int) -> tuple[Frame, ...]:
        if stack_id < 0:
            self._lost_half("user", stack_id, count)
            # Kernel threads have no user stack (-EFAULT): an empty half, not a lost one.
            return () if stack_id == -errno.EFAULT else (lost_frame(stack_id),)
        frames = self._user_stacks.get((pid, stack_id))
        if frames is None:
            addresses = self.probe.stack(stack_id)
            if addresses is None:
                self._lost_half("user", -errno.ENOENT, count)
                return (lost_frame("RECLAIMED"),)
            # Taken before naming: a re-read during it makes the next flush try again, not never.
            generation = self.symbolizer.generation(pid)
            frames = self.symbolizer.user(pid, addresses)
            self._user_stacks[(pid, stack_id)] = frames
            if _UNMAPPED in frames:
                self._unresolved[(pid, stack_id)] = (generation, time.monotonic() + _UNRESOLVED_WINDOW_SECONDS)
        return frames

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

    def _retry_unresolved(self) -> None:
        if not self._unresolved:
            return
        now = time.monotonic()
        generations = {pid: self.symbolizer.refresh(pid) for pid in {pid for pid, _ in self._unresolved}}
        for key, (seen, give_up_at) in list(self._unresolved.items()):
            pid, stack_id = key
            if generations[pid] == seen:
                if now >= give_up_at:
                    del self._unresolved[key]
                continue
            addresses = self.probe.stack(stack_id)
            if addresses is None or key not in self._user_stacks:
                del self._unresolved[key]
                continue
            frames = self.symbolizer.user(pid, addresses)
            if frames != self._user_stacks[key]:
                # Counts from now on go to the better-named stack; what was counted stays where it was.
                self._user_stacks[key] = frames
                for skey in [k for k in self._stacks if k[0] == pid and k[1] == stack_id]:
                    del self._stacks[skey]
            if _UNMAPPED not in frames or now >= give_up_at:
                del self._unresolved[key]
            else:
                self._unresolved[key] = (generations[pid], give_up_at)

    def _expire_processes(self) -> list[ProcessInfo]:
        gone = self.processes.expire(self.config.exited_grace_seconds)
        if not gone:
            return gone
        keys = {info.key for info in gone}
        for k in [k for k in self._totals if k[0] in keys]:
            del self._totals[k]
        for key in keys:
            self._infos.pop(key, None)
        for info in gone:
            if self.processes.latest(info.pid) is not None:
                continue  # the pid is held by a newer process now: its state is not ours to drop
            self.forget_program(info.pid)
            self.probe.delete_hist(info.pid)
            if self.probe.config.follow_children:
                self.probe.forget_child(info.pid)
            for thread_key in [k for k in self._thread_names if k[0] == info.pid]:
                del self._thread_names[thread_key]
        return gone

    # -- the snapshot ----------------------------------------------------------------------

    def _snapshot(self, increases: dict[tuple[ProcessKey, int, Reason, Stack], Counter],
                  expired: list[ProcessInfo], duration: float, now_ns: int) -> Snapshot:
        self._sequence += 1
        self._flushes += 1
        samples = []
        per_process: dict[ProcessKey, dict[Reason, Counter]] = {}
        for key, total in self._totals.items():
            pkey, tid, reason, stack = key
            samples.append(StackSample(
                process=pkey,
                tid=tid,
                thread_name=self._thread_names.get((pkey.pid, tid), "") if tid else "",
                reason=reason,
                stack=stack,
                total=total,
                increase=increases.get(key, ZERO),
            ))
            by_reason = per_process.setdefault(pkey, {})
            by_reason[reason] = by_reason.get(reason, ZERO) + total

        hist = self.probe.read_hist()
        for pid in self.processes.watched_pids():
            info = self.processes.info(pid)
            if info is not None:
                self._infos[info.key] = info
        threads = _thread_views(samples)
        views: dict[ProcessKey, ProcessView] = {}
        for pkey in set(self._infos) | set(per_process):
            info = self.processes.info_of(pkey) or self._infos.get(pkey) or ProcessInfo(pkey, "[exited]", exited=True)
            by_reason = per_process.get(pkey, {})
            current = self.processes.latest(pkey.pid)
            # The histogram map is keyed by tgid: it belongs to the latest holder of the pid.
            slots = hist.get(pkey.pid) if current is not None and current.key == pkey else None
            views[pkey] = ProcessView(info=info, total=sum(by_reason.values(), ZERO),
                                      by_reason=MappingProxyType(dict(by_reason)),
                                      histogram=tuple(slots) if slots else (),
                                      threads=MappingProxyType(threads.get(pkey, {})))

        health = self._health(duration, counts_entries=len(self._keys))
        snapshot = Snapshot(
            sequence=self._sequence,
            time_ns=now_ns,
            interval_start_ns=self._last_time_ns,
            start_time_ns=self.start_time_ns,
            processes=MappingProxyType(views),
            samples=tuple(samples),
            health=health,
        )
        self._last_time_ns = now_ns
        return snapshot

    def _health(self, duration: float, *, counts_entries: int) -> Health:
        stats = self.probe.stats()
        sizes = self.probe.map_sizes(counts_entries=counts_entries)
        return Health(
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
            }),
            dropped_ns=stats[layout.STAT_COUNTS_DROPPED_NS],
            spilled_stacks=stats[layout.STAT_STACKS_SPILLED],
            symbolization_failures=self.symbolizer.failures,
            flush_duration_seconds=duration,
            flushes=self._flushes,
            targets=len(self.processes),
        )

    def before_first_flush(self) -> Snapshot:
        """The snapshot outputs see until the first flush, with the probe's health filled in once
        it is attached: a scrape right after start must not read as "probe not attached"."""
        if self._latest.sequence == 0 and self.probe.attached:
            self._latest = replace(self._latest, health=self._health(0.0, counts_entries=len(self._keys)))
        return self._latest

    @property
    def latest(self) -> Snapshot:
        return self._latest


# The probe's own frames at the leaf of a kernel stack captured in a (raw) tracepoint or kprobe:
# the BPF program, the tracepoint iterator, the perf/kprobe glue. They say nothing about the wait.
_PROBE_FRAME_PREFIXES = ("bpf_prog_", "bpf_trace_run", "__traceiter_", "__bpf_trace_", "trace_call_bpf",
                         "perf_trace_", "kprobe_", "aggr_pre_handler", "pre_handler_kretprobe")


def _without_probe_frames(frames: tuple[Frame, ...]) -> tuple[Frame, ...]:
    i = 0
    while i < len(frames) - 1 and frames[i].name.startswith(_PROBE_FRAME_PREFIXES):
        i += 1
    return frames[i:]


def _thread_views(samples: Iterable[StackSample]) -> dict[ProcessKey, dict[int, ThreadView]]:
    """Each process's per-thread totals, summed from its per-thread stack totals (samples with a tid)."""
    sums: dict[ProcessKey, dict[int, tuple[str, dict[Reason, Counter]]]] = {}
    for s in samples:
        if s.tid:
            _, by_reason = sums.setdefault(s.process, {}).setdefault(s.tid, (s.thread_name, {}))
            by_reason[s.reason] = by_reason.get(s.reason, ZERO) + s.total
    return {
        pkey: {
            tid: ThreadView(tid, name, sum(by_reason.values(), ZERO), MappingProxyType(by_reason))
            for tid, (name, by_reason) in threads.items()
        }
        for pkey, threads in sums.items()
    }


def _thread_name(tgid: int, tid: int) -> str:
    try:
        with open(f"/proc/{tgid}/task/{tid}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().rstrip("\n")
    except OSError:
        return ""
