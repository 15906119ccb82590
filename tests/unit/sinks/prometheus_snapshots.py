"""Synthetic snapshots for the Prometheus sink's tests (made in code, no kernel)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
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


def stack(user_leaf: str, kernel_leaf: str = "do_nanosleep", extra: str = "main") -> Stack:
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


def process(
    pid: int,
    comm: str = "app",
    start: int = 1000,
    exited: bool = False,
    namespace: str = "",
    pod: str = "",
    container: str = "",
) -> ProcessInfo:
    return ProcessInfo(
        ProcessKey(pid, start),
        comm,
        exe=f"/usr/bin/{comm}",
        exited=exited,
        namespace=namespace,
        pod=pod,
        container=container,
    )


class Builder:
    """Cumulative per-stack totals per process, turned into snapshots with consistent process views."""

    def __init__(self) -> None:
        self.sequence = 0
        self.time_ns = 1_700_000_000 * SEC
        self.infos: dict[ProcessKey, ProcessInfo] = {}
        self.totals: dict[tuple[ProcessKey, int, Reason, Stack], Counter] = {}
        self.hist: dict[ProcessKey, list[int]] = {}
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
        self.totals[key] = self.totals.get(key, Counter()) + Counter(count, round(seconds * SEC))

    def add_blocks(self, info: ProcessInfo, slots: dict[int, int]) -> None:
        h = self.hist.setdefault(info.key, [0] * 27)
        for i, n in slots.items():
            h[i] += n

    def remove(self, key: ProcessKey) -> None:
        self.infos.pop(key, None)
        self.hist.pop(key, None)
        for k in [k for k in self.totals if k[0] == key]:
            del self.totals[k]

    def snapshot(self) -> Snapshot:
        self.sequence += 1
        self.time_ns += 5 * SEC
        samples = tuple(
            StackSample(pk, tid, "t", reason, st, total, Counter())
            for (pk, tid, reason, st), total in self.totals.items()
        )
        views = {}
        for pk, info in self.infos.items():
            mine = [s for s in samples if s.process == pk]
            by_reason: dict[Reason, Counter] = {}
            for s in mine:
                by_reason[s.reason] = by_reason.get(s.reason, Counter()) + s.total
            total = sum((s.total for s in mine), Counter())
            views[pk] = ProcessView(info, total, MappingProxyType(by_reason), tuple(self.hist.get(pk, ())))
        return Snapshot(
            self.sequence,
            self.time_ns,
            self.time_ns - 5 * SEC,
            1_700_000_000 * SEC,
            MappingProxyType(views),
            samples,
            self.health,
        )


def many_stacks(n: int) -> Sequence[Stack]:
    return [stack(f"fn_{i}", kernel_leaf=("futex_wait" if i % 2 else "do_nanosleep")) for i in range(n)]


def total_of(values: Iterable[float]) -> float:
    return sum(values)
