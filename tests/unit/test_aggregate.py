"""The delta logic against an in-memory stand-in for the kernel maps (the real maps are exercised
by tests/e2e/test_probe.py): first flush, zero increase, a key drained or gone, a restarted run,
sampled estimates split over stacks, blocks in progress, stacks freed."""

from __future__ import annotations

import errno
import itertools
import re
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from offcpu_exporter import aggregate, stack_names
from offcpu_exporter.aggregate import AggregateConfig, Aggregator
from offcpu_exporter.clock import ktime_ns
from offcpu_exporter.counters import increase
from offcpu_exporter.groups import apportion
from offcpu_exporter.probe import layout
from offcpu_exporter.probe.maps import CounterValue, StartEntry
from offcpu_exporter.snapshot import ZERO, Counter, Frame, LostHalf, Reason, Rollup
from offcpu_exporter.symbols import UNKNOWN
from offcpu_exporter.targets import ProcessTable, TargetRules
from testkit.kernel_maps import MemoryMaps, exact, key
from testkit.names import Names


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "stat").write_text("42 (my (app)) S 1 " + " ".join(["0"] * 17) + " 777 0 0\n")
    (tmp_path / "42" / "status").write_text("Name:\tapp\nTgid:\t42\n")
    return tmp_path


def _aggregator(proc: Path, kernel: MemoryMaps, **config: float) -> Aggregator:
    table = ProcessTable(TargetRules(pids=(42,)), proc_root=str(proc))
    assert table.start() == []
    return Aggregator(kernel, Names(), table, AggregateConfig(**config))  # type: ignore[arg-type]


U1, U2, K1, K2 = 0x1001_0000, 0x1002_0000, 0x2001_0000, 0x2002_0000  # stack ids (hashes)
KEY = key(42, U1, K1)


def _kernel(per_thread: bool = False) -> MemoryMaps:
    kernel = MemoryMaps(per_thread=per_thread)
    kernel.stacks = {U1: (0x10, 0x20), U2: (0x30,), K1: (0xA, 0xB), K2: (0xC,)}
    return kernel


def _names(sample) -> tuple[tuple[str, ...], tuple[str, ...]]:  # type: ignore[no-untyped-def]
    return tuple(f.name for f in sample.stack.user), tuple(f.name for f in sample.stack.kernel)


def test_increase_rules() -> None:
    assert increase(exact(5, 500), None) == exact(5, 500)  # first read
    assert increase(exact(5, 500), exact(5, 500)) == exact(0, 0)  # no change
    assert increase(exact(7, 900), exact(5, 500)) == exact(2, 400)
    assert increase(exact(1, 100), exact(5, 500)) == exact(1, 100)  # re-created since: all of it is new


@given(st.integers(0, 10**15), st.lists(st.integers(0, 10**9), min_size=1, max_size=30))
def test_apportion_sums_exactly_and_follows_the_weights(total: int, weights: list[int]) -> None:
    shares = apportion(total, weights)
    if sum(weights) == 0:
        assert shares == [0] * len(weights)
        return
    assert sum(shares) == total
    for share, weight in zip(shares, weights, strict=True):
        assert abs(share - total * weight / sum(weights)) < 1 + 1e-9 * total


def test_first_flush_then_increases_then_zero(proc: Path) -> None:
    kernel = _kernel()
    agg = _aggregator(proc, kernel)
    kernel.counts[KEY] = exact(3, 3_000)
    snap = agg.flush()
    (sample,) = snap.samples
    assert sample.total == sample.increase == Counter(3, 3_000)
    assert _names(sample) == (("u10", "u1f"), ("ka", "kb"))
    assert snap.processes[sample.process].info.comm == "my (app)"
    assert snap.processes[sample.process].total == Counter(3, 3_000)

    kernel.counts[KEY] = exact(5, 7_000)
    (sample,) = agg.flush().samples
    assert sample.increase == Counter(2, 4_000)
    assert sample.total == Counter(5, 7_000)

    (sample,) = agg.flush().samples  # nothing new: zero increase, total kept
    assert sample.increase == ZERO
    assert sample.total == Counter(5, 7_000)


def test_sampled_stacks_share_the_exact_total_in_proportion_to_their_estimates(proc: Path) -> None:
    kernel = _kernel()
    agg = _aggregator(proc, kernel)
    # 1,000 blocks of the thread, 9.5 s; three blocks' stacks were captured with weight 100, 200, 100.
    kernel.counts[key(42, 0, 0)] = CounterValue(997, 9_200_000_000, 0, 0)
    kernel.counts[key(42, U1, K1)] = CounterValue(2, 200_000_000, 200, 20_000_000_000)
    kernel.counts[key(42, U2, K2)] = CounterValue(1, 100_000_000, 200, 10_000_000_000)
    snap = agg.flush()
    by_stack = {_names(s): s.total for s in snap.samples}
    assert by_stack[(("u10", "u1f"), ("ka", "kb"))] == Counter(500, 6_333_333_333)
    assert by_stack[(("u30",), ("kc",))] == Counter(500, 3_166_666_667)
    total = sum(by_stack.values(), ZERO)
    assert total == Counter(1_000, 9_500_000_000) == next(iter(snap.processes.values())).total


def test_blocks_no_sample_carries_are_shown_as_not_sampled(proc: Path) -> None:
    kernel = _kernel()
    agg = _aggregator(proc, kernel)
    kernel.counts[key(42, 0, 0)] = CounterValue(10, 1_000, 0, 0)
    (sample,) = agg.flush().samples
    assert _names(sample) == (("[stack not sampled]",), ())
    assert sample.total == Counter(10, 1_000)


def test_blocks_whose_counter_could_not_be_created_are_shown_as_lost(proc: Path) -> None:
    kernel = _kernel()
    agg = _aggregator(proc, kernel)
    kernel.counts[key(42, 0, 0)] = CounterValue(4, 4_000, 4, 4_000)  # folded into the stackless key
    kernel.counts[KEY] = exact(4, 4_000)
    by_stack = {_names(s): s.total for s in agg.flush().samples}
    assert by_stack == {(("[lost stack: counter map full]",), ()): Counter(4, 4_000),
                        (("u10", "u1f"), ("ka", "kb")): Counter(4, 4_000)}


def test_idle_key_is_drained_its_total_survives_and_its_stacks_are_freed(proc: Path) -> None:
    kernel = _kernel()
    agg = _aggregator(proc, kernel, age_after=2)
    kernel.counts[KEY] = exact(1, 100)
    agg.flush()
    agg.flush()  # idle 1
    snap = agg.flush()  # idle 2: drained
    assert KEY not in kernel.counts
    (sample,) = snap.samples
    assert sample.total == Counter(1, 100)
    agg.flush()  # nothing references the stacks any more
    assert {U1, K1} <= kernel.deleted_stacks
    # The kernel re-creates the key from zero: its new value is all increase, no fake jump.
    kernel.stacks.update({U1: (0x10, 0x20), K1: (0xA, 0xB)})
    kernel.counts[KEY] = exact(2, 50)
    (sample,) = agg.flush().samples
    assert sample.increase == Counter(2, 50)
    assert sample.total == Counter(3, 150)


def test_a_counter_created_while_its_stack_was_freed_keeps_its_frames(proc: Path) -> None:
    # The stack is unreferenced when the flush reads the maps (the block that captured it has not
    # ended yet, and its start was consumed): it is freed; the counter then appears.
    kernel = _kernel()
    agg = _aggregator(proc, kernel)
    agg.flush()
    assert {U1, U2, K1, K2} <= kernel.deleted_stacks
    kernel.counts[KEY] = exact(1, 100)
    snap = agg.flush()
    (sample,) = snap.samples
    assert _names(sample) == (("u10", "u1f"), ("ka", "kb"))
    assert not snap.health.lost_stacks


def test_stacks_of_blocks_in_progress_are_not_freed(proc: Path) -> None:
    kernel = _kernel()
    kernel.starts[7] = StartEntry(1, U1, K1, 42, 1, 1)
    agg = _aggregator(proc, kernel)
    agg.flush()
    assert kernel.deleted_stacks == {U2, K2}


def test_full_map_is_drained_at_the_high_water_mark(proc: Path) -> None:
    kernel = MemoryMaps(max_counts=10)
    kernel.stacks = {0x5000 + i: (i,) for i in range(20)}
    agg = _aggregator(proc, kernel, high_water=0.8, age_after=100)
    for i in range(8):
        kernel.counts[key(42, 0x5000 + i, 0x5000 + 10 + i)] = exact(1, 10)
    snap = agg.flush()
    assert not kernel.counts  # everything was busy: drained at once, totals kept
    assert sum((s.total for s in snap.samples), ZERO) == Counter(8, 80)


def test_lost_stacks_become_placeholder_frames_and_are_counted(proc: Path) -> None:
    kernel = _kernel()
    agg = _aggregator(proc, kernel)
    kernel.counts[key(42, layout.STACK_ERRNO_BASE + errno.ENOMEM, K1)] = exact(4, 400)
    kernel.counts[key(42, layout.STACK_EMPTY, layout.STACK_ERRNO_BASE + errno.EFAULT)] = exact(1, 10)
    snap = agg.flush()
    names = {_names(s) for s in snap.samples}
    assert (("[lost stack: stack map full]",), ("ka", "kb")) in names
    assert ((), ("[lost stack: not captured]",)) in names  # no user stack: empty half, not lost
    assert snap.health.lost_stacks == {LostHalf("user", "ENOMEM"): 4, LostHalf("kernel", "EFAULT"): 1}
    assert sum((s.total for s in snap.samples), ZERO) == snap.processes[snap.samples[0].process].total


def test_stolen_time_is_time_without_switches_under_its_own_placeholder(proc: Path) -> None:
    """The probe counts what a running thread lost without a switch (charge_stolen()) as ns only,
    weight 1, under OFFCPU_STACK_STOLEN and an empty kernel half."""
    kernel = _kernel()
    agg = _aggregator(proc, kernel)
    kernel.counts[key(42, U1, K1)] = exact(2, 200)
    kernel.counts[key(42, layout.STACK_STOLEN, layout.STACK_EMPTY, reason=Reason.STOLEN)] = CounterValue(0, 70, 0, 70)
    snap = agg.flush()
    (stolen,) = [s for s in snap.samples if s.reason is Reason.STOLEN]
    assert _names(stolen) == (("[stolen: the CPU ran something else without a switch]",), ())
    assert stolen.total == Counter(0, 70)  # time, no switch
    assert snap.health.lost_stacks == {}
    assert snap.processes[stolen.process].total == Counter(2, 270)


def test_new_exporter_run_starts_from_zero(proc: Path) -> None:
    kernel = _kernel()
    kernel.counts[KEY] = exact(3, 300)
    first = _aggregator(proc, kernel)
    first.flush()
    restarted = _aggregator(proc, MemoryMaps())  # a new run loads a new program with empty maps
    snap = restarted.flush()
    assert snap.samples == ()
    assert snap.sequence == 1


class LateMapping(Names):
    """0x20 is in no mapping until `mapped` (a library dlopen'ed, a JIT perf map written); the
    symbolizer's generation says when its view of the process changed."""

    def __init__(self) -> None:
        self.mapped = False
        self.changes = 0
        self.calls = 0

    def generation(self, pid: int) -> int:
        return self.changes + self.mapped

    def user(self, pid, addresses):  # type: ignore[no-untyped-def]
        self.calls += 1
        return tuple(UNKNOWN if a == 0x1f and not self.mapped else Frame(f"u{a:x}") for a in addresses)


def _late_mapping_aggregator(proc: Path) -> tuple[MemoryMaps, LateMapping, Aggregator]:
    kernel = MemoryMaps()
    kernel.stacks = {U1: (0x10, 0x20), K1: (0xA,)}
    names = LateMapping()
    table = ProcessTable(TargetRules(pids=(42,)), proc_root=str(proc))
    table.start()
    return kernel, names, Aggregator(kernel, names, table)  # type: ignore[arg-type]


def test_a_stack_with_an_unmapped_address_is_named_at_the_next_flush(proc: Path) -> None:
    # Flushes back to back: the retry follows the symbolizer's view of the process, not a clock.
    kernel, names, agg = _late_mapping_aggregator(proc)
    kernel.counts[KEY] = exact(1, 1_000)
    (sample,) = agg.flush().samples
    assert [f.name for f in sample.stack.user] == ["u10", "[unknown]"]
    names.mapped = True
    kernel.counts[KEY] = exact(3, 5_000)
    by_user = {tuple(f.name for f in s.stack.user): s for s in agg.flush().samples}
    # What was counted stays where it was; from now on counts go to the named stack.
    assert by_user[("u10", "[unknown]")].total == Counter(1, 1_000)
    assert by_user[("u10", "u1f")].increase == Counter(2, 4_000)
    assert names.refreshes == 1


def test_a_stack_that_stays_unmapped_is_named_again_only_when_the_process_changed(
        proc: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stack_names, "_RETRY_FIRST_SECONDS", 0.0)  # flushes back to back: every one re-reads
    kernel, names, agg = _late_mapping_aggregator(proc)
    for n in range(1, 6):
        kernel.counts[KEY] = exact(n, n * 1_000)
        (sample,) = agg.flush().samples
        assert sample.total == Counter(n, n * 1_000)
    assert names.calls == 1  # nothing changed: nothing to gain from naming it again
    names.changes += 1  # say, a library was mapped, but not where 0x20 is
    kernel.counts[KEY] = exact(6, 6_000)
    agg.flush()
    assert names.calls == 2
    assert [f.name for f in agg.flush().samples[0].stack.user] == ["u10", "[unknown]"]


class _Clock:
    """stack_names' `time`, with a monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def monotonic(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)


def test_an_unmapped_stack_makes_its_process_be_read_again_less_and_less_often(
        proc: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    monkeypatch.setattr(stack_names, "time", clock)
    kernel, names, agg = _late_mapping_aggregator(proc)
    refreshed_at = []
    for n in range(1, 41):  # 20 s of flushes every 0.5 s
        kernel.counts[KEY] = exact(n, n * 1_000)
        before = getattr(names, "refreshes", 0)
        agg.flush()
        if getattr(names, "refreshes", 0) > before:
            refreshed_at.append(clock.now - 1_000.0)
        clock.now += 0.5
    # Seen at 0; read again at the next flush, then 1, 2, 4, 8 s later; given up after 30 s.
    assert refreshed_at == [0.5, 1.5, 3.5, 7.5, 15.5]


def test_processes_read_again_for_unmapped_stacks_are_few_per_flush(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    monkeypatch.setattr(stack_names, "time", clock)
    pids = range(100, 100 + 3 * stack_names._RETRY_BUDGET)
    for pid in pids:
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (app) S 1 " + " ".join(["0"] * 17) + " 777 0 0\n")
        (tmp_path / str(pid) / "status").write_text(f"Name:\tapp\nTgid:\t{pid}\n")
    kernel = MemoryMaps()
    kernel.stacks = {U1: (0x10, 0x20), K1: (0xA,)}
    names = LateMapping()
    table = ProcessTable(TargetRules(pids=tuple(pids)), proc_root=str(tmp_path))
    table.start()
    agg = Aggregator(kernel, names, table)  # type: ignore[arg-type]
    for pid in pids:  # thousands of processes started at once, each with a stack not named yet
        kernel.counts[key(pid, U1, K1)] = exact(1, 1_000)
    agg.flush()
    read: list[int] = []

    def refresh(pid: int) -> int:
        read.append(pid)
        return names.generation(pid)

    names.refresh = refresh  # type: ignore[method-assign]
    per_flush = []
    for _ in range(4):
        clock.now += 0.5
        before = len(read)
        agg.flush()
        per_flush.append(read[before:])
    assert [len(p) for p in per_flush] == [stack_names._RETRY_BUDGET] * 4
    # The longest waiting first: every process is read again within three flushes, then the first
    # ones again (1 s after their first re-read).
    assert sorted(per_flush[0] + per_flush[1] + per_flush[2]) == list(pids)
    assert per_flush[3] == per_flush[0]


def test_unmapped_stacks_are_given_up_on_after_the_window(proc: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stack_names, "_UNRESOLVED_WINDOW_SECONDS", 0.0)
    kernel, names, agg = _late_mapping_aggregator(proc)
    kernel.counts[KEY] = exact(1, 1_000)
    agg.flush()
    names.changes += 1
    kernel.counts[KEY] = exact(2, 2_000)
    agg.flush()  # one last try, then no more
    names.changes += 1
    kernel.counts[KEY] = exact(3, 3_000)
    agg.flush()
    assert names.calls == 2
    assert names.refreshes == 1


def test_before_the_first_flush_the_snapshot_says_the_probe_is_attached(proc: Path) -> None:
    # A scrape right after start must not read as "probe not attached" (an alert) for a flush interval.
    agg = _aggregator(proc, MemoryMaps())
    first = agg.initial_snapshot()
    health = first.health
    assert first.sequence == 0 and not first.samples
    assert (health.probe_attached, health.attach_mode, health.targets) == (True, "tracepoint", 1)
    assert health.map_capacity and health.flushes == 0


def test_blocks_in_progress_count_up_to_the_flush_and_show_as_blocked_now(proc: Path) -> None:
    kernel = _kernel(per_thread=True)
    started = ktime_ns() - 2_000_000_000
    kernel.starts[42] = StartEntry(started, U1, K1, 42, Reason.UNINTERRUPTIBLE.value, 1)
    agg = _aggregator(proc, kernel)
    snap = agg.flush()
    (sample,) = snap.samples
    assert sample.reason is Reason.UNINTERRUPTIBLE and sample.tid == 42
    assert _names(sample) == (("u10", "u1f"), ("ka", "kb"))
    assert sample.total.count == 0 and 2.0 <= sample.total.seconds < 2.5  # no block has ended yet
    blocked = snap.processes[sample.process].blocked[Reason.UNINTERRUPTIBLE]
    assert blocked.threads == 1 and 2.0 <= blocked.longest_seconds < 2.5
    kernel.switch_in(42, ktime_ns())  # it ends: the kernel counts it from the flush on
    snap = agg.flush()
    (sample,) = snap.samples
    assert sample.total.count == 1
    assert sample.total.ns == pytest.approx(ktime_ns() - started, abs=300_000_000)
    assert snap.processes[sample.process].blocked == {}


def test_a_final_flush_ends_the_window(proc: Path) -> None:
    kernel = _kernel(per_thread=True)
    kernel.starts[42] = StartEntry(ktime_ns() - 1_000_000_000, U1, K1, 42, 1, 1)
    agg = _aggregator(proc, kernel)
    until = ktime_ns() - 500_000_000
    (sample,) = agg.flush(final=True, until_ns=until).samples
    assert sample.total.ns == pytest.approx(500_000_000, abs=50_000_000)
    assert kernel.cutoff_ns == 0  # set for the flush, lifted after it (the probe may be shared)


def test_an_expired_process_keeps_its_last_increase_for_one_more_flush(proc: Path) -> None:
    kernel = _kernel()
    agg = _aggregator(proc, kernel, exited_grace_seconds=0.0)
    kernel.counts[KEY] = exact(1, 100)
    agg.flush()
    (proc / "42" / "stat").unlink()  # it exits
    agg.processes.refresh()
    kernel.counts[KEY] = exact(2, 300)  # its last blocks, read after its grace ran out
    (sample,) = agg.flush().samples
    assert sample.increase == Counter(1, 200)
    assert agg.flush().samples == ()  # then it is gone


def test_a_reused_pid_gives_the_kernel_counters_and_histogram_to_the_old_process(proc: Path) -> None:
    kernel = _kernel()
    table = ProcessTable(TargetRules(comm=re.compile("app|new")), proc_root=str(proc))
    table.refresh()
    agg = Aggregator(kernel, Names(), table)  # type: ignore[arg-type]
    kernel.counts[KEY] = exact(1, 100)
    kernel.hist[42] = [0] * layout.HIST_SLOTS
    kernel.hist[42][5] = 1
    old = agg.flush().samples[0].process
    kernel.counts[KEY] = exact(3, 400)  # its last blocks before it exited
    kernel.hist[42][5] = 3
    (proc / "42" / "stat").write_text("42 (new) S 1 " + " ".join(["0"] * 17) + " 999 0 0\n")
    agg.processes.refresh()
    agg.process_replaced(old)
    assert KEY not in kernel.counts and 42 not in kernel.hist
    kernel.counts[KEY] = exact(1, 50)  # the new process
    kernel.hist[42] = [0] * layout.HIST_SLOTS
    kernel.hist[42][7] = 1
    snap = agg.flush()
    totals = {s.process: s.total for s in snap.samples}
    assert totals[old] == Counter(3, 400)
    new = next(k for k in totals if k != old)
    assert totals[new] == Counter(1, 50)
    assert snap.processes[old].histogram[5] == 3
    assert snap.processes[new].histogram[7] == 1 and snap.processes[new].histogram[5] == 0


def test_the_rollups_sum_every_process_counted_and_exits_do_not_lower_them(proc: Path) -> None:
    """Snapshot.everything and .containers, which outputs folding many processes read instead of
    every view: the sums of the views while all are present, kept when a process is replaced and
    when it expires."""
    kernel = _kernel()
    table = ProcessTable(TargetRules(comm=re.compile("app|new")), proc_root=str(proc))
    table.refresh()
    agg = Aggregator(kernel, Names(), table, AggregateConfig(exited_grace_seconds=0.0))  # type: ignore[arg-type]
    kernel.counts[KEY] = exact(1, 100)
    kernel.counts[key(42, U2, K2, reason=2)] = exact(2, 50)
    kernel.hist[42] = [0] * layout.HIST_SLOTS
    kernel.hist[42][5] = 3
    snap = agg.flush()
    (view,) = snap.processes.values()
    assert snap.everything.total == view.total == Counter(3, 150)
    assert snap.everything.by_reason == view.by_reason
    assert snap.everything.histogram == view.histogram
    assert snap.containers == {("", "", ""): Rollup(Counter(3, 150), {}, view.histogram)}
    old = view.info.key
    kernel.counts[KEY] = exact(4, 400)  # the old process's last blocks
    (proc / "42" / "stat").write_text("42 (new) S 1 " + " ".join(["0"] * 17) + " 999 0 0\n")
    agg.processes.refresh()
    agg.process_replaced(old)
    kernel.counts[KEY] = exact(1, 7)  # the new process
    kernel.hist[42] = [0] * layout.HIST_SLOTS
    kernel.hist[42][7] = 1
    snap = agg.flush()
    assert snap.everything.total == sum((v.total for v in snap.processes.values()), ZERO) == Counter(7, 457)
    (proc / "42" / "stat").unlink()  # the new one exits too, and both are past their grace
    agg.processes.refresh()
    agg.flush()
    snap = agg.flush()
    assert not snap.processes and not snap.containers
    assert snap.everything.total == Counter(7, 457)
    assert snap.everything.histogram[5] == 3 and snap.everything.histogram[7] == 1


def test_per_thread_totals_are_in_the_process_view(proc: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aggregate, "_thread_name", lambda proc_root, tgid, tid: f"worker-{tid}")
    kernel = _kernel(per_thread=True)
    agg = _aggregator(proc, kernel)
    kernel.counts[key(42, U1, K1, Reason.SLEEPING.value, tid=100)] = exact(3, 3_000)
    kernel.counts[key(42, U2, K1, Reason.RUNNABLE.value, tid=100)] = exact(1, 50)
    kernel.counts[key(42, U1, K1, Reason.SLEEPING.value, tid=101)] = exact(2, 700)
    agg.flush()
    kernel.counts[key(42, U1, K1, Reason.SLEEPING.value, tid=101)] = exact(5, 1_700)
    view = next(iter(agg.flush().processes.values()))
    assert set(view.threads) == {100, 101}
    first, second = view.threads[100], view.threads[101]
    assert (first.tid, first.name, second.name) == (100, "worker-100", "worker-101")
    assert first.total == Counter(4, 3_050)
    assert dict(first.by_reason) == {Reason.SLEEPING: Counter(3, 3_000), Reason.RUNNABLE: Counter(1, 50)}
    assert second.total == Counter(5, 1_700)  # cumulative, like the process's
    assert first.total + second.total == view.total


def test_without_thread_ids_the_process_view_has_no_threads(proc: Path) -> None:
    kernel = _kernel()
    agg = _aggregator(proc, kernel)
    kernel.counts[KEY] = exact(3, 3_000)
    view = next(iter(agg.flush().processes.values()))
    assert view.total == Counter(3, 3_000) and not view.threads


def test_user_stacks_are_named_by_call_site_and_short_ones_are_reported(proc: Path) -> None:
    class Rooted(Names):
        def user(self, pid, addresses):  # type: ignore[no-untyped-def]
            self.seen = addresses
            return tuple(Frame("_start" if a == 0x1f else f"u{a:x}") for a in addresses)

    kernel = _kernel()
    names = Rooted()
    table = ProcessTable(TargetRules(pids=(42,)), proc_root=str(proc))
    table.start()
    agg = Aggregator(kernel, names, table)  # type: ignore[arg-type]
    kernel.counts[KEY] = exact(1, 100)  # U1: 0x10 (the leaf), 0x20 (a return address)
    agg.flush()
    assert names.seen == (0x10, 0x1F)  # the return address is looked up at its call instruction
    assert agg.take_truncated() == set()  # it ends in _start
    kernel.counts[key(42, U2, K1)] = exact(1, 100)  # U2: one frame, stopped short
    agg.flush()
    assert agg.take_truncated() == {42}
    assert agg.take_truncated() == set()  # taken once


def test_a_freed_stack_stays_named_while_a_long_block_references_it(proc: Path) -> None:
    # The stack is in the map, unreferenced, when a flush frees it; a block that began just then
    # with the same frames (no new capture: they were in the map) lasts many flushes, then ends.
    kernel = _kernel(per_thread=True)
    agg = _aggregator(proc, kernel)
    agg.flush()
    assert U1 in kernel.deleted_stacks
    kernel.starts[42] = StartEntry(ktime_ns(), U1, K1, 42, 1, 1)
    for _ in range(10):
        agg.flush()
    kernel.switch_in(42, ktime_ns())
    names = {_names(s) for s in agg.flush().samples}
    assert names == {(("u10", "u1f"), ("ka", "kb"))}, names


def test_the_first_interval_starts_when_the_probe_was_attached(proc: Path) -> None:
    """Outputs that cover an interval (OTLP profiles' time and duration, pprof, record) must not
    cover time before the probe counted: the aggregator may be made well before the attach."""
    kernel = _kernel()
    agg = _aggregator(proc, kernel)
    kernel.attached_wall_ns = time.time_ns()  # the probe attaches after the aggregator was made
    kernel.counts[KEY] = exact(1, 100)
    snap = agg.flush()
    assert snap.interval_start_ns == snap.start_time_ns == kernel.attached_wall_ns
    assert agg.initial_snapshot().start_time_ns == kernel.attached_wall_ns


def test_no_thread_is_credited_more_than_wall_time(proc: Path) -> None:
    """Should the kernel's figures and the blocks in progress ever add up to more than a thread's
    wall time (a counting bug), the excess is clamped, counted and logged instead of published."""
    kernel = _kernel(per_thread=True)
    kernel.attached_ktime_ns = ktime_ns() - 1_000_000_000
    agg = _aggregator(proc, kernel)
    kernel.counts[key(42, U1, K1, tid=42)] = exact(3, 3_000_000_000)  # 3 s in the 1 s since attach
    snap = agg.flush()
    (sample,) = snap.samples
    assert 1_000_000_000 <= sample.total.ns < 1_100_000_000
    assert sample.total.count == 3  # switches are not time: left as counted
    assert snap.health.clamped_ns == pytest.approx(2_000_000_000, abs=100_000_000)
    # Over two flushes, a thread covers at most the time from the flush before the previous one.
    kernel.counts[key(42, U1, K1, tid=42)] = exact(4, 5_000_000_000)
    kernel.counts[key(42, U2, K2, tid=42)] = exact(1, 1_000)
    snap = agg.flush()
    assert sum(s.total.ns for s in snap.samples) <= ktime_ns() - kernel.attached_ktime_ns
    assert snap.health.clamped_ns >= 3_900_000_000


def test_a_window_is_as_long_as_the_kernel_time_it_credits_a_thread_blocked_throughout(proc: Path) -> None:
    """Snapshots are dated in wall time, blocks timed by the kernel's clock: a thread blocked across
    several flushes is credited, between two snapshots, exactly the wall time between them, to the
    nanosecond (dating each snapshot by reading both clocks again made it 1 ns more, in CI)."""
    kernel = _kernel(per_thread=True)
    kernel.starts[42] = StartEntry(ktime_ns() - 1_000_000_000, U1, K1, 42, 1, 1)
    agg = _aggregator(proc, kernel)
    snapshots = []
    for _ in range(20):
        snapshots.append(agg.flush())
        time.sleep(0.001)
    for earlier, later in itertools.pairwise(snapshots):
        credited = sum(s.total.ns for s in later.samples) - sum(s.total.ns for s in earlier.samples)
        assert credited == later.time_ns - earlier.time_ns


def test_the_truth_is_never_clamped(proc: Path) -> None:
    kernel = _kernel(per_thread=True)
    kernel.attached_ktime_ns = ktime_ns() - 1_000_000_000
    kernel.starts[42] = StartEntry(kernel.attached_ktime_ns, U1, K1, 42, 1, 1)
    agg = _aggregator(proc, kernel)
    for _ in range(3):
        time.sleep(0.05)
        snap = agg.flush()
    kernel.switch_in(42, ktime_ns())
    kernel.starts[42] = StartEntry(ktime_ns(), U2, K2, 42, 1, 1)
    snap = agg.flush()
    assert snap.health.clamped_ns == 0
    assert sum(s.total.ns for s in snap.samples) == pytest.approx(ktime_ns() - kernel.attached_ktime_ns,
                                                                  abs=50_000_000)


class SlowNames(Names):
    """Names a stack for the first time slowly: a large binary's symbols read on first use."""

    def user(self, pid, addresses):  # type: ignore[no-untyped-def]
        if not getattr(self, "warm", False):
            time.sleep(0.6)
            self.warm = True
        return super().user(pid, addresses)


def test_a_snapshot_is_never_published_long_after_what_it_counts(proc: Path) -> None:
    """A flush that takes long counts again up to the moment it is done: published figures that are
    older than their publication would be read as the figures of the later moment, and a window
    between such a snapshot and a timely one would hold more off-CPU time than wall time."""
    kernel = _kernel(per_thread=True)
    started = ktime_ns() - 1_000_000_000
    kernel.starts[42] = StartEntry(started, U1, K1, 42, 1, 1)
    table = ProcessTable(TargetRules(pids=(42,)), proc_root=str(proc))
    table.start()
    agg = Aggregator(kernel, SlowNames(), table)  # type: ignore[arg-type]
    snap = agg.flush()
    published = time.time_ns()
    assert published - snap.time_ns < 300_000_000, "figures older than their publication"
    (sample,) = snap.samples
    # The block in progress counts up to the snapshot's own time, not to the start of the flush.
    assert sample.total.ns == pytest.approx(ktime_ns() - started - (published - snap.time_ns), abs=30_000_000)


class SlowReads(MemoryMaps):
    """Maps whose every read takes long: tens of thousands of threads, every pass alike."""

    def read_counts(self):  # type: ignore[no-untyped-def]
        self.reads = getattr(self, "reads", 0) + 1
        time.sleep(aggregate._MAX_LAG_NS / 1e9 * 1.2)
        return super().read_counts()


def test_a_pass_that_is_slow_by_itself_is_not_repeated(proc: Path) -> None:
    """Counting again only helps when the pass was slow for a one-off reason (new names): a pass
    slow by itself would be as slow again and publish as late, at twice the cost (a 10,000-process
    node spent 2 passes of 0.6 s on every flush)."""
    kernel = SlowReads()
    kernel.stacks = {U1: (0x10, 0x20), K1: (0xA,)}
    kernel.counts[KEY] = exact(1, 1_000)
    agg = _aggregator(proc, kernel)
    agg.flush()
    assert kernel.reads == 1  # late, though not for naming: not counted again


def test_a_pass_slow_for_new_names_is_repeated_once(proc: Path) -> None:
    kernel = SlowReads()
    kernel.stacks = {U1: (0x10, 0x20), K1: (0xA,)}
    kernel.counts[KEY] = exact(1, 1_000)
    table = ProcessTable(TargetRules(pids=(42,)), proc_root=str(proc))
    table.start()
    Aggregator(kernel, SlowNames(), table).flush()  # type: ignore[arg-type]
    # The first pass names for 0.6 s and reads for 0.3 s: counted again, by a pass that reads as
    # slowly but names nothing, so not a third time.
    assert kernel.reads == 2


def test_each_snapshot_sums_to_its_samples_and_reuses_what_did_not_change(proc: Path) -> None:
    """The views' totals are kept as the samples change rather than summed anew at each flush:
    at every flush they still equal the sums of the samples, per process, reason and thread, and
    a sample that did not change is the same object as in the snapshot before."""
    kernel = _kernel(per_thread=True)
    agg = _aggregator(proc, kernel)
    steps = [  # (tid, reason, user stack, kernel stack) -> cumulative (blocks, ns) at each flush
        {(42, 1, U1, K1): (1, 100), (43, 1, U2, K2): (2, 200)},
        {(42, 1, U1, K1): (1, 100), (43, 1, U2, K2): (5, 900), (43, 2, U1, K2): (1, 50)},
        {(42, 1, U1, K1): (4, 400), (43, 1, U2, K2): (5, 900), (43, 2, U1, K2): (1, 50)},
        {(42, 1, U1, K1): (4, 400), (43, 1, U2, K2): (5, 900), (43, 2, U1, K2): (1, 50)},
    ]
    before = None
    for step in steps:
        for (tid, reason, user, kern), (blocks, ns) in step.items():
            kernel.counts[key(42, user, kern, reason=reason, tid=tid)] = exact(blocks, ns)
        snap = agg.flush()
        (view,) = snap.processes.values()
        assert view.total == sum((s.total for s in snap.samples), ZERO)
        for reason, total in view.by_reason.items():
            assert total == sum((s.total for s in snap.samples if s.reason == reason), ZERO)
        for tid, thread in view.threads.items():
            assert thread.total == sum((s.total for s in snap.samples if s.tid == tid), ZERO)
            for reason, total in thread.by_reason.items():
                assert total == sum((s.total for s in snap.samples if s.tid == tid and s.reason == reason), ZERO)
        assert set(view.threads) == {42, 43}
        if before is not None:
            old = {(s.tid, s.reason, s.stack): s for s in before.samples}
            for s in snap.samples:
                was = old.get((s.tid, s.reason, s.stack))
                if was is not None and was.total == s.total and not was.increase and not s.increase:
                    assert s is was
        before = snap
    assert view.total == Counter(10, 1_350)
    assert all(not s.increase for s in snap.samples)
