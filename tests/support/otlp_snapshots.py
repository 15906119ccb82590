"""Hand-made snapshots with known figures, for encoder and sink tests that need no kernel."""

from __future__ import annotations

from collections.abc import Iterable
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

__all__ = ["APP", "DB", "STACK_LOCK", "STACK_PIPE", "STACK_SLEEP", "snapshot_of", "two_process_snapshot"]

APP = ProcessInfo(
    key=ProcessKey(4242, 1000),
    comm="app",
    exe="/usr/bin/app",
    cmdline=("/usr/bin/app", "--serve"),
    container_id="c0ffee" * 10 + "abcd",
    namespace="shop",
    pod="app-7d9f",
    pod_uid="0b9c-uid",
    container="app",
)
DB = ProcessInfo(key=ProcessKey(777, 2000), comm="node", exe="/usr/bin/node")

_SCHED = (
    Frame("finish_task_switch.isra.0", FrameKind.KERNEL, "[kernel]", 0x10),
    Frame("__schedule", FrameKind.KERNEL, "[kernel]", 0x20),
    Frame("schedule", FrameKind.KERNEL, "[kernel]", 0x30),
)
_LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"
_BUILD_ID = "0123456789abcdef0123456789abcdef01234567"

STACK_SLEEP = Stack(
    user=(
        Frame("offcpu_sleep_ms", FrameKind.NATIVE, "/usr/bin/app", 0x1130, "feedface" * 5),
        Frame("main", FrameKind.NATIVE, "/usr/bin/app", 0x1200, "feedface" * 5),
        Frame("__libc_start_call_main", FrameKind.NATIVE, _LIBC, 0x271CA, _BUILD_ID),
    ),
    kernel=(
        *_SCHED,
        Frame("do_nanosleep", FrameKind.KERNEL, "[kernel]", 0x40),
        Frame("entry_SYSCALL_64_after_hwframe", FrameKind.KERNEL, "[kernel]", 0x50),
    ),
)
STACK_PIPE = Stack(
    user=(
        Frame("offcpu_pipe_read", FrameKind.NATIVE, "/usr/bin/app", 0x1180, "feedface" * 5),
        Frame("main", FrameKind.NATIVE, "/usr/bin/app", 0x1200, "feedface" * 5),
    ),
    kernel=(*_SCHED, Frame("pipe_read", FrameKind.KERNEL, "[kernel]", 0x60)),
)
STACK_LOCK = Stack(
    user=(Frame("[unknown] libfoo.so+0x1a2b", FrameKind.PLACEHOLDER),),
    kernel=(*_SCHED, Frame("futex_wait", FrameKind.KERNEL, "[kernel]", 0x70)),
)
STACK_JIT = Stack(
    user=(
        Frame("LazyCompile:*handler /srv/app.js:10", FrameKind.JIT, "/tmp/perf-777.map", 0),
        Frame("uv_run", FrameKind.NATIVE, "/usr/bin/node", 0x5000),
    ),
    kernel=(*_SCHED, Frame("ep_poll", FrameKind.KERNEL, "[kernel]", 0x80)),
)


def snapshot_of(
    rows: Iterable[tuple[ProcessInfo, int, str, Reason, Stack, Counter, Counter]],
    sequence: int = 3,
    time_ns: int = 1_700_000_015_000_000_000,
    interval_ns: int = 5_000_000_000,
) -> Snapshot:
    """rows: (process, tid, thread name, reason, stack, total, increase). Process views are the sums."""
    samples = []
    views: dict[ProcessKey, tuple[ProcessInfo, dict[Reason, Counter]]] = {}
    for info, tid, tname, reason, stack, total, increase in rows:
        samples.append(StackSample(info.key, tid, tname, reason, stack, total, increase))
        _, by_reason = views.setdefault(info.key, (info, {}))
        by_reason[reason] = by_reason.get(reason, Counter()) + total
    processes = {
        key: ProcessView(info, sum(by_reason.values(), Counter()), MappingProxyType(by_reason))
        for key, (info, by_reason) in views.items()
    }
    return Snapshot(
        sequence=sequence,
        time_ns=time_ns,
        interval_start_ns=time_ns - interval_ns,
        start_time_ns=time_ns - sequence * interval_ns,
        processes=MappingProxyType(processes),
        samples=tuple(samples),
        health=Health(flushes=sequence),
    )


def two_process_snapshot(sequence: int = 3, scale: int = 1, time_ns: int = 1_700_000_015_000_000_000) -> Snapshot:
    """APP: sleep 300 ms (3 switches) on tid 4243, pipe 200 ms (4) on tid 4244, an unknown-user-frame
    futex wait 50 ms (1) per process; DB (node): a JIT stack, 120 ms (6), per process (tid 0)."""
    c = Counter
    return snapshot_of(
        [
            (
                APP,
                4243,
                "worker-1",
                Reason.SLEEPING,
                STACK_SLEEP,
                c(30 * scale, 3_000_000_000 * scale),
                c(3 * scale, 300_000_000 * scale),
            ),
            (
                APP,
                4244,
                "worker-2",
                Reason.SLEEPING,
                STACK_PIPE,
                c(40 * scale, 2_000_000_000 * scale),
                c(4 * scale, 200_000_000 * scale),
            ),
            (APP, 0, "", Reason.SLEEPING, STACK_LOCK, c(10, 500_000_000), c(1, 50_000_000)),
            (APP, 4244, "worker-2", Reason.RUNNABLE, STACK_PIPE, c(5, 5_000_000), c(0, 0)),  # idle row
            (DB, 0, "", Reason.SLEEPING, STACK_JIT, c(60, 1_200_000_000), c(6, 120_000_000)),
        ],
        sequence=sequence,
        time_ns=time_ns,
    )
