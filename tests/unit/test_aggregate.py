"""The delta logic against an in-memory stand-in for the kernel maps (the real maps are exercised
by tests/e2e/test_probe.py): first flush, zero increase, a key drained or gone, a restarted run."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from offcpu_exporter import aggregate
from offcpu_exporter.aggregate import AggregateConfig, Aggregator, increase
from offcpu_exporter.probe.loader import RawKey
from offcpu_exporter.snapshot import ZERO, Counter, Frame, FrameKind, Reason
from offcpu_exporter.symbols import UNKNOWN
from offcpu_exporter.targets import ProcessTable, TargetRules
from tests.support.kernel_maps import KernelMaps


class Names:
    failures = 0

    def kernel(self, addresses):  # type: ignore[no-untyped-def]
        return tuple(Frame(f"k{a:x}", FrameKind.KERNEL) for a in addresses)

    def user(self, pid, addresses):  # type: ignore[no-untyped-def]
        return tuple(Frame(f"u{a:x}") for a in addresses)

    def prepare(self, pid: int) -> None:
        pass

    def generation(self, pid: int) -> int:
        return 0

    def refresh(self, pid: int) -> int:
        self.refreshes = getattr(self, "refreshes", 0) + 1
        return self.generation(pid)

    def forget(self, pid: int) -> None:
        pass


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "stat").write_text("42 (my (app)) S 1 " + " ".join(["0"] * 17) + " 777 0 0\n")
    (tmp_path / "42" / "status").write_text("Name:\tapp\nTgid:\t42\n")
    return tmp_path


def _aggregator(proc: Path, kernel: KernelMaps, **config: float) -> Aggregator:
    table = ProcessTable(TargetRules(pids=(42,)), proc_root=str(proc))
    assert table.start() == []
    return Aggregator(kernel, Names(), table, AggregateConfig(**config))  # type: ignore[arg-type]


KEY: RawKey = (42, 0, 1, 2, Reason.SLEEPING.value)


def test_increase_rules() -> None:
    assert increase((5, 500), None) == (5, 500)  # first read
    assert increase((5, 500), (5, 500)) == (0, 0)  # no change
    assert increase((7, 900), (5, 500)) == (2, 400)
    assert increase((1, 100), (5, 500)) == (1, 100)  # re-created since: all of it is new


def test_first_flush_then_increases_then_zero(proc: Path) -> None:
    kernel = KernelMaps()
    kernel.stacks = {1: (0x10, 0x20), 2: (0xA, 0xB)}
    agg = _aggregator(proc, kernel)
    kernel.counts[KEY] = (3, 3_000)
    snap = agg.flush()
    (sample,) = snap.samples
    assert sample.total == sample.increase == Counter(3, 3_000)
    assert [f.name for f in sample.stack.user] == ["u10", "u20"]
    assert [f.name for f in sample.stack.kernel] == ["ka", "kb"]
    assert snap.processes[sample.process].info.comm == "my (app)"
    assert snap.processes[sample.process].total == Counter(3, 3_000)

    kernel.counts[KEY] = (5, 7_000)
    (sample,) = agg.flush().samples
    assert sample.increase == Counter(2, 4_000)
    assert sample.total == Counter(5, 7_000)

    (sample,) = agg.flush().samples  # nothing new: zero increase, total kept
    assert sample.increase == ZERO
    assert sample.total == Counter(5, 7_000)


def test_idle_key_is_drained_and_its_total_survives(proc: Path) -> None:
    kernel = KernelMaps()
    kernel.stacks = {1: (0x10,), 2: (0xA,)}
    agg = _aggregator(proc, kernel, age_after=2)
    kernel.counts[KEY] = (1, 100)
    agg.flush()
    agg.flush()  # idle 1
    snap = agg.flush()  # idle 2: drained
    assert KEY not in kernel.counts
    assert kernel.deleted_stacks == {1, 2}  # nothing references them any more
    (sample,) = snap.samples
    assert sample.total == Counter(1, 100)
    # The kernel re-creates the key from zero: its new value is all increase, no fake jump.
    kernel.stacks = {1: (0x10,), 2: (0xA,)}
    kernel.counts[KEY] = (2, 50)
    (sample,) = agg.flush().samples
    assert sample.increase == Counter(2, 50)
    assert sample.total == Counter(3, 150)


def test_pending_stack_ids_are_not_reclaimed(proc: Path) -> None:
    kernel = KernelMaps()
    kernel.stacks = {1: (0x10,), 2: (0xA,)}
    kernel.pending = {1}
    agg = _aggregator(proc, kernel, age_after=1)
    kernel.counts[KEY] = (1, 100)
    agg.flush()
    agg.flush()
    assert kernel.deleted_stacks == {2}


def test_full_map_is_drained_at_the_high_water_mark(proc: Path) -> None:
    kernel = KernelMaps(max_counts=10)
    kernel.stacks = {i: (i,) for i in range(20)}
    agg = _aggregator(proc, kernel, high_water=0.8, age_after=100)
    for i in range(8):
        kernel.counts[(42, 0, i, 10 + i, 1)] = (1, 10)
    snap = agg.flush()
    assert not kernel.counts  # everything was busy: drained at once, totals kept
    assert sum((s.total for s in snap.samples), ZERO) == Counter(8, 80)


def test_lost_stacks_become_placeholder_frames_and_are_counted(proc: Path) -> None:
    kernel = KernelMaps()
    kernel.stacks = {2: (0xA,)}
    agg = _aggregator(proc, kernel)
    kernel.counts[(42, 0, -errno.EEXIST, 2, 1)] = (4, 400)
    kernel.counts[(42, 0, -errno.EFAULT, -errno.ENOMEM, 1)] = (1, 10)
    snap = agg.flush()
    stacks = {s.stack for s in snap.samples}
    names = {(tuple(f.name for f in st.user), tuple(f.name for f in st.kernel)) for st in stacks}
    assert (("[lost stack: stack map collision]",), ("ka",)) in names
    assert ((), ("[lost stack: stack map full]",)) in names  # no user stack: empty half, not lost
    assert snap.health.lost_stacks == {"user:EEXIST": 4, "user:EFAULT": 1, "kernel:ENOMEM": 1}
    assert sum((s.total for s in snap.samples), ZERO) == snap.processes[snap.samples[0].process].total


def test_new_exporter_run_starts_from_zero(proc: Path) -> None:
    kernel = KernelMaps()
    kernel.stacks = {1: (0x10,), 2: (0xA,)}
    kernel.counts[KEY] = (3, 300)
    first = _aggregator(proc, kernel)
    first.flush()
    restarted = _aggregator(proc, KernelMaps())  # a new run loads a new program with empty maps
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
        return tuple(UNKNOWN if a == 0x20 and not self.mapped else Frame(f"u{a:x}") for a in addresses)


def _late_mapping_aggregator(proc: Path) -> tuple[KernelMaps, LateMapping, Aggregator]:
    kernel = KernelMaps()
    kernel.stacks = {1: (0x10, 0x20), 2: (0xA,)}
    names = LateMapping()
    table = ProcessTable(TargetRules(pids=(42,)), proc_root=str(proc))
    table.start()
    return kernel, names, Aggregator(kernel, names, table)  # type: ignore[arg-type]


def test_a_stack_with_an_unmapped_address_is_named_at_the_next_flush(proc: Path) -> None:
    # Flushes back to back: the retry follows the symbolizer's view of the process, not a clock.
    kernel, names, agg = _late_mapping_aggregator(proc)
    kernel.counts[KEY] = (1, 1_000)
    (sample,) = agg.flush().samples
    assert [f.name for f in sample.stack.user] == ["u10", "[unknown]"]
    names.mapped = True
    kernel.counts[KEY] = (3, 5_000)
    by_user = {tuple(f.name for f in s.stack.user): s for s in agg.flush().samples}
    # What was counted stays where it was; from now on counts go to the named stack.
    assert by_user[("u10", "[unknown]")].total == Counter(1, 1_000)
    assert by_user[("u10", "u20")].increase == Counter(2, 4_000)
    assert names.refreshes == 1


def test_a_stack_that_stays_unmapped_is_named_again_only_when_the_process_changed(proc: Path) -> None:
    kernel, names, agg = _late_mapping_aggregator(proc)
    for n in range(1, 6):
        kernel.counts[KEY] = (n, n * 1_000)
        (sample,) = agg.flush().samples
        assert sample.total == Counter(n, n * 1_000)
    assert names.calls == 1  # nothing changed: nothing to gain from naming it again
    names.changes += 1  # say, a library was mapped, but not where 0x20 is
    kernel.counts[KEY] = (6, 6_000)
    agg.flush()
    assert names.calls == 2
    assert [f.name for f in agg.flush().samples[0].stack.user] == ["u10", "[unknown]"]


def test_unmapped_stacks_are_given_up_on_after_the_window(proc: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aggregate, "_UNRESOLVED_WINDOW_SECONDS", 0.0)
    kernel, names, agg = _late_mapping_aggregator(proc)
    kernel.counts[KEY] = (1, 1_000)
    agg.flush()
    names.changes += 1
    kernel.counts[KEY] = (2, 2_000)
    agg.flush()  # one last try, then no more
    names.changes += 1
    kernel.counts[KEY] = (3, 3_000)
    agg.flush()
    assert names.calls == 2
    assert names.refreshes == 1


def test_before_the_first_flush_the_snapshot_says_the_probe_is_attached(proc: Path) -> None:
    # A scrape right after start must not read as "probe not attached" (an alert) for a flush interval.
    agg = _aggregator(proc, KernelMaps())
    first = agg.before_first_flush()
    health = first.health
    assert first is agg.latest and first.sequence == 0 and not first.samples
    assert (health.probe_attached, health.attach_mode, health.targets) == (True, "tracepoint", 1)
    assert health.map_capacity and health.flushes == 0


def test_per_thread_totals_are_in_the_process_view(proc: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aggregate, "_thread_name", lambda tgid, tid: f"worker-{tid}")
    kernel = KernelMaps()
    kernel.stacks = {1: (0x10,), 2: (0xA,), 3: (0x20,)}
    agg = _aggregator(proc, kernel)
    kernel.counts[(42, 100, 1, 2, Reason.SLEEPING.value)] = (3, 3_000)
    kernel.counts[(42, 100, 3, 2, Reason.RUNNABLE.value)] = (1, 50)
    kernel.counts[(42, 101, 1, 2, Reason.SLEEPING.value)] = (2, 700)
    agg.flush()
    kernel.counts[(42, 101, 1, 2, Reason.SLEEPING.value)] = (5, 1_700)
    view = next(iter(agg.flush().processes.values()))
    assert set(view.threads) == {100, 101}
    first, second = view.threads[100], view.threads[101]
    assert (first.tid, first.name, second.name) == (100, "worker-100", "worker-101")
    assert first.total == Counter(4, 3_050)
    assert dict(first.by_reason) == {Reason.SLEEPING: Counter(3, 3_000), Reason.RUNNABLE: Counter(1, 50)}
    assert second.total == Counter(5, 1_700)  # cumulative, like the process's
    assert first.total + second.total == view.total


def test_without_thread_ids_the_process_view_has_no_threads(proc: Path) -> None:
    kernel = KernelMaps()
    kernel.stacks = {1: (0x10,), 2: (0xA,)}
    agg = _aggregator(proc, kernel)
    kernel.counts[KEY] = (3, 3_000)
    view = next(iter(agg.flush().processes.values()))
    assert view.total == Counter(3, 3_000) and not view.threads
