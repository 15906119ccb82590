"""Shutdown: SIGTERM delivers what the kernel counted before the signal to every enabled output
(with a 60 s flush interval, all of it is still pending then); SIGKILL and a restart give fresh
counters that a real Prometheus reads as one reset, without a fake jump. About 30 s."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from offcpu_exporter.formats.delimited import read_messages
from testkit.exporter import ExporterProcess, free_port
from testkit.metrics_page import total
from testkit.otlp_metrics import points
from testkit.otlp_profiles import decode
from testkit.otlp_receivers import GrpcReceiver
from testkit.prometheus_server import PrometheusServer, scrape_config
from testkit.skywalking_oap import sleep_totals
from testkit.workloads import Workload

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(180)]


def test_sigterm_flushes_pending_data_to_every_output(tmp_path: Path) -> None:
    path = tmp_path / "offcpu.swpb"
    receiver = GrpcReceiver()
    with receiver, Workload("sleep", iterations=40, interval_ms=20) as w:
        exp = ExporterProcess(["--pid", str(w.pid), "--flush-interval", "60", "--skywalking.file", str(path),
                               "--otlp.endpoint", receiver.endpoint, "--otlp.protocol", "grpc",
                               "--otlp.interval", "60"])
        with exp:
            time.sleep(0.5)  # the target reaches the kernel filter
            w.go()
            result = w.wait()
            time.sleep(0.2)
            # Nothing delivered yet: everything is pending (the kernel's counters only).
            assert not path.exists() or path.stat().st_size == 0
            assert not receiver.received.profiles
            assert exp.stop(signal.SIGTERM) == 0, exp.log()
        log = exp.log()
        got = receiver.received
    assert "Traceback" not in log, log
    with path.open("rb") as f:
        messages = list(read_messages(f))
    count, ns = sleep_totals(messages)
    with got.lock:
        profiles = [s for r in got.profiles for s in decode(r)
                    if s.resource["process.pid"] == w.pid and "offcpu_sleep_ms" in s.functions]
        metric_points = [p for r in got.metrics for p in points(r)]
        # Cumulative sums: the last export holds the totals.
        metric_s = max((sum(p.value for p in points(r) if p.name == "offcpu.time"
                            and p.attributes.get("process.pid") == w.pid) for r in got.metrics), default=0.0)
    otlp_ns = sum(s.value for s in profiles if s.sample_type == "off_cpu/nanoseconds")
    otlp_count = sum(s.value for s in profiles if s.sample_type == "off_cpu_switches/count")
    print(f"SIGTERM: file got {ns / 1e9:.4f} s in {count} switches, OTLP profiles {otlp_ns / 1e9:.4f} s in "
          f"{otlp_count} switches, OTLP metrics {len(metric_points)} points; known {result.blocked_ns / 1e9:.4f} s "
          f"in {result.calls} calls")
    assert ns == pytest.approx(result.blocked_ns, rel=0.05)
    assert count == pytest.approx(result.calls, rel=0.05)
    assert otlp_ns == pytest.approx(result.blocked_ns, rel=0.05)
    assert otlp_count == pytest.approx(result.calls, rel=0.05)
    assert metric_points, "no OTLP metrics export on the way out"
    # The process total holds the known sleeps and the main thread's waits (for "go", in pthread_join).
    assert metric_s >= result.blocked_ns / 1e9 * 0.98, metric_s


def test_sigkill_and_restart_is_one_counter_reset_without_a_jump(tmp_path: Path) -> None:
    port = free_port()
    args = ["--flush-interval", "0.25"]
    series = 'offcpu_stack_seconds_total{{pid="{pid}",user_function="offcpu_sleep_ms"}}'
    with Workload("sleep", threads=1, iterations=1000, interval_ms=20) as w:
        selector = series.format(pid=w.pid)
        args += ["--pid", str(w.pid)]
        first = ExporterProcess(args, port=port).start()
        prom = PrometheusServer(tmp_path, scrape_config("offcpu", f"127.0.0.1:{port}"))
        try:
            prom.wait_target_up()
            w.go()
            went_at = time.time()
            time.sleep(6)
            before = total(first.get("/metrics").decode(), "offcpu_stack_seconds_total", pid=str(w.pid),
                           user_function="offcpu_sleep_ms")
            killed_at = time.time()
            assert first.stop(signal.SIGKILL) == -signal.SIGKILL
            second = ExporterProcess(args, port=port)
            restarted_at = time.time()
            with second:
                ready_at = time.time()
                time.sleep(1.0)  # a few flushes
                read_at = time.time()
                after = total(second.get("/metrics").decode(), "offcpu_stack_seconds_total", pid=str(w.pid),
                              user_function="offcpu_sleep_ms")
                time.sleep(6)
                end = time.time()
                # The stack may have two series (a preemption on the way back from the sleep): sum them.
                resets = prom.value(f"max(resets({selector}[{end - killed_at + 3:.0f}s]))", end)
                peak = prom.value(f"max_over_time(sum(rate({selector}[6s]))[{end - killed_at + 3:.0f}s:1s])", end)
                run = end - went_at
                counted = prom.value(f"sum(increase({selector}[{run:.0f}s]))", end)
                rate = prom.value(f"sum(rate({selector}[4s]))", end)
        finally:
            prom.stop()
    print(f"restart: {before:.3f} s before SIGKILL, {after:.3f} s on the restarted exporter "
          f"{read_at - restarted_at:.1f} s after its start; resets {resets:.0f}; peak rate {peak:.3f}, "
          f"last rate {rate:.3f}; increase {counted:.2f} s over {run:.1f} s")
    assert before > 4  # the first exporter was counting
    # Fresh counters: counting again, and at most the time the new exporter has been up.
    assert 0 < after <= read_at - restarted_at, (after, read_at - restarted_at)
    assert resets == 1
    # One thread is off CPU at most one second per second: a restart that carried old totals over
    # (or counted a block twice) would show a rate far above 1 (the old total is > 4 s). Flush
    # steps of 0.25 s between 1 s scrapes move a 6 s rate by some percent.
    assert peak <= 1.1
    gap = ready_at - killed_at
    assert run - gap - 2 <= counted <= run * 1.05, (counted, run, gap)
    assert rate == pytest.approx(1.0, abs=0.1)  # sleeping nearly all the time, counted again
