"""Hand-built snapshots with known stacks and increases, for encoder and transport tests."""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType

from exporter.snapshot import (
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
)

SEC = 1_000_000_000
T0 = 1_700_000_000 * SEC  # wall clock of the probe start in these snapshots


def kernel(*names: str) -> tuple[Frame, ...]:
    return tuple(Frame(n, FrameKind.KERNEL, "[kernel]") for n in names)


def user(*names: str, module: str = "/usr/bin/app") -> tuple[Frame, ...]:
    return tuple(Frame(n, FrameKind.NATIVE, module) for n in names)


def placeholder(name: str) -> tuple[Frame, ...]:
    return (Frame(name, FrameKind.PLACEHOLDER),)


SLEEP = Stack(
    user=user("offcpu_sleep_ms", "main", "__libc_start_main"),
    kernel=kernel("finish_task_switch.isra.0", "__schedule", "schedule", "do_nanosleep", "hrtimer_nanosleep"),
)
PIPE = Stack(
    user=user("offcpu_pipe_read", "main"),
    kernel=kernel("finish_task_switch.isra.0", "__schedule", "schedule", "pipe_read", "vfs_read"),
)
LOST_USER = Stack(user=placeholder("[lost stack: user, -EFAULT]"), kernel=kernel("finish_task_switch", "futex_wait"))
KERNEL_ONLY = Stack(user=(), kernel=kernel("finish_task_switch", "worker_thread", "kthread"))
EMPTY = Stack(user=(), kernel=())


def process(pid: int, comm: str = "app", start_ticks: int = 100, cmdline: Sequence[str] = ()) -> ProcessInfo:
    return ProcessInfo(
        key=ProcessKey(pid, start_ticks), comm=comm, exe=f"/usr/bin/{comm}", cmdline=tuple(cmdline) or (comm,)
    )


def sample(
    info: ProcessInfo,
    stack: Stack,
    count: int,
    ns: int,
    tid: int = 0,
    reason: Reason = Reason.SLEEPING,
    total: Counter | None = None,
) -> StackSample:
    increase = Counter(count, ns)
    return StackSample(info.key, tid or info.pid, info.comm, reason, stack, total or increase, increase)


def snapshot(
    samples: Sequence[StackSample],
    processes: Sequence[ProcessInfo],
    sequence: int = 1,
    start_ns: int | None = None,
    end_ns: int | None = None,
    interval_s: float = 5.0,
) -> Snapshot:
    """Snapshot number `sequence` of a 5 s flush cadence from T0 (or the given interval)."""
    if start_ns is None:
        start_ns = T0 + int((sequence - 1) * interval_s * SEC)
    if end_ns is None:
        end_ns = start_ns + int(interval_s * SEC)
    views = {}
    for info in processes:
        own = [s for s in samples if s.process == info.key]
        total = sum((s.total for s in own), Counter())
        views[info.key] = ProcessView(info, total, MappingProxyType({}))
    return Snapshot(
        sequence=sequence,
        time_ns=end_ns,
        interval_start_ns=start_ns,
        start_time_ns=T0,
        processes=MappingProxyType(views),
        samples=tuple(samples),
        health=Health(),
    )
