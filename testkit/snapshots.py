"""Hand-built snapshots with known stacks and figures, for the encoder, sink and format tests and
for the benchmarks that need no kernel.

Three families of fixed data, each matching what its tests' golden files and expected values
were written against (so they are not merged into one set):
- SLEEP, PIPE, LOST_USER, KERNEL_ONLY, EMPTY with `process`, `sample`, `snapshot`: plain frames
  without addresses (SkyWalking tests);
- APP, DB, STACK_* with `snapshot_of`, `two_process_snapshot`: frames with offsets and build ids,
  a process with Kubernetes metadata (OTLP tests);
- WORKLOAD, OTHER, WORKLOAD_* with `workload_snapshot`, `make_before`, `make_after`: frames like
  those of tests/workloads/offcpu_workload.c (profile format and pprof tests).
`Builder` accumulates totals across snapshots, per thread too (Prometheus tests); `many_process_snapshot`,
`snapshot_history` and `scrape_snapshot` make large hosts for the benchmarks.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from offcpu_exporter.rollup import Rollups
from offcpu_exporter.snapshot import (
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

SEC = 1_000_000_000
T0 = 1_700_000_000 * SEC  # wall clock of the probe start in these snapshots
EXE = "/opt/work/offcpu_workload"
BUILD_ID = "4f1c2a9be0d34c1f"
LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"

Row = tuple[ProcessInfo, int, str, Reason, Stack, Counter, Counter]


# --- frames and stacks ---------------------------------------------------------------------------


def kernel(*names: str, addressed: bool = False) -> tuple[Frame, ...]:
    """Kernel frames; `addressed` gives each one an address as the kernel symbolizer would."""
    if addressed:
        return tuple(
            Frame(n, FrameKind.KERNEL, "[kernel]", 0xFFFFFFFF81000000 + 0x100 * i) for i, n in enumerate(names)
        )
    return tuple(Frame(n, FrameKind.KERNEL, "[kernel]") for n in names)


def user(*names: str, module: str = "/usr/bin/app", build_id: str | None = None) -> tuple[Frame, ...]:
    """Native frames of `module`; with a `build_id` they also get offsets (0x1100, 0x1140, ...)."""
    if build_id is not None:
        return tuple(Frame(n, FrameKind.NATIVE, module, 0x1100 + 0x40 * i, build_id) for i, n in enumerate(names))
    return tuple(Frame(n, FrameKind.NATIVE, module) for n in names)


def placeholder(name: str) -> tuple[Frame, ...]:
    return (Frame(name, FrameKind.PLACEHOLDER),)


def stack(user_leaf: str, kernel_leaf: str = "do_nanosleep", extra: str = "main") -> Stack:
    """A two-frame user stack under a three-frame scheduler stack."""
    return Stack(
        user=(
            Frame(user_leaf, FrameKind.NATIVE, "/usr/bin/app", 0x10),
            Frame(extra, FrameKind.NATIVE, "/usr/bin/app"),
        ),
        kernel=(
            Frame("finish_task_switch.isra.0", FrameKind.KERNEL, "[kernel]"),
            Frame("__schedule", FrameKind.KERNEL),
            Frame(kernel_leaf, FrameKind.KERNEL, "[kernel]"),
        ),
    )


def many_stacks(n: int) -> Sequence[Stack]:
    return [stack(f"fn_{i}", kernel_leaf=("futex_wait" if i % 2 else "do_nanosleep")) for i in range(n)]


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


# --- processes, samples, snapshots from samples --------------------------------------------------


def process(
    pid: int,
    comm: str = "app",
    start_ticks: int = 100,
    cmdline: Sequence[str] = (),
    exited: bool = False,
    namespace: str = "",
    pod: str = "",
    container: str = "",
) -> ProcessInfo:
    """exe /usr/bin/COMM; the command line is (COMM,) unless given."""
    return ProcessInfo(
        key=ProcessKey(pid, start_ticks),
        comm=comm,
        exe=f"/usr/bin/{comm}",
        cmdline=tuple(cmdline) or (comm,),
        exited=exited,
        namespace=namespace,
        pod=pod,
        container=container,
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
        **rolled_up(views),
    )


# --- snapshots from rows -------------------------------------------------------------------------



def rolled_up(views: Mapping[ProcessKey, ProcessView]) -> dict[str, Any]:
    """Snapshot.everything and .containers (as keyword arguments) of a snapshot made at once from
    its views: the processes' sums, as the aggregator's are when nothing exited before."""
    rollups = Rollups()
    for view in views.values():
        where = view.info.where
        if view.by_reason:
            for reason, value in view.by_reason.items():
                rollups.add(where, reason, value.count, value.ns)
        elif view.total:
            rollups.add(where, None, view.total.count, view.total.ns)
        if view.histogram:
            rollups.add_blocks(where, view.histogram)
    return {"everything": rollups.everything(), "containers": rollups.containers(v.info.where for v in views.values())}


def snapshot_of(
    rows: Iterable[Row],
    sequence: int = 3,
    time_ns: int = 1_700_000_015_000_000_000,
    interval_ns: int = 5_000_000_000,
    by_reason: bool = True,
    health: Health | None = None,
) -> Snapshot:
    """rows: (process, tid, thread name, reason, stack, total, increase). Process views are the sums
    (with per-reason sums unless `by_reason` is false); health is Health(flushes=sequence) unless given."""
    samples = []
    views: dict[ProcessKey, tuple[ProcessInfo, dict[Reason, Counter]]] = {}
    totals: dict[ProcessKey, Counter] = {}
    for info, tid, tname, reason, st, total, increase in rows:
        samples.append(StackSample(info.key, tid, tname, reason, st, total, increase))
        _, reasons = views.setdefault(info.key, (info, {}))
        reasons[reason] = reasons.get(reason, Counter()) + total
        totals[info.key] = totals.get(info.key, Counter()) + total
    processes = {
        key: ProcessView(info, totals[key], MappingProxyType(reasons if by_reason else {}))
        for key, (info, reasons) in views.items()
    }
    return Snapshot(
        sequence=sequence,
        time_ns=time_ns,
        interval_start_ns=time_ns - interval_ns,
        start_time_ns=time_ns - sequence * interval_ns,
        processes=MappingProxyType(processes),
        samples=tuple(samples),
        health=Health(flushes=sequence) if health is None else health,
        **rolled_up(processes),
    )


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
_LIBC_BUILD_ID = "0123456789abcdef0123456789abcdef01234567"

STACK_SLEEP = Stack(
    user=(
        Frame("offcpu_sleep_ms", FrameKind.NATIVE, "/usr/bin/app", 0x1130, "feedface" * 5),
        Frame("main", FrameKind.NATIVE, "/usr/bin/app", 0x1200, "feedface" * 5),
        Frame("__libc_start_call_main", FrameKind.NATIVE, LIBC, 0x271CA, _LIBC_BUILD_ID),
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


# --- the test workload's frames: two processes, three threads, one placeholder -------------------

WORKLOAD_SLEEP = Stack(
    user=(
        *user("offcpu_sleep_ms", "main", module=EXE, build_id=BUILD_ID),
        Frame("__libc_start_main", FrameKind.NATIVE, LIBC, 0x271C0),
    ),
    kernel=kernel(
        "finish_task_switch.isra.0",
        "__schedule",
        "schedule",
        "do_nanosleep",
        "hrtimer_nanosleep",
        "__x64_sys_nanosleep",
        "do_syscall_64",
        "entry_SYSCALL_64_after_hwframe",
        addressed=True,
    ),
)
WORKLOAD_PIPE = Stack(
    user=user("offcpu_pipe_read", "reader_thread", module=EXE, build_id=BUILD_ID),
    kernel=kernel(
        "finish_task_switch.isra.0", "__schedule", "schedule", "pipe_read", "vfs_read", "ksys_read", addressed=True
    ),
)
WORKLOAD_LOCK = Stack(
    user=user("offcpu_lock_wait", "worker;with;semicolons", module=EXE, build_id=BUILD_ID),
    kernel=kernel("finish_task_switch.isra.0", "__schedule", "schedule", "futex_wait", addressed=True),
)
WORKLOAD_LOST = Stack(
    user=(Frame("[lost user stack]", FrameKind.PLACEHOLDER),), kernel=kernel("__schedule", "schedule", addressed=True)
)

WORKLOAD = ProcessInfo(ProcessKey(4242, 1000), "offcpu_workload", exe=EXE)
OTHER = ProcessInfo(ProcessKey(777, 2000), "other<script>", exe="/usr/bin/other")


def workload_snapshot(sequence: int, rows: list[Row]) -> Snapshot:
    """Snapshot number `sequence` of a 5 s cadence from T0, process views without per-reason sums."""
    return snapshot_of(rows, sequence=sequence, time_ns=T0 + sequence * 5 * SEC, by_reason=False, health=Health())


def make_before() -> Snapshot:
    return workload_snapshot(
        1,
        [
            (
                WORKLOAD,
                4242,
                "offcpu_workload",
                Reason.SLEEPING,
                WORKLOAD_SLEEP,
                Counter(10, 1_000_000_000),
                Counter(10, 10**9),
            ),
            (
                WORKLOAD,
                4243,
                "reader",
                Reason.SLEEPING,
                WORKLOAD_PIPE,
                Counter(5, 300_000_000),
                Counter(5, 300_000_000),
            ),
            (OTHER, 778, "other-io", Reason.UNINTERRUPTIBLE, WORKLOAD_LOCK, Counter(1, 1_000), Counter(1, 1_000)),
        ],
    )


def make_after() -> Snapshot:
    """1.5 s more sleep, 0.25 s more pipe wait, a new lost-stack row, a new OTHER stack."""
    return workload_snapshot(
        2,
        [
            (
                WORKLOAD,
                4242,
                "offcpu_workload",
                Reason.SLEEPING,
                WORKLOAD_SLEEP,
                Counter(25, 2_500_000_000),
                Counter(15, 1_500_000_000),
            ),
            (
                WORKLOAD,
                4243,
                "reader",
                Reason.SLEEPING,
                WORKLOAD_PIPE,
                Counter(9, 550_000_000),
                Counter(4, 250_000_000),
            ),
            (
                WORKLOAD,
                4244,
                "idle",
                Reason.RUNNABLE,
                WORKLOAD_LOST,
                Counter(3, 1_234_567),
                Counter(3, 1_234_567),
            ),
            (OTHER, 778, "other-io", Reason.UNINTERRUPTIBLE, WORKLOAD_LOCK, Counter(1, 1_000), Counter()),
            (
                OTHER,
                779,
                "other-2",
                Reason.SLEEPING,
                WORKLOAD_SLEEP,
                Counter(2, 40_000_499),
                Counter(2, 40_000_499),
            ),
        ],
    )


# --- cumulative totals across flushes ------------------------------------------------------------


class Builder:
    """Cumulative per-stack totals per process, turned into snapshots with consistent process views."""

    def __init__(self) -> None:
        self.sequence = 0
        self.time_ns = 1_700_000_000 * SEC
        self.infos: dict[ProcessKey, ProcessInfo] = {}
        self.totals: dict[tuple[ProcessKey, int, Reason, Stack], Counter] = {}
        self.hist: dict[ProcessKey, list[int]] = {}
        self.rollups = Rollups()  # as the aggregator keeps them: exits do not lower them
        self.health = Health(attach_mode="tracepoint", hooked_symbols=("sched:sched_switch",), probe_attached=True)

    def add(
        self,
        info: ProcessInfo,
        st: Stack,
        seconds: float,
        count: int = 1,
        reason: Reason = Reason.SLEEPING,
        tid: int = 0,
    ) -> None:
        self.infos[info.key] = info
        key = (info.key, tid, reason, st)
        inc = Counter(count, round(seconds * SEC))
        self.totals[key] = self.totals.get(key, Counter()) + inc
        self.rollups.add(info.where, reason, inc.count, inc.ns)

    def add_blocks(self, info: ProcessInfo, slots: dict[int, int]) -> None:
        h = self.hist.setdefault(info.key, [0] * 27)
        growth = [0] * 27
        for i, n in slots.items():
            h[i] += n
            growth[i] = n
        self.rollups.add_blocks(info.where, growth)

    def remove(self, key: ProcessKey) -> None:
        self.infos.pop(key, None)
        self.hist.pop(key, None)
        for k in [k for k in self.totals if k[0] == key]:
            del self.totals[k]

    def snapshot(self) -> Snapshot:
        self.sequence += 1
        self.time_ns += 5 * SEC
        samples = tuple(
            StackSample(pk, tid, f"t{tid}" if tid else "", reason, st, total, Counter())
            for (pk, tid, reason, st), total in self.totals.items()
        )
        views = {}
        for pk, info in self.infos.items():
            mine = [s for s in samples if s.process == pk]
            by_reason: dict[Reason, Counter] = {}
            by_thread: dict[int, dict[Reason, Counter]] = {}
            for s in mine:
                by_reason[s.reason] = by_reason.get(s.reason, Counter()) + s.total
                if s.tid:
                    mine_t = by_thread.setdefault(s.tid, {})
                    mine_t[s.reason] = mine_t.get(s.reason, Counter()) + s.total
            total = sum((s.total for s in mine), Counter())
            threads = {tid: ThreadView(tid, f"t{tid}", sum(r.values(), Counter()), MappingProxyType(r))
                       for tid, r in by_thread.items()}
            views[pk] = ProcessView(info, total, MappingProxyType(by_reason), tuple(self.hist.get(pk, ())),
                                    threads=MappingProxyType(threads))
        return Snapshot(
            self.sequence,
            self.time_ns,
            self.time_ns - 5 * SEC,
            1_700_000_000 * SEC,
            MappingProxyType(views),
            samples,
            self.health,
            everything=self.rollups.everything(),
            containers=self.rollups.containers(info.where for info in self.infos.values()),
        )


# --- large hosts, for the benchmarks -------------------------------------------------------------


def many_process_snapshot(processes: int, stacks: int, depth: int, shared: bool = False) -> Snapshot:
    """Every process has `stacks` distinct stacks of `depth` frames, each changed in the interval.
    shared=False: every stack has frames of its own (the worst case: as many locations as
    frames); shared=True: the user frames of a process come from a pool of 60 functions, as
    real call trees share their callers."""
    kernel = tuple(Frame(f"kfunc_{i}", FrameKind.KERNEL, "[kernel]", 0x1000 + i) for i in range(8))
    libc = tuple(Frame(f"libc_{i}", FrameKind.NATIVE, "/usr/lib/libc.so.6", 0x2000 + i, "ab" * 20) for i in range(4))
    samples, views = [], {}
    for p in range(processes):
        key = ProcessKey(1000 + p, p)
        info = ProcessInfo(key=key, comm=f"app{p}", exe=f"/usr/bin/app{p}")
        total = Counter()
        for s in range(stacks):
            n_user = max(1, depth - len(kernel) - len(libc))
            if shared:  # a distinct leaf, callers from the pool
                ids = [60 + s] + [(s * 7 + d * 13) % 60 for d in range(1, n_user)]
            else:
                ids = [1000 + s * 64 + d for d in range(n_user)]
            user = (
                tuple(Frame(f"app{p}_fn_{i}", FrameKind.NATIVE, info.exe, 0x400000 + i, "cd" * 20) for i in ids) + libc
            )
            inc = Counter(3 + s, 1_000_000 * (s + 1))
            samples.append(
                StackSample(key, 2000 + s % 8, f"worker-{s % 8}", Reason.SLEEPING, Stack(user, kernel), inc, inc)
            )
            total = total + inc
        views[key] = ProcessView(info, total, MappingProxyType({Reason.SLEEPING: total}))
    now = 1_800_000_000_000_000_000
    return Snapshot(
        2, now, now - 5_000_000_000, now - 10_000_000_000, MappingProxyType(views), tuple(samples), Health(),
        **rolled_up(views),
    )


def snapshot_history(processes: int, stacks: int, depth: int, snapshots: int) -> list[Snapshot]:
    """`snapshots` snapshots of processes x stacks rows, frames `depth` deep, libc and kernel frames
    and the outer half of each process's frames shared; every row grows in every snapshot."""
    kernel = tuple(Frame(f"kernel_fn_{i}", FrameKind.KERNEL, "[kernel]", 0xFFFFFFFF81000000 + i) for i in range(12))
    libc = tuple(Frame(f"libc_fn_{i}", FrameKind.NATIVE, "/usr/lib/libc.so.6", 0x1000 + i) for i in range(4))
    rows = []
    views = {}
    for p in range(processes):
        info = ProcessInfo(ProcessKey(1000 + p, p), f"app{p % 20}", exe=f"/usr/bin/app{p % 20}")
        views[info.key] = ProcessView(info, Counter(), MappingProxyType({}))
        for s in range(stacks):
            # As in real programs, stacks of a process share their outer frames (main, the event
            # loop, ...) and differ towards the leaf: `shared` outer frames, the rest per stack.
            shared = (depth - len(libc)) // 2
            own = tuple(
                Frame(
                    f"app{p % 20}_fn_{d if d < shared else (s * 7 + d) % 400}", FrameKind.NATIVE, info.exe, 0x4000 + d
                )
                for d in range(depth - len(libc))
            )
            st = Stack(user=(*libc[: 1 + s % 3], *own), kernel=kernel[: 4 + s % 8])
            rows.append((info.key, 1000 + p + s % 4, Reason(s % 3), st))
    out = []
    for n in range(1, snapshots + 1):
        inc = Counter(3, 7_000_000)
        samples = tuple(
            StackSample(key, tid, "worker", reason, st, Counter(3 * n, 7_000_000 * n), inc)
            for key, tid, reason, st in rows
        )
        t = n * 5_000_000_000
        out.append(Snapshot(n, t, t - 5_000_000_000, 0, MappingProxyType(views), samples, Health(), **rolled_up(views)))
    return out


def scrape_snapshot(sequence: int, processes: int, stacks_per_process: int) -> Snapshot:
    """Snapshot number `sequence`, ending now: processes with Kubernetes metadata, stacks_per_process
    stacks each, totals growing with `sequence`, and a block-duration histogram per process."""
    views = {}
    samples = []
    for p in range(processes):
        key = ProcessKey(10_000 + p, 1000 + p)
        info = ProcessInfo(
            key, f"worker-{p}", exe=f"/usr/bin/worker-{p}", namespace="prod", pod=f"app-{p % 40}", container="app"
        )
        by_reason: dict[Reason, Counter] = {}
        total = Counter()
        for s in range(stacks_per_process):
            st = Stack(
                user=(Frame(f"wait_for_{s}", FrameKind.NATIVE, "/usr/bin/app"), Frame("main", FrameKind.NATIVE)),
                kernel=(
                    Frame("finish_task_switch.isra.0", FrameKind.KERNEL),
                    Frame("__schedule", FrameKind.KERNEL),
                    Frame(("futex_wait", "do_nanosleep", "ep_poll", "pipe_read")[s % 4], FrameKind.KERNEL),
                ),
            )
            reason = Reason(s % 3)
            c = Counter(sequence * (s + 1) * 7, sequence * (s + 1) * 13_000_017)
            samples.append(StackSample(key, 0, "t", reason, st, c, Counter()))
            by_reason[reason] = by_reason.get(reason, Counter()) + c
            total += c
        hist = tuple(sequence * ((i * 7 + p) % 11) for i in range(27))
        views[key] = ProcessView(info, total, MappingProxyType(by_reason), hist)
    health = Health(
        attach_mode="tracepoint",
        hooked_symbols=("sched:sched_switch",),
        probe_attached=True,
        flushes=sequence,
        targets=processes,
    )
    now = time.time_ns()
    return Snapshot(
        sequence,
        now,
        now - 5_000_000_000,
        now - sequence * 5_000_000_000,
        MappingProxyType(views),
        tuple(samples),
        health,
        **rolled_up(views),
    )
