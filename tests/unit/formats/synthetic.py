"""Synthetic snapshots for the encoder tests: two processes, three threads, kernel and user
frames like those of the test workload (tests/workloads/offcpu_workload.c), one placeholder."""

from __future__ import annotations

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

EXE = "/opt/work/offcpu_workload"
BUILD_ID = "4f1c2a9be0d34c1f"
LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"
T0 = 1_700_000_000_000_000_000


def kernel(*names: str) -> tuple[Frame, ...]:
    return tuple(Frame(n, FrameKind.KERNEL, "[kernel]", 0xFFFFFFFF81000000 + 0x100 * i) for i, n in enumerate(names))


def user(*names: str, module: str = EXE) -> tuple[Frame, ...]:
    return tuple(Frame(n, FrameKind.NATIVE, module, 0x1100 + 0x40 * i, BUILD_ID) for i, n in enumerate(names))


SLEEP = Stack(
    user=(*user("offcpu_sleep_ms", "main"), Frame("__libc_start_main", FrameKind.NATIVE, LIBC, 0x271C0)),
    kernel=kernel(
        "finish_task_switch.isra.0",
        "__schedule",
        "schedule",
        "do_nanosleep",
        "hrtimer_nanosleep",
        "__x64_sys_nanosleep",
        "do_syscall_64",
        "entry_SYSCALL_64_after_hwframe",
    ),
)
PIPE = Stack(
    user=user("offcpu_pipe_read", "reader_thread"),
    kernel=kernel("finish_task_switch.isra.0", "__schedule", "schedule", "pipe_read", "vfs_read", "ksys_read"),
)
LOCK = Stack(
    user=user("offcpu_lock_wait", "worker;with;semicolons"),
    kernel=kernel("finish_task_switch.isra.0", "__schedule", "schedule", "futex_wait"),
)
LOST = Stack(user=(Frame("[lost user stack]", FrameKind.PLACEHOLDER),), kernel=kernel("__schedule", "schedule"))

WORKLOAD = ProcessInfo(ProcessKey(4242, 1000), "offcpu_workload", exe=EXE)
OTHER = ProcessInfo(ProcessKey(777, 2000), "other<script>", exe="/usr/bin/other")


def snapshot(sequence: int, rows: list[tuple[ProcessInfo, int, str, Reason, Stack, Counter, Counter]]) -> Snapshot:
    samples = tuple(StackSample(p.key, tid, name, r, st, total, inc) for p, tid, name, r, st, total, inc in rows)
    processes = {}
    for p in {row[0] for row in rows}:
        total = Counter()
        for s in samples:
            if s.process == p.key:
                total += s.total
        processes[p.key] = ProcessView(p, total, MappingProxyType({}))
    time_ns = T0 + sequence * 5_000_000_000
    return Snapshot(sequence, time_ns, time_ns - 5_000_000_000, T0, MappingProxyType(processes), samples, Health())


def make_before() -> Snapshot:
    return snapshot(
        1,
        [
            (
                WORKLOAD,
                4242,
                "offcpu_workload",
                Reason.SLEEPING,
                SLEEP,
                Counter(10, 1_000_000_000),
                Counter(10, 10**9),
            ),
            (
                WORKLOAD,
                4243,
                "reader",
                Reason.SLEEPING,
                PIPE,
                Counter(5, 300_000_000),
                Counter(5, 300_000_000),
            ),
            (OTHER, 778, "other-io", Reason.UNINTERRUPTIBLE, LOCK, Counter(1, 1_000), Counter(1, 1_000)),
        ],
    )


def make_after() -> Snapshot:
    """1.5 s more sleep, 0.25 s more pipe wait, a new lost-stack row, a new OTHER stack."""
    return snapshot(
        2,
        [
            (
                WORKLOAD,
                4242,
                "offcpu_workload",
                Reason.SLEEPING,
                SLEEP,
                Counter(25, 2_500_000_000),
                Counter(15, 1_500_000_000),
            ),
            (
                WORKLOAD,
                4243,
                "reader",
                Reason.SLEEPING,
                PIPE,
                Counter(9, 550_000_000),
                Counter(4, 250_000_000),
            ),
            (WORKLOAD, 4244, "idle", Reason.RUNNABLE, LOST, Counter(3, 1_234_567), Counter(3, 1_234_567)),
            (OTHER, 778, "other-io", Reason.UNINTERRUPTIBLE, LOCK, Counter(1, 1_000), Counter()),
            (OTHER, 779, "other-2", Reason.SLEEPING, SLEEP, Counter(2, 40_000_499), Counter(2, 40_000_499)),
        ],
    )
