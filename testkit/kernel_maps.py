"""An in-memory stand-in for the kernel maps: what Aggregator reads of Probe, held in dicts, for
the delta-logic tests and the flush-cost benchmark (the real maps are exercised by
tests/e2e/test_probe.py)."""

from __future__ import annotations

import errno
from collections.abc import Iterable, Sequence

from offcpu_exporter.probe import layout
from offcpu_exporter.probe.config import ProbeConfig
from offcpu_exporter.probe.maps import CounterKey, CounterValue, KernelMaps, ProgramRuns, StartEntry
from offcpu_exporter.probe.stack_ids import stack_id
from offcpu_exporter.unwind import Unwinder


def key(tgid: int, user: int, kernel: int, reason: int = 1, tid: int = 0) -> CounterKey:
    return CounterKey(tgid, tid, reason, user, kernel)


def exact(blocks: int, ns: int) -> CounterValue:
    """A counter whose every block had its stacks captured (no sampling)."""
    return CounterValue(blocks, ns, blocks, ns)


class MemoryMaps:
    """Counters in `counts`, stacks in `stacks` (id -> addresses; freed ids are recorded in
    `deleted_stacks`), blocks in progress in `starts` (tid -> StartEntry), marks in `marks`."""

    def __init__(self, max_counts: int = 100, **config: object) -> None:
        self.config = ProbeConfig(max_counts=max_counts, **config)  # type: ignore[arg-type]
        self.counts: dict[CounterKey, CounterValue] = {}
        self.stacks: dict[int, tuple[int, ...]] = {}
        self.deleted_stacks: set[int] = set()
        self.starts: dict[int, StartEntry] = {}
        self.marks: dict[int, tuple[int, int]] = {}
        self.hist: dict[int, list[int]] = {}
        self._cutoff_ns = 0
        self.marks_active = False
        self.targets: dict[int, int] = {}  # the in-kernel filter: tgid -> layout.TARGET_*
        self.mode, self.attached = "tracepoint", True
        self.hooked: tuple[str, ...] = ("sched:sched_switch",)
        self.attached_wall_ns = 0
        self.attached_ktime_ns = 0
        self.unwinder: Unwinder | None = None  # user stacks with frame pointers only
        self.process_events: dict[int, int] | None = None

    def start(self) -> None:
        pass  # attached from the start: there is no program to load

    def close(self) -> None:
        pass

    def read_counts(self) -> list[tuple[CounterKey, CounterValue]]:
        return list(self.counts.items())

    def take_counts(self, keys: Iterable[CounterKey]) -> dict[CounterKey, CounterValue]:
        return {k: self.counts.pop(k) for k in list(keys) if k in self.counts}

    def stack(self, stack_id: int) -> tuple[int, ...] | None:
        return self.stacks.get(stack_id)

    def stack_ids(self) -> set[int]:
        return set(self.stacks)

    def waker_stack_ids(self) -> set[int]:
        return set()

    def delete_stacks(self, ids: Iterable[int]) -> None:
        for sid in ids:
            self.stacks.pop(sid, None)
            self.deleted_stacks.add(sid)

    def store_stack(self, frames: Sequence[int]) -> int:
        sid = stack_id(frames)
        if sid >= layout.STACK_RESERVED:
            if sid not in self.stacks and len(self.stacks) >= self.config.stack_storage:
                return layout.STACK_ERRNO_BASE + errno.ENOMEM
            self.stacks[sid] = tuple(frames[: layout.MAX_DEPTH])
        return sid

    def read_starts(self) -> dict[int, StartEntry]:
        return dict(self.starts)

    def read_start(self, tid: int) -> StartEntry | None:
        return self.starts.get(tid)

    def seed_start(self, tid: int, entry: StartEntry) -> bool:
        if tid in self.starts:
            return False
        self.starts[tid] = entry
        return True

    def unseed_start(self, tid: int, ts_ns: int) -> None:
        if tid in self.starts and self.starts[tid].ts_ns == ts_ns:
            del self.starts[tid]

    def write_marks(self, marks: dict[int, tuple[int, int]]) -> None:
        self.marks.update(marks)
        self.marks_active = self.marks_active or bool(marks)

    def read_marks(self) -> dict[int, tuple[int, int]]:
        return dict(self.marks)

    def delete_marks(self, tids: Iterable[int]) -> None:
        for tid in tids:
            self.marks.pop(tid, None)

    def set_marks_active(self, active: bool) -> None:
        self.marks_active = active

    @property
    def cutoff_ns(self) -> int:
        return self._cutoff_ns

    def set_cutoff(self, ktime_ns: int) -> None:
        self._cutoff_ns = ktime_ns

    def read_hist(self) -> dict[int, list[int]]:
        return {tgid: list(slots) for tgid, slots in self.hist.items()}

    def take_hist(self, tgid: int) -> list[int]:
        return self.hist.pop(tgid, [0] * layout.HIST_SLOTS)

    def stats(self) -> list[int]:
        return [0] * layout.STAT_MAX

    def map_sizes(self, **known: int) -> dict[str, tuple[int, int]]:
        return {"counts": (known.get("counts", len(self.counts)), self.config.max_counts),
                "start": (len(self.starts), self.config.max_threads),
                "stacks": (len(self.stacks), self.config.stack_storage)}

    def program_runs(self) -> ProgramRuns:
        return ProgramRuns(0, 0, 0)

    def kernel_targets(self) -> dict[int, int]:
        return dict(self.targets)

    def set_target(self, tgid: int, value: int = 1) -> None:
        self.targets[tgid] = value

    def remove_target(self, tgid: int) -> None:
        self.targets.pop(tgid, None)

    def children(self) -> dict[int, tuple[int, int, str]]:
        return {}

    def forget_child(self, tgid: int) -> None:
        pass

    def take_process_events(self) -> dict[int, int] | None:
        """None: tests on these maps change a fake /proc, which is rescanned at every refresh;
        `process_events` set to a dict stands in for the kernel's reports instead."""
        events, self.process_events = self.process_events, ({} if self.process_events is not None else None)
        return events

    # -- the kernel's side, for tests of the protocols between the two -------------------------

    def switch_in(self, tid: int, now: int) -> None:
        """What bpf/offcpu.bpf.c's switch_in() does when thread `tid` runs again at `now`."""
        block = self.starts.pop(tid)
        since = block.ts_ns
        mark = self.marks.get(tid)
        if self.marks_active and mark is not None and mark[0] == block.ts_ns:
            since = max(since, mark[1])
            del self.marks[tid]
        if self.cutoff_ns:
            now = min(now, self.cutoff_ns)
        delta = max(0, now - since)
        captured = block.weight and block.user_stack
        k = CounterKey(block.tgid, tid if self.config.per_thread else 0, block.reason,
                       block.user_stack if captured else 0, block.kernel_stack if captured else 0)
        old = self.counts.get(k, CounterValue(0, 0, 0, 0))
        w = block.weight if captured else 0
        self.counts[k] = CounterValue(old.blocks + 1, old.ns + delta, old.weighted_blocks + w,
                                      old.weighted_ns + w * delta)


def _conforms(maps: MemoryMaps) -> KernelMaps:
    """The stand-in satisfies the protocol the exporter is written against (checked by mypy)."""
    return maps
