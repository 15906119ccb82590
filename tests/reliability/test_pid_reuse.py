"""PID reuse: a watched process exits and an unrelated one is started with the same pid (through
/proc/sys/kernel/ns_last_pid): the new one is never counted as the old one."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from offcpu_exporter.snapshot import ZERO, Snapshot
from testkit.exporter import ExporterProcess
from testkit.inprocess import running_pipeline, total, with_function
from testkit.metrics_page import total as metric_total
from testkit.workloads import Workload

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(120)]

NS_LAST_PID = "/proc/sys/kernel/ns_last_pid"


def start_with_pid(pid: int, start: Callable[[], Workload], attempts: int = 300) -> Workload:
    """Start a workload that gets `pid`: the next pid the kernel hands out is ns_last_pid + 1
    (other processes on the machine may take it first: try again)."""
    for _ in range(attempts):
        with open(NS_LAST_PID, "w") as f:
            f.write(str(pid - 1))
        w = start()
        if w.pid == pid:
            return w
        w.kill()
    pytest.fail(f"pid {pid} could not be had in {attempts} attempts")


def _keys(snap: Snapshot, pid: int) -> list:  # type: ignore[type-arg]
    return sorted((k for k in snap.processes if k.pid == pid), key=lambda k: k.start_ticks)


def test_pinned_pid_reused_by_another_process_is_not_watched() -> None:
    first = Workload("sleep", iterations=20, interval_ms=20)
    with running_pipeline(pids=(first.pid,), flush_interval=0.3) as p:
        first.go()
        old = first.wait()
        time.sleep(0.6)  # a targets refresh notices the exit
        before = p.flush_now()
        second = start_with_pid(first.pid, lambda: Workload("sleep", iterations=20, interval_ms=20))
        try:
            time.sleep(0.6)  # targets refreshes that could (wrongly) take it for the old one
            second.go()
            second.wait()
            time.sleep(0.6)
            after = p.flush_now()
            kernel_targets = p.probe.kernel_targets()
        finally:
            second.kill()
    assert first.pid not in kernel_targets
    assert [k.start_ticks for k in _keys(after, first.pid)] == [k.start_ticks for k in _keys(before, first.pid)]
    (key,) = _keys(after, first.pid)
    assert after.processes[key].info.exited
    assert after.processes[key].total == before.processes[key].total  # nothing of the new one added
    assert total(with_function(after, "offcpu_sleep_ms", first.pid)).ns == pytest.approx(old.blocked_ns, rel=0.05)


def test_comm_match_reused_pid_is_a_new_process_and_the_old_keeps_its_total() -> None:
    with running_pipeline(comm="^offcpu_workload$", flush_interval=0.3) as p:
        first = Workload("sleep", iterations=20, interval_ms=20)
        deadline = time.monotonic() + 10
        while first.pid not in p.processes.watched_pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        first.go()
        old = first.wait()
        time.sleep(0.6)
        before = p.flush_now()
        second = start_with_pid(first.pid, lambda: Workload("sleep", iterations=30, interval_ms=20))
        try:
            while second.pid not in p.processes.watched_pids() and time.monotonic() < deadline + 10:
                time.sleep(0.05)
            second.go()
            new = second.wait()
            time.sleep(0.6)
            after = p.flush_now()
        finally:
            second.kill()
    (old_key,) = _keys(before, first.pid)
    keys = _keys(after, first.pid)
    assert len(keys) == 2 and keys[0] == old_key, keys  # a new series, with its own start time
    new_key = keys[1]
    assert new_key.start_ticks > old_key.start_ticks
    assert after.processes[old_key].total == before.processes[old_key].total
    assert after.processes[old_key].info.exited

    def sleep_ns(key) -> int:  # type: ignore[no-untyped-def]
        return sum((s.total for s in after.samples if s.process == key
                    and any(f.name == "offcpu_sleep_ms" for f in s.stack.user)), ZERO).ns

    assert sleep_ns(old_key) == pytest.approx(old.blocked_ns, rel=0.05)
    assert sleep_ns(new_key) == pytest.approx(new.blocked_ns, rel=0.05)


def test_exposition_shows_the_new_process_not_the_sum() -> None:
    """Prometheus labels carry no start time: during the old one's grace period the exposition
    shows the live process, which Prometheus reads as a counter reset (rate() and resets() handle
    it), never the two summed."""
    first = Workload("sleep", iterations=20, interval_ms=20)
    with ExporterProcess(["--comm", "^offcpu_workload$", "--flush-interval", "0.3",
                          "--targets-interval", "0.2"]) as exp:
        time.sleep(0.6)
        first.go()
        old = first.wait()
        time.sleep(1.0)
        labels = {"pid": str(first.pid), "user_function": "offcpu_sleep_ms"}
        seen_old = metric_total(exp.get("/metrics").decode(), "offcpu_stack_seconds_total", **labels)
        exp.wait_for_log(f"offcpu_workload[{first.pid}]")
        second = start_with_pid(first.pid, lambda: Workload("sleep", iterations=10, interval_ms=20))
        try:
            # Its sleeps count only once a targets scan has put it in the kernel filter.
            exp.wait_for_log(f"offcpu_workload[{first.pid}]", count=2)
            second.go()
            new = second.wait()
            time.sleep(1.0)
            exposition = exp.get("/metrics").decode()
            seen_new = metric_total(exposition, "offcpu_stack_seconds_total", **labels)
        finally:
            second.kill()
    assert seen_old == pytest.approx(old.blocked_ns / 1e9, rel=0.05)
    assert seen_new == pytest.approx(new.blocked_ns / 1e9, rel=0.05), "\n".join(
        line for line in exposition.splitlines() if f'pid="{first.pid}"' in line)
