"""The immutable value produced once per flush; every sink reads only this.

Frames are leaf first inside each half of a stack (as the kernel returns them). A stack whose
kernel or user half could not be captured carries one placeholder frame naming the reason, so
that every output shows it instead of dropping the time.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

from offcpu_exporter.frozen_init import quick_init

__all__ = [
    "HISTOGRAM_BUCKETS_US",
    "SWITCH_REASONS",
    "Blocked",
    "Counter",
    "Frame",
    "FrameKind",
    "Health",
    "LostHalf",
    "ProcessInfo",
    "ProcessKey",
    "ProcessView",
    "Reason",
    "Snapshot",
    "Stack",
    "StackSample",
    "ThreadView",
    "Waker",
    "WakerKind",
]


class Reason(enum.IntEnum):
    """Why a thread was off CPU, from the task state at switch-out (values shared with bpf/offcpu.h)."""

    RUNNABLE = 0  # preempted: it wanted the CPU (run-queue wait)
    SLEEPING = 1  # TASK_INTERRUPTIBLE: sleeps, futex waits, poll/epoll, pipe/socket reads
    UNINTERRUPTIBLE = 2  # TASK_UNINTERRUPTIBLE: disk I/O, some locks (the D state)
    OTHER = 3  # stopped, traced, parked, dead
    # Current on a CPU that ran something else without a switch: a hypervisor's other guests
    # (steal), interrupts (with IRQ time accounting). Not in the task's CPU time; no stack.
    STOLEN = 4

    @property
    def label(self) -> str:
        return self.name.lower()


# The reasons a thread leaves the CPU for: switches and blocks in progress have one of these
# (Reason.STOLEN is time lost without a switch).
SWITCH_REASONS = tuple(r for r in Reason if r is not Reason.STOLEN)


class FrameKind(enum.Enum):
    KERNEL = "kernel"
    NATIVE = "native"
    JIT = "jit"  # named from a perf map (/tmp/perf-PID.map)
    PLACEHOLDER = "placeholder"  # [lost stack], [unknown]; never has an address


@quick_init
@dataclass(frozen=True, slots=True)
class Frame:
    """One symbolized frame. `name` is what people read; unresolved frames are placeholders
    such as ``[unknown] libfoo.so+0x1a2b``. `module` is the mapped file's path (or ``[kernel]``,
    ``[vdso]``, a kernel module name), `offset` the address's offset in that file, `build_id`
    the file's GNU build id in hex when known."""

    name: str
    kind: FrameKind = FrameKind.NATIVE
    module: str = ""
    offset: int = 0
    build_id: str = ""
    # Frames and stacks are dictionary keys on every flush and in every encoder: hash once.
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.name, self.kind, self.module, self.offset, self.build_id)))

    def __hash__(self) -> int:
        return self._hash

    @property
    def module_basename(self) -> str:
        return self.module.rsplit("/", 1)[-1]


@quick_init
@dataclass(frozen=True, slots=True)
class Stack:
    """A symbolized off-CPU stack: the user half and the kernel half, each leaf first."""

    user: tuple[Frame, ...]
    kernel: tuple[Frame, ...]
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.user, self.kernel)))

    def __hash__(self) -> int:
        return self._hash

    @property
    def stack_id(self) -> str:
        """Stable id: a hash of the symbolized frames, so it survives kernel stack-id reuse,
        address-space randomization and exporter restarts."""
        return _stack_id(self)

    def root_to_leaf(self) -> tuple[Frame, ...]:
        """User frames root..leaf, then kernel frames entry..leaf (the folded-stack order)."""
        return tuple(reversed(self.user)) + tuple(reversed(self.kernel))

    def leaf_to_root(self) -> tuple[Frame, ...]:
        """Kernel frames leaf..entry, then user frames leaf..root (pprof/OTLP location order)."""
        return self.kernel + self.user

    @property
    def user_function(self) -> str:
        """The blocking user function: the innermost user frame (or a placeholder)."""
        return self.user[0].name if self.user else "[no user stack]"

    @property
    def kernel_function(self) -> str:
        """The kernel wait function: the innermost kernel frame below the scheduler itself."""
        for frame in self.kernel:
            if not _is_scheduler_frame(frame.name):
                return frame.name
        return self.kernel[0].name if self.kernel else "[no kernel stack]"

    def folded(self, comm: str = "") -> str:
        parts = [comm] if comm else []
        parts.extend(f.name.replace(";", ":") for f in self.root_to_leaf())
        return ";".join(parts)


_SCHEDULER_FRAMES = (
    "finish_task_switch",
    "__schedule",
    "schedule",
    "schedule_idle",
    "preempt_schedule",
    "__traceiter_sched_switch",
    "bpf_",
    "__bpf",
    "perf_trace",
    "trace_call_bpf",
    "io_schedule",
)


def _is_scheduler_frame(name: str) -> bool:
    base = name.split(" ", 1)[0].split(".", 1)[0]
    return base.startswith(_SCHEDULER_FRAMES)


_stack_id_cache: dict[Stack, str] = {}


def _stack_id(stack: Stack) -> str:
    cached = _stack_id_cache.get(stack)
    if cached is not None:
        return cached
    h = hashlib.blake2b(digest_size=8)
    for half in (stack.user, stack.kernel):
        for f in half:
            h.update(f.name.encode("utf-8", "surrogateescape"))
            h.update(b"\0")
            h.update(f.module_basename.encode("utf-8", "surrogateescape"))
            h.update(b"\1")
        h.update(b"\2")
    value = h.hexdigest()
    if len(_stack_id_cache) > 200_000:
        _stack_id_cache.clear()
    _stack_id_cache[stack] = value
    return value


@quick_init
@dataclass(frozen=True, slots=True)
class Counter:
    """Switch count and off-CPU nanoseconds (the reference's Times and Deltas)."""

    count: int = 0
    ns: int = 0

    def __add__(self, other: Counter) -> Counter:
        return Counter(self.count + other.count, self.ns + other.ns)

    def __sub__(self, other: Counter) -> Counter:
        return Counter(self.count - other.count, self.ns - other.ns)

    def __bool__(self) -> bool:
        return self.count != 0 or self.ns != 0

    @property
    def seconds(self) -> float:
        return self.ns / 1e9


ZERO = Counter()


class LostHalf(NamedTuple):
    """A half of a stack that was not captured, and why (the keys of Health.lost_stacks)."""

    half: str  # "user" | "kernel"
    reason: str  # an errno name (ENOMEM: the stack map was full; EFAULT: not captured) or "RECLAIMED"


class ProcessKey(NamedTuple):
    """A process identity that survives PID reuse: the pid and its start time in clock ticks
    since boot (field 22 of /proc/PID/stat)."""

    # A NamedTuple, hashed in C: a key of every per-process and per-stack table of the aggregator,
    # hashed about twenty times per process and flush (as a dataclass, each a Python call).
    pid: int
    start_ticks: int


Where = tuple[str, str, str]  # (namespace, pod, container)


@quick_init
@dataclass(frozen=True, slots=True)
class ProcessInfo:
    key: ProcessKey
    comm: str
    exe: str = ""  # resolved /proc/PID/exe, "" when unreadable
    cmdline: tuple[str, ...] = ()
    container_id: str = ""
    pod_uid: str = ""
    namespace: str = ""
    pod: str = ""
    container: str = ""
    exited: bool = False

    @property
    def pid(self) -> int:
        return self.key.pid

    @property
    def exe_name(self) -> str:
        return self.exe.rsplit("/", 1)[-1] if self.exe else self.comm

    @property
    def where(self) -> Where:
        """(namespace, pod, container); all three empty outside pods."""
        return (self.namespace, self.pod, self.container)


@quick_init
@dataclass(frozen=True, slots=True)
class StackSample:
    """One row of the per-stack table: cumulative totals since the exporter started and the
    increase since the previous snapshot. `tid` is 0 when aggregating per process."""

    process: ProcessKey
    tid: int
    thread_name: str
    reason: Reason
    stack: Stack
    total: Counter
    increase: Counter
    waker: Waker | None = None  # with --wakers on, who woke these blocks; None: off or unknown


class WakerKind(enum.Enum):
    """What woke a block (with --wakers on)."""

    TASK = "task"  # a thread: its pid, tid, comm and stacks
    TIMER = "timer"  # a timer's expiry (hrtimer_wakeup), run in interrupt context
    SOFTIRQ = "softirq"  # a softirq run at an interrupt's exit or at local_bh_enable()
    INTERRUPT = "interrupt"  # another hard interrupt (or an NMI)


@quick_init
@dataclass(frozen=True, slots=True)
class Waker:
    """Who woke the blocks of a row. From interrupt context no task is the waker: pid, tid and
    comm are then 0 and "", `user` is empty and `kernel` shows the wake-up's path."""

    kind: WakerKind
    pid: int
    tid: int
    comm: str
    user: tuple[Frame, ...]  # leaf first, as Stack's halves
    kernel: tuple[Frame, ...]

    @property
    def name(self) -> str:
        """The waker's comm, or its kind as a marker: `[timer]`, `[softirq]`, `[interrupt]`."""
        return self.comm if self.kind is WakerKind.TASK else f"[{self.kind.value}]"

    def leaf_to_root(self) -> tuple[Frame, ...]:
        """Kernel frames leaf..entry, then user frames leaf..root (offwaketime's waker order)."""
        return self.kernel + self.user


# Block-duration histogram buckets: upper bounds in microseconds, powers of two from 1 us
# to 2^25 us (~33.5 s), then +Inf. Shared with the BPF side (log2 slot of the duration in us).
HISTOGRAM_BUCKETS_US: tuple[int, ...] = tuple(1 << i for i in range(26))


@quick_init
@dataclass(frozen=True, slots=True)
class Blocked:
    """Threads of a process off CPU right now, for one reason: how many, and since when the one
    blocked longest (the time it has been off CPU so far, up to the snapshot)."""

    threads: int
    longest_ns: int

    @property
    def longest_seconds(self) -> float:
        return self.longest_ns / 1e9


@quick_init
@dataclass(frozen=True, slots=True)
class ThreadView:
    """One thread's cumulative totals (only with --per-thread; `name` is its comm when first seen)."""

    tid: int
    name: str
    total: Counter
    by_reason: Mapping[Reason, Counter]


@quick_init
@dataclass(frozen=True, slots=True)
class ProcessView:
    info: ProcessInfo
    total: Counter
    by_reason: Mapping[Reason, Counter]
    # Cumulative non-cumulative-bucket counts: histogram[i] = blocks with duration in slot i
    # (slot i covers [2^(i-1), 2^i) us; the last slot also takes everything longer).
    histogram: tuple[int, ...] = ()
    blocked: Mapping[Reason, Blocked] = field(default_factory=dict)  # off CPU at the snapshot
    # tid -> totals; empty when summing per process (without --per-thread)
    threads: Mapping[int, ThreadView] = field(default_factory=lambda: MappingProxyType({}))


@quick_init
@dataclass(frozen=True, slots=True)
class Health:
    """The exporter's own counters (cumulative since start unless said otherwise)."""

    attach_mode: str = ""  # "kprobe" | "tracepoint"
    hooked_symbols: tuple[str, ...] = ()
    probe_attached: bool = False
    lost_stacks: Mapping[LostHalf, int] = field(default_factory=dict)  # switches with a lost half
    map_entries: Mapping[str, int] = field(default_factory=dict)  # map -> entries now
    map_capacity: Mapping[str, int] = field(default_factory=dict)  # map -> max entries
    map_dropped: Mapping[str, int] = field(default_factory=dict)  # map -> updates refused (full)
    dropped_ns: int = 0  # off-CPU ns the kernel measured but could not store (counter map full)
    clamped_ns: int = 0  # off-CPU ns taken off threads that would have had more than wall time (a bug)
    filtered_blocks: int = 0  # blocks outside --min-block/--max-block
    filtered_ns: int = 0
    blocks: int = 0  # blocks the kernel counted
    missed_switch_ins: int = 0  # blocks whose ending switch-in no sched_switch reported (end estimated)
    stack_captures: int = 0  # of those, the ones whose stacks were captured
    stack_sampling: bool = False  # captures are a bounded sample (else every block's)
    stack_sampled_ratio: float = 1.0  # captures / blocks over the last flush interval
    probe_run_ns: int = 0  # CPU time in the probe's programs (0 unless the kernel times BPF programs)
    probe_runs: int = 0
    probe_skipped_runs: int = 0  # runs the kernel skipped (its recursion guard): switches not seen
    unwind_walks: Mapping[str, int] = field(default_factory=dict)  # DWARF unwinder: how walks ended
    unwind_frames: Mapping[str, int] = field(default_factory=dict)  # frames stepped, by method
    unwind_processes: int = 0  # processes with unwind tables now
    unwind_no_space: int = 0  # tables that did not fit in the maps (frame pointers for them)
    # Blocks seeded at the start of watching (already off CPU), by their stacks: "captured" (read
    # from /proc, the user half down to the thread's root), "truncated" (the user half stops
    # short), "placeholder" ([off CPU since before it was watched]: a half could not be read).
    seeded_stacks: Mapping[str, int] = field(default_factory=dict)
    symbolization_failures: int = 0
    flush_duration_seconds: float = 0.0  # of the flush that produced this snapshot
    flushes: int = 0
    targets: int = 0


@quick_init
@dataclass(frozen=True, slots=True)
class Rollup:
    """Blocks summed over processes, exited ones included: increases accumulated as they were
    counted, so that an exit never lowers them (rollup.py)."""

    total: Counter = ZERO
    by_reason: Mapping[Reason, Counter] = field(default_factory=lambda: MappingProxyType({}))
    histogram: tuple[int, ...] = ()  # as ProcessView.histogram


@quick_init
@dataclass(frozen=True, slots=True)
class Snapshot:
    sequence: int  # 0 for the empty snapshot before the first flush
    time_ns: int  # wall clock (time.time_ns()) at the end of the flush
    interval_start_ns: int  # wall clock of the previous snapshot (start of `increase`)
    start_time_ns: int  # wall clock when the probe started counting
    processes: Mapping[ProcessKey, ProcessView]
    samples: tuple[StackSample, ...]
    health: Health
    # In the history (history.py): the sequence of the first flush this snapshot sums, whose
    # increases from `interval_start_ns` it holds together; 0: this flush's own only.
    merged_from: int = 0
    # Every process counted since start, and each container with a process in `processes` (its
    # by_reason left empty): what outputs that fold thousands of processes into a few series read
    # instead of every process's view.
    everything: Rollup = Rollup()
    containers: Mapping[Where, Rollup] = field(default_factory=lambda: MappingProxyType({}))

    @staticmethod
    def empty(start_time_ns: int = 0) -> Snapshot:
        return Snapshot(0, start_time_ns, start_time_ns, start_time_ns, MappingProxyType({}), (), Health())

    def samples_of(self, key: ProcessKey) -> Iterator[StackSample]:
        return (s for s in self.samples if s.process == key)

    def changed(self) -> Iterable[StackSample]:
        return (s for s in self.samples if s.increase)
