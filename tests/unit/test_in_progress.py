"""The marks protocol between a flush and the kernel (offcpu_exporter/in_progress.py), against the
in-memory maps playing the kernel's part, with the block ending at every point of the protocol:
every block's time is counted exactly once."""

from __future__ import annotations

from pathlib import Path

import pytest

from offcpu_exporter.in_progress import InProgress
from offcpu_exporter.probe import layout
from offcpu_exporter.probe.maps import StartEntry
from testkit.kernel_maps import MemoryMaps

TID = 7
STACK = 0x1234_5678


class Racing(MemoryMaps):
    """Ends thread TID's block at `end` at one point of the flush: "before_marks" (between the first
    read and the marks' write) or "after_marks" (between the write and the second read)."""

    def __init__(self, when: str, end: int) -> None:
        super().__init__(per_thread=True)
        self.when, self.end = when, end

    def write_marks(self, marks: dict[int, tuple[int, int]]) -> None:
        if self.when == "before_marks" and TID in self.starts:
            self.switch_in(TID, self.end)
        super().write_marks(marks)
        if self.when == "after_marks" and TID in self.starts:
            self.switch_in(TID, self.end)


def _counted(kernel: MemoryMaps, credited: int) -> int:
    return credited + sum(v.ns for v in kernel.counts.values())


@pytest.mark.parametrize("when", ["before_marks", "after_marks"])
def test_a_block_that_ends_during_a_flush_is_counted_once(when: str) -> None:
    kernel = Racing(when="", end=0)
    kernel.starts[TID] = StartEntry(1_000, STACK, STACK, 42, 1, 1)
    progress = InProgress(kernel)  # type: ignore[arg-type]
    credits, blocked = progress.credit(5_000)  # still going on: counted up to 5,000
    assert [c.ns for c in credits] == [4_000] and TID in blocked
    assert kernel.marks[TID] == (1_000, 5_000) and kernel.marks_active
    # It ends during the next flush, which counts up to 9,000 (its clock was read first: the end
    # is later, at 9,500).
    kernel.when, kernel.end = when, 9_500
    more, blocked = progress.credit(9_000)
    counted = _counted(kernel, sum(c.ns for c in credits + more))
    assert counted == 8_500  # 1,000 .. 9,500, once
    assert TID not in blocked and not kernel.marks and not kernel.marks_active


def test_a_block_that_ends_between_flushes_is_counted_once() -> None:
    kernel = MemoryMaps(per_thread=True)
    kernel.starts[TID] = StartEntry(1_000, STACK, STACK, 42, 1, 1)
    progress = InProgress(kernel)  # type: ignore[arg-type]
    credits = [c.ns for c in progress.credit(2_000)[0] + progress.credit(3_000)[0]]
    assert credits == [1_000, 1_000]
    kernel.switch_in(TID, 3_500)
    assert progress.credit(4_000)[0] == []
    assert _counted(kernel, sum(credits)) == 2_500
    assert not kernel.marks and not kernel.marks_active


def test_a_new_block_of_the_same_thread_is_not_charged_with_the_old_mark() -> None:
    kernel = Racing(when="", end=0)
    kernel.starts[TID] = StartEntry(1_000, STACK, STACK, 42, 1, 1)
    progress = InProgress(kernel)  # type: ignore[arg-type]
    first = progress.credit(2_000)[0]
    kernel.switch_in(TID, 2_500)  # counted from the mark: 500
    kernel.starts[TID] = StartEntry(2_600, STACK, STACK, 42, 1, 1)  # blocks again
    second = progress.credit(3_000)[0]
    assert [c.ns for c in first + second] == [1_000, 400]
    kernel.switch_in(TID, 3_100)
    assert _counted(kernel, 1_400) == 1_500 + 500


def test_blocks_shorter_than_min_block_so_far_are_not_counted_yet() -> None:
    kernel = MemoryMaps(per_thread=True, min_block_ns=10_000)
    kernel.starts[TID] = StartEntry(1_000, STACK, STACK, 42, 1, 1)
    progress = InProgress(kernel)  # type: ignore[arg-type]
    assert progress.credit(5_000)[0] == []  # 4,000 so far: it may still end below 10,000
    assert [c.ns for c in progress.credit(12_000)[0]] == [11_000]


def test_nothing_is_credited_with_max_block() -> None:
    # Whether a block counts at all is known only when it ends.
    kernel = MemoryMaps(per_thread=True, max_block_ns=1_000_000)
    kernel.starts[TID] = StartEntry(1_000, STACK, STACK, 42, 1, 1)
    credits, blocked = InProgress(kernel).credit(5_000)  # type: ignore[arg-type]
    assert credits == [] and TID in blocked and not kernel.marks


def _task(root: Path, tgid: int, tid: int, state: str, runs: int, wchan: str | None = None) -> None:
    d = root / str(tgid) / "task" / str(tid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "stat").write_text(f"{tid} (a (b) c) {state} 1 " + "0 " * 40 + "\n")
    (d / "schedstat").write_text(f"100 200 {runs}\n")
    (d / "wchan").write_text(wchan or ("0" if state == "R" else "do_nanosleep"))


def test_threads_off_cpu_when_watching_begins_are_seeded(tmp_path: Path) -> None:
    _task(tmp_path, 50, 50, "S", 3)
    _task(tmp_path, 50, 51, "D", 9)
    _task(tmp_path, 50, 52, "R", 1)  # running or runnable: the probe sees its next switch-out
    _task(tmp_path, 50, 54, "S", 1, wchan="0")  # set to sleep, but still on its run queue
    kernel = MemoryMaps(per_thread=True)
    kernel.starts[53] = StartEntry(5, STACK, STACK, 50, 1, 1)  # the probe's own: kept
    _task(tmp_path, 50, 53, "S", 4)
    assert InProgress(kernel, proc_root=str(tmp_path)).seed(50) == 2  # type: ignore[arg-type]
    assert {tid: (b.reason, b.user_stack) for tid, b in kernel.starts.items()} == {
        50: (1, layout.STACK_SEEDED), 51: (2, layout.STACK_SEEDED), 53: (1, STACK)}


def test_a_seeded_block_counts_from_when_its_process_was_put_in_the_filter(tmp_path: Path) -> None:
    # Its stacks are read later (after the mappings of every new target): the thread has been off
    # CPU since before the filter took the process, not since the moment it is seeded.
    _task(tmp_path, 50, 50, "S", 3)
    kernel = MemoryMaps(per_thread=True)
    assert InProgress(kernel, proc_root=str(tmp_path)).seed(50, since_ns=1_234) == 1  # type: ignore[arg-type]
    assert kernel.starts[50].ts_ns == 1_234
    _task(tmp_path, 60, 60, "S", 3)
    assert InProgress(kernel, proc_root=str(tmp_path)).seed(60) == 1  # type: ignore[arg-type]
    assert kernel.starts[60].ts_ns > 1_234  # by default: now


def test_a_thread_that_runs_while_it_is_seeded_is_not_seeded(tmp_path: Path) -> None:
    _task(tmp_path, 50, 50, "S", 3)

    class Woken(MemoryMaps):
        def seed_start(self, tid: int, entry: StartEntry) -> bool:
            stored = super().seed_start(tid, entry)
            _task(tmp_path, 50, 50, "S", 4)  # it ran (and slept again) meanwhile
            return stored

    kernel = Woken(per_thread=True)
    assert InProgress(kernel, proc_root=str(tmp_path)).seed(50) == 0  # type: ignore[arg-type]
    assert kernel.starts == {}
