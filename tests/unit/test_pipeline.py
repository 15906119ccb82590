"""The pipeline on the in-memory kernel maps: targets reach the kernel filter, every flush reaches
every sink (a failing one does not stop the others), what happened to a process is acted on once,
flushes keep to a fixed schedule, and the last flush ends the window."""

from __future__ import annotations

import gc
import re
from pathlib import Path

from offcpu_exporter.aggregate import Aggregator
from offcpu_exporter.clock import ktime_ns
from offcpu_exporter.pipeline import Pipeline, next_flush_slot
from offcpu_exporter.probe import layout
from offcpu_exporter.sinks import SinkStats
from offcpu_exporter.snapshot import Counter, Snapshot
from offcpu_exporter.targets import ProcessTable, TargetRules
from testkit.kernel_maps import MemoryMaps, exact, key
from testkit.names import Names

U, K = 0x1_0000, 0x2_0000


def _process(root: Path, pid: int, comm: str, start: int) -> None:
    d = root / str(pid)
    (d / "task" / str(pid)).mkdir(parents=True, exist_ok=True)
    (d / "stat").write_text(f"{pid} ({comm}) S 1 " + " ".join(["0"] * 17) + f" {start} 0 0\n")
    (d / "status").write_text(f"Name:\t{comm}\nTgid:\t{pid}\n")
    task = d / "task" / str(pid)
    (task / "stat").write_text(f"{pid} ({comm}) S 1 " + "0 " * 40 + "\n")
    (task / "schedstat").write_text("100 200 7\n")
    (task / "wchan").write_text("do_nanosleep")


class Recorder:
    name = "recorder"

    def __init__(self) -> None:
        self.stats = SinkStats()
        self.snapshots: list[Snapshot] = []
        self.closed = False

    def publish(self, snapshot: Snapshot) -> None:
        self.snapshots.append(snapshot)

    def close(self, timeout: float) -> None:
        self.closed = True


class Broken(Recorder):
    name = "broken"

    def publish(self, snapshot: Snapshot) -> None:
        raise RuntimeError("collector down")


def _pipeline(root: Path, kernel: MemoryMaps) -> Pipeline:
    table = ProcessTable(TargetRules(comm=re.compile("^app$")), proc_root=str(root))
    aggregator = Aggregator(kernel, Names(), table, proc_root=str(root))  # type: ignore[arg-type]
    return Pipeline(kernel, aggregator, table, flush_interval=3600, targets_interval=3600)


def test_targets_reach_the_kernel_filter_and_their_blocked_threads_are_seeded(tmp_path: Path) -> None:
    _process(tmp_path, 42, "app", 100)
    _process(tmp_path, 43, "other", 100)
    kernel = MemoryMaps(per_thread=True)
    pipeline = _pipeline(tmp_path, kernel)
    pipeline.sync_targets()
    assert kernel.targets == {42: layout.TARGET_WATCH}
    (seeded,) = kernel.starts.values()
    assert (seeded.tgid, seeded.user_stack) == (42, layout.STACK_SEEDED)
    (tmp_path / "42" / "stat").unlink()  # it exits: the kernel drops it at once (sched_process_exit)
    del kernel.targets[42]
    pipeline.sync_targets()
    assert kernel.targets == {}  # not added again


def test_every_flush_reaches_every_sink_and_a_broken_one_is_counted(tmp_path: Path) -> None:
    _process(tmp_path, 42, "app", 100)
    kernel = MemoryMaps()
    kernel.stacks = {U: (0x10,), K: (0x20,)}
    pipeline = _pipeline(tmp_path, kernel)
    good, broken = Recorder(), Broken()
    pipeline.sinks = [broken, good]
    pipeline.sync_targets()
    kernel.counts[key(42, U, K)] = exact(2, 2_000)
    first = pipeline.flush()
    kernel.counts[key(42, U, K)] = exact(3, 5_000)
    second = pipeline.flush()
    assert good.snapshots == [first, second] and pipeline.latest() is second
    assert broken.stats.get("failed") == 2
    # (its thread's wait since it was watched is counted too, under the seeded placeholder)
    assert [s.increase for s in second.samples if s.process.pid == 42 and s.stack.user[0].name == "u10"] == [
        Counter(1, 3_000)]
    # the history keeps each flush's changed rows
    assert [(h.sequence, h.samples) for h in pipeline.history(3600)] == [
        (first.sequence, tuple(first.changed())), (second.sequence, tuple(second.changed()))]


def test_flushes_keep_to_a_fixed_schedule_whatever_they_take() -> None:
    # 0.5 s flushes that take 10 ms each: the tenth is due 5 s after the first, not 5.1 s (flushes
    # that drifted by their duration would slip past a steady scraper's reads, see next_flush_slot).
    slot = 100.0
    for _ in range(10):
        slot = next_flush_slot(slot, slot + 0.01, 0.5)
    assert slot == 105.0
    # One that took 1.2 s has missed two slots: the next flush is at the next slot, not three in a row.
    assert next_flush_slot(100.0, 101.2, 0.5) == 101.5
    # One that ended exactly on a slot (a late wake-up) is not followed by another at once.
    assert next_flush_slot(100.0, 100.5, 0.5) == 101.0


def test_the_last_flush_ends_the_window_and_closes_the_sinks(tmp_path: Path) -> None:
    _process(tmp_path, 42, "app", 100)
    kernel = MemoryMaps(per_thread=True)
    kernel.stacks = {U: (0x10,), K: (0x20,)}
    pipeline = _pipeline(tmp_path, kernel)
    sink = Recorder()
    pipeline.sinks = [sink]
    pipeline.sync_targets()
    kernel.starts.clear()
    started = ktime_ns() - 2_000_000_000
    kernel.starts[42] = kernel.starts.get(42) or _block(started)
    end = ktime_ns() - 1_000_000_000  # the window ended a second ago
    pipeline.end_window_at(end)
    pipeline.start()
    pipeline.stop()
    last = sink.snapshots[-1]
    assert sink.closed
    (sample,) = [s for s in last.samples if s.process.pid == 42]
    assert sample.total.ns == end - started  # counted up to the window's end, not to the stop
    assert kernel.cutoff_ns == 0  # lifted after the last flush


def test_a_reused_pid_is_acted_on_once(tmp_path: Path) -> None:
    _process(tmp_path, 42, "app", 100)
    kernel = MemoryMaps()
    kernel.stacks = {U: (0x10,), K: (0x20,)}
    pipeline = _pipeline(tmp_path, kernel)
    pipeline.sync_targets()
    kernel.counts[key(42, U, K)] = exact(1, 100)
    old = pipeline.flush().samples[0].process
    kernel.counts[key(42, U, K)] = exact(2, 300)  # its last block, not read yet
    _process(tmp_path, 42, "app", 999)  # exits; a new app holds the pid
    pipeline.sync_targets()
    assert key(42, U, K) not in kernel.counts  # taken out for the old process
    totals = {s.process: s.total for s in pipeline.flush().samples}
    assert totals[old] == Counter(2, 300)
    new = next(k for k in totals if k != old)
    assert new.start_ticks == 999 and totals[new].count == 0  # only its wait since it was watched


def test_processes_are_prepared_when_the_table_changed_only(tmp_path: Path) -> None:
    """Each second's target sync prepares only the processes that came, went or exec'd since the
    last one, without a walk over the whole table: on a node of thousands of processes most syncs
    change nothing, and those that do change a few."""
    _process(tmp_path, 42, "app", 100)
    kernel = MemoryMaps()
    pipeline = _pipeline(tmp_path, kernel)
    prepared: list[int] = []
    pipeline.aggregator.prepare = prepared.append  # type: ignore[method-assign,assignment]
    walks = 0
    watched = pipeline.processes.watched_pids

    def counting() -> set[int]:
        nonlocal walks
        walks += 1
        return watched()

    pipeline.processes.watched_pids = counting  # type: ignore[method-assign]
    pipeline.sync_targets()
    first = walks
    for _ in range(5):
        pipeline.sync_targets()
    assert walks - first == 5  # the kernel filter's, once per sync: no walk for the preparation
    _process(tmp_path, 44, "app", 100)
    pipeline.sync_targets()  # a rescan (no kernel events here) finds it
    assert prepared == [42, 44]
    assert walks - first == 6  # the kernel filter's only: the new process is found in the table's log


def _block(ts: int):  # type: ignore[no-untyped-def]
    from offcpu_exporter.probe.maps import StartEntry

    return StartEntry(ts, U, K, 42, 1, 1)


def test_the_run_loop_paces_the_cycle_collector_and_gives_it_back_on_stop(tmp_path: Path) -> None:
    _process(tmp_path, 42, "app", 100)
    kernel = MemoryMaps()
    pipeline = _pipeline(tmp_path, kernel)
    frozen_at_publish: list[int] = []

    class Watcher(Recorder):
        def publish(self, snapshot: Snapshot) -> None:
            frozen_at_publish.append(gc.get_freeze_count())
            super().publish(snapshot)

    pipeline.sinks = [Watcher()]
    pipeline.start()
    try:
        pipeline.flush_now()
        pipeline.flush_now()
    finally:
        pipeline.stop()
    # the first flush found nothing frozen; what it left alive was frozen before the next one
    assert frozen_at_publish[0] == 0 and frozen_at_publish[1] > 0
    assert gc.get_freeze_count() == 0
