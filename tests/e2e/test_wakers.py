"""--wakers on against workloads whose wakers are known (tests/workloads/wakers.c): a condition
variable signalled from producer_signal(), a mutex released in holder_hold(), a pipe written from
writer_write(), and a timer sleep. Most of the waiting thread's off-CPU time must be under the right
waker (the rest: its preemptions, which no wake-up ends, and the time of blocks in progress at a
periodic flush, counted before their waker is known: see FLUSH), the timer's under a timer marker and
no task of the workload; its stacks must still sum to its thread's exact total, and the folded
output be in bcc offwaketime's layout.

Not in the kernel matrix yet (no kernel_* marker): run on the host kernel only.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from offcpu_exporter.formats import folded
from offcpu_exporter.formats.profile import Profile
from offcpu_exporter.probe.loader import Probe, ProbeConfig
from offcpu_exporter.snapshot import Counter, Snapshot, StackSample, WakerKind
from testkit.inprocess import ATTACH, FLUSH_TIMEOUT, running_pipeline
from testkit.workloads import Workload, WorkloadResult, build

pytestmark = pytest.mark.kernel

_SOURCE = Path(__file__).resolve().parent.parent / "workloads" / "wakers.c"
_SHARE = 0.90  # of the waiting thread's off-CPU time, under its known waker
# The exporter's default flush interval. A block in progress at a flush is counted up to it before
# anything woke it: that part has no waker (up to one 20 ms block per flush, 2.5% of the thread's
# time per flush here at the testkit's usual 0.5 s, 0.4% at this).
FLUSH = 5.0


@pytest.fixture(scope="module")
def waker_probe() -> Iterator[Probe]:
    shared = Probe(ProbeConfig(attach=ATTACH, per_thread=True, wakers=True))
    shared.start()
    yield shared
    shared.close()


def _observe(mode: str, probe: Probe) -> tuple[WorkloadResult, Snapshot]:
    with Workload(mode, iterations=40, interval_ms=20, binary=build(_SOURCE)) as w, \
            running_pipeline(pids=(w.pid,), probe=probe, flush_interval=FLUSH) as pipeline:
        # glibc has no frame pointers: its callers are in the stacks once the DWARF tables are in.
        assert pipeline.describer is None or pipeline.describer.wait_idle(120), "unwind tables not built"
        w.go()
        result = w.wait()
        time.sleep(0.1)  # its last switch-ins are in
        return result, pipeline.flush_now(FLUSH_TIMEOUT)


def _rows(snap: Snapshot, pid: int, tid: int) -> list[StackSample]:
    return [s for s in snap.samples if s.process.pid == pid and s.tid == tid]


def _sum(rows: list[StackSample]) -> Counter:
    out = Counter()
    for s in rows:
        out = out + s.total
    return out


def _thread_total(snap: Snapshot, pid: int, tid: int) -> Counter:
    (view,) = [v for key, v in snap.processes.items() if key.pid == pid]
    return view.threads[tid].total


def _check_sums(snap: Snapshot, pid: int, tid: int) -> list[StackSample]:
    rows = _rows(snap, pid, tid)
    assert rows, f"nothing counted for thread {tid}"
    assert _sum(rows) == _thread_total(snap, pid, tid)  # exact: stacks and wakers split the total
    return rows


@pytest.mark.parametrize(("mode", "function", "comm"), [
    ("condvar", "producer_signal", "producer"),
    ("mutex", "holder_hold", "holder"),
    ("pipe", "writer_write", "writer"),
])
def test_the_waiting_thread_is_woken_by_the_known_function(waker_probe: Probe, mode: str, function: str,
                                                           comm: str) -> None:
    result, snap = _observe(mode, waker_probe)
    waiter, helper = result.threads[0].tid, result.threads[1].tid
    rows = _check_sums(snap, result.pid, waiter)
    woken = [s for s in rows if s.waker is not None and s.waker.kind is WakerKind.TASK
             and any(f.name == function for f in s.waker.user)]
    share = _sum(woken).ns / _sum(rows).ns
    shown = sorted(((s.total.ns // 1000, s.reason.name, s.waker and [f.name for f in s.waker.user])
                    for s in rows), reverse=True)[:8]
    assert share >= _SHARE, f"{share:.1%} under {function}: {shown}"
    assert {(s.waker.pid, s.waker.tid, s.waker.comm) for s in woken if s.waker} == {(result.pid, helper, comm)}
    # offwaketime's layout: the blocked stack, "--", the waker's frames leaf first, its comm.
    lines = folded.lines(Profile.since_start(snap))
    assert any(f"{function};" in line and line.endswith(f";{comm}") and ";--;" in line for line, _ in lines)


def test_a_timer_sleep_is_woken_by_a_timer_not_by_a_task(waker_probe: Probe) -> None:
    result, snap = _observe("timer", waker_probe)
    waiter = result.threads[0].tid
    rows = _check_sums(snap, result.pid, waiter)
    timer = [s for s in rows if s.waker is not None and s.waker.kind is WakerKind.TIMER]
    share = _sum(timer).ns / _sum(rows).ns
    assert share >= _SHARE, f"{share:.1%} under a timer"
    assert all(s.waker.pid == 0 and not s.waker.user for s in timer if s.waker)
    assert "hrtimer_wakeup" in {f.name.split(" ", 1)[0] for s in timer if s.waker for f in s.waker.kernel}
    # No task is charged with it, least of all one of the workload's (the interrupted one).
    assert not [s for s in rows if s.waker is not None and s.waker.kind is WakerKind.TASK
                and s.waker.pid == result.pid]
    lines = folded.lines(Profile.since_start(snap))
    assert any(";--;" in line and line.endswith(";[timer]") and "clock_nanosleep" in line for line, _ in lines)


def test_wakers_off_changes_nothing_in_the_folded_layout(probe: Probe) -> None:
    """The default probe (wakers off): no waker on any row, no `--` frame."""
    with Workload("pipe", iterations=10, interval_ms=5, binary=build(_SOURCE)) as w, \
            running_pipeline(pids=(w.pid,), probe=probe, flush_interval=FLUSH) as pipeline:
        w.go()
        w.wait()
        time.sleep(0.1)
        snap = pipeline.flush_now(FLUSH_TIMEOUT)
    mine = [s for s in snap.samples if s.process.pid == w.pid]
    assert mine and all(s.waker is None for s in mine)
    assert "raw_tp:sched_waking" not in probe.hooked
    assert not any(";--;" in line for line, _ in folded.lines(Profile.since_start(snap)))
