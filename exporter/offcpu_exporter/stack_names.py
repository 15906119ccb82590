"""Stack ids to frames: the aggregator's cache of named stacks, what names a stack that is not a
captured one (lost, seeded, stolen, not sampled), the retries of stacks with an address no mapping
held, and the clean-up of the kernel's stack map.

A stack id is the kernel's hash of its frames (probe/stack_ids.py), so an id names the same frames
for as long as anything references it; the frames of a user half also depend on the process whose
address space they are read in.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Sequence
from typing import Protocol

from offcpu_exporter.interned import Interned
from offcpu_exporter.probe import layout
from offcpu_exporter.probe.maps import KernelMaps, WakerIds
from offcpu_exporter.snapshot import Frame, FrameKind, LostHalf, Stack
from offcpu_exporter.symbols import UNKNOWN as _UNMAPPED  # the frame of an address in no mapping

__all__ = ["FOLDED", "IN_PROGRESS", "NOT_SAMPLED", "StackIds", "StackNames", "Symbolizer", "lost_frame",
           "lost_halves", "reaches_root"]


class Symbolizer(Protocol):
    def kernel(self, addresses: Sequence[int]) -> tuple[Frame, ...]: ...

    def user(self, pid: int, addresses: Sequence[int]) -> tuple[Frame, ...]: ...

    def prepare(self, pid: int) -> None: ...

    def generation(self, pid: int) -> int: ...

    def refresh(self, pid: int) -> int: ...

    def forget(self, pid: int) -> None: ...

    @property
    def failures(self) -> int: ...


# (user stack id, kernel stack id), with wakers on followed by the waker's ids (waker_names.py)
StackIds = tuple[int, int] | tuple[int, int, WakerIds]

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
NOT_SAMPLED: StackIds = (-1, -1)
IN_PROGRESS: StackIds = (-2, -2)
FOLDED: StackIds = (-3, -3)
_SPECIAL_STACKS = {
    NOT_SAMPLED: _placeholder("[stack not sampled]"),
    # kprobe mode captures stacks when the thread wakes: a block still going on has none yet.
    IN_PROGRESS: _placeholder("[still off CPU: stack taken when it wakes]"),
    FOLDED: Stack((lost_frame("COUNTERS"),), ()),
}
_RECLAIMED = (lost_frame("RECLAIMED"),)
_SEEDED_FRAME = Frame("[off CPU since before it was watched]", FrameKind.PLACEHOLDER)
# Reason.STOLEN's one stack: the time went somewhere in a run, no stack says where.
_STOLEN_FRAME = Frame("[stolen: the CPU ran something else without a switch]", FrameKind.PLACEHOLDER)

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


class StackNames:
    """Named stacks by id, each half named once; the one place that frees the kernel's stack map."""

    def __init__(self, probe: KernelMaps, symbolizer: Symbolizer) -> None:
        self.probe = probe
        self.symbolizer = symbolizer
        self.naming_ns = 0  # time spent naming stacks for the first time (the flush resets it per pass)
        self.entries: int | None = None  # stack-map entries left by the last collect()
        self._collects = 0  # ages below are counted in collect() calls: one per flush
        self._kernel_stacks: dict[int, tuple[Frame, ...]] = {}
        # User halves by pid, then by stack id: what a process's exit or exec drops is found without
        # a pass over every process's stacks (thousands of processes, a few exits every flush).
        self._user_stacks: dict[int, dict[int, tuple[Frame, ...]]] = {}
        self._used: dict[int, int] = {}  # stack id -> the collect that last named a stack with it
        self._freed: dict[int, tuple[tuple[int, ...], int]] = {}  # id -> (addresses, collect freed at)
        # (pid, user stack id) -> (symbolizer generation it was named at, give up after)
        self._unresolved: dict[tuple[int, int], tuple[int, float]] = {}
        self._retry_due: dict[int, tuple[float, float]] = {}  # pid -> (next re-read, the delay after it)
        # symbol pid -> (user stack id, kernel stack id) -> the Stack made of the two cached halves:
        # the same object (and its cached hash) every flush, instead of a new one per changed key.
        self._stacks: dict[int, dict[StackIds, Stack]] = {}
        # Processes with a user stack that stops before its thread's root (a frame-pointer walk
        # through code built without them): the pipeline may have their unwind tables built.
        self._truncated: set[int] = set()
        # User halves and stacks are named per process, and the same program in a thousand
        # processes names the same frames a thousand times: equal ones are kept once.
        self._interned_halves: Interned[tuple[Frame, ...]] = Interned()
        self._interned_stacks: Interned[Stack] = Interned()

    def stack(self, pid: int, user_id: int, kernel_id: int) -> Stack:
        """The stack of these ids, its user half named in the address space of `pid`."""
        special = _SPECIAL_STACKS.get((user_id, kernel_id))
        if special is not None:
            return special
        self._used[user_id] = self._used[kernel_id] = self._collects
        named = self._stacks.get(pid)
        if named is not None:
            stack = named.get((user_id, kernel_id))
            if stack is not None:
                return stack
        stack = Stack(self._user_frames(pid, user_id), self._kernel_frames(kernel_id))
        if user_id in self._user_stacks.get(pid, ()) and kernel_id in self._kernel_stacks:
            stack = self._interned_stacks.one(stack)
            self._stacks.setdefault(pid, {})[(user_id, kernel_id)] = stack
        return stack

    def take_truncated(self) -> set[int]:
        """The processes named since the last call with a user stack that stops short of its root."""
        taken, self._truncated = self._truncated, set()
        return taken

    def _addresses(self, stack_id: int) -> tuple[int, ...] | None:
        addresses = self.probe.stack(stack_id)
        if addresses is None and stack_id in self._freed:
            addresses = self._freed[stack_id][0]
        return addresses

    @staticmethod
    def _special_half(stack_id: int) -> tuple[Frame, ...] | None:
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
            self.naming_ns += time.perf_counter_ns() - t0
            self._kernel_stacks[stack_id] = frames
        return frames

    def _user_frames(self, pid: int, stack_id: int) -> tuple[Frame, ...]:
        special = self._special_half(stack_id)
        if special is not None:
            return special
        of_pid = self._user_stacks.get(pid)
        frames = of_pid.get(stack_id) if of_pid is not None else None
        if frames is None:
            addresses = self._addresses(stack_id)
            if addresses is None:
                return _RECLAIMED
            # Taken before naming: a re-read during it makes the next flush try again, not never.
            generation = self.symbolizer.generation(pid)
            t0 = time.perf_counter_ns()
            frames = self._interned_halves.one(self.symbolizer.user(pid, _call_sites(addresses)))
            self.naming_ns += time.perf_counter_ns() - t0
            if not reaches_root(frames):
                self._truncated.add(pid)
            self._user_stacks.setdefault(pid, {})[stack_id] = frames
            if _UNMAPPED in frames:
                self._unresolved[(pid, stack_id)] = (generation, time.monotonic() + _UNRESOLVED_WINDOW_SECONDS)
        return frames

    def collect(self, in_map: set[int], referenced: set[int]) -> None:
        """Frees the stacks of `in_map` (read before the counters and blocks) that nothing in
        `referenced` (the ids of counters and blocks in progress) names. A block that starts after
        those reads may capture a stack that is freed here (the same frames, already in the map): the
        freed stacks' addresses are kept while a block or counter references them, and a few flushes
        more (ids are content hashes, so they still name the same frames)."""
        for sid in referenced & self._freed.keys():
            self._freed[sid] = (self._freed[sid][0], self._collects)  # still in use: kept
        free = in_map - referenced
        for sid in free:
            addresses = self.probe.stack(sid)
            if addresses is not None:
                self._freed[sid] = (addresses, self._collects)
        self.probe.delete_stacks(free)
        self.entries = len(in_map) - len(free)
        for sid in [s for s, (_, at) in self._freed.items() if self._collects - at > _FREED_KEPT_FLUSHES]:
            del self._freed[sid]
        # Names of stacks gone from the kernel and not seen for a while.
        stale = {sid for sid, at in self._used.items()
                 if self._collects - at > _NAMES_KEPT_FLUSHES and sid not in referenced and sid not in self._freed}
        if stale:
            self._forget_ids(stale)
        self._collects += 1

    def _forget_ids(self, ids: set[int]) -> None:
        for sid in ids:
            self._kernel_stacks.pop(sid, None)
            self._used.pop(sid, None)
        for pid, of_pid in list(self._user_stacks.items()):
            for sid in [s for s in of_pid if s in ids]:
                del of_pid[sid]
                self._unresolved.pop((pid, sid), None)
            if not of_pid:
                del self._user_stacks[pid]
        for pid, named in list(self._stacks.items()):
            for pair in [p for p in named if p[0] in ids or p[1] in ids]:
                del named[pair]
            if not named:
                del self._stacks[pid]

    def forget_process(self, pid: int) -> None:
        """Drops what names the user stacks of `pid`: its maps and its named stacks. For a process
        that exec'd (they are the old program's) or expired. Kernel stacks stay."""
        self.symbolizer.forget(pid)
        for sid in self._user_stacks.pop(pid, {}):
            self._unresolved.pop((pid, sid), None)
        self._stacks.pop(pid, None)

    def retry_unresolved(self) -> None:
        """Names again the user stacks with an unmapped address of the processes whose mappings
        changed since (a few processes per flush, each less and less often)."""
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
            of_pid = self._user_stacks.get(pid)
            if addresses is None or of_pid is None or stack_id not in of_pid:
                del self._unresolved[key]
                continue
            frames = self.symbolizer.user(pid, _call_sites(addresses))
            if frames != of_pid[stack_id]:
                # Counts from now on go to the better-named stack; what was counted stays where it was.
                of_pid[stack_id] = frames
                named = self._stacks.get(pid, {})
                for pair in [p for p in named if p[0] == stack_id]:
                    del named[pair]
            if _UNMAPPED not in frames or now >= give_up_at:
                del self._unresolved[key]
            else:
                self._unresolved[key] = (generations[pid], give_up_at)


_NONE_LOST: tuple[LostHalf, ...] = ()


def lost_halves(user_id: int, kernel_id: int, stack: Stack, waker: WakerIds | None = None) -> Sequence[LostHalf]:
    """Each half of a stack (and, with wakers on, of its waker's: "waker user", "waker kernel") that
    was lost, and why; none for most stacks (checked first)."""
    # (A half of another length is not _RECLAIMED: tuples compare their lengths last, after
    # a Python-level Frame.__eq__ on their first frames, for every stack counted.)
    if user_id >= layout.STACK_RESERVED and kernel_id >= layout.STACK_RESERVED and \
            (len(stack.user) != 1 or stack.user != _RECLAIMED) and \
            (len(stack.kernel) != 1 or stack.kernel != _RECLAIMED) and waker is None:
        return _NONE_LOST
    out = []
    if waker is not None:
        for half, sid in (("waker user", waker.user_stack), ("waker kernel", waker.kernel_stack)):
            if layout.STACK_ERRNO_BASE <= sid < layout.STACK_RESERVED:
                number = sid - layout.STACK_ERRNO_BASE
                out.append(LostHalf(half, errno.errorcode.get(number, str(number))))
    for half, sid, frames in (("user", user_id, stack.user), ("kernel", kernel_id, stack.kernel)):
        if layout.STACK_ERRNO_BASE <= sid < layout.STACK_RESERVED:
            number = sid - layout.STACK_ERRNO_BASE
            out.append(LostHalf(half, errno.errorcode.get(number, str(number))))
        elif frames == _RECLAIMED:
            out.append(LostHalf(half, "RECLAIMED"))
    return out


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


def _call_sites(addresses: Sequence[int]) -> tuple[int, ...]:
    """The leaf's pc, then each return address minus one: the call instruction, which belongs to the
    caller even when the call is its last instruction (a call to a function that never returns),
    where the return address itself would be the next function's first byte. gdb names frames so."""
    return (addresses[0], *(a - 1 for a in addresses[1:])) if addresses else ()
