"""A real Prometheus server (Debian's package) scrapes a real `offcpu-exporter serve` watching a
workload with known blocking; PromQL over the HTTP API checks the figures.

Ground truth: each workload thread times its own clock_nanosleep calls (CLOCK_MONOTONIC around
each call), so its off-CPU rate is blocked_ns / wall_ns. Prometheus' rate() over a 15 s window in
the middle of the run must match that within 10%, for the process and for the known stack, and the
per-stack series must sum to the process total.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.exporter import ExporterProcess
from testkit.metrics_page import label_sets
from testkit.metrics_page import total as metric_total
from testkit.prometheus_server import SCRAPE_INTERVAL_S, PrometheusServer, scrape_config
from testkit.workloads import Workload

pytestmark = pytest.mark.kernel

WINDOW_S = 15


@pytest.fixture
def workload() -> Iterator[Workload]:
    # 2 threads x 1,400 x 20 ms: about 28 s of work, off CPU nearly all the time.
    with Workload("sleep", threads=2, iterations=1400, interval_ms=20) as w:
        yield w


def test_a_scrape_before_the_first_flush_shows_the_probe_attached(workload: Workload) -> None:
    # An alert on offcpu_exporter_probe_attached == 0 must not fire for the first flush interval.
    with ExporterProcess(["--pid", str(workload.pid), "--flush-interval", "600"]) as exporter:
        text = exporter.get("/metrics").decode()
    assert label_sets(text, "offcpu_exporter_probe_attached") in ([{"mode": "tracepoint"}], [{"mode": "kprobe"}])
    assert metric_total(text, "offcpu_exporter_probe_attached") == 1
    assert metric_total(text, "offcpu_exporter_targets") == 1
    assert metric_total(text, "offcpu_exporter_flushes_total") == 0
    assert metric_total(text, "offcpu_exporter_map_capacity", map="counts") > 0


def test_prometheus_scrapes_known_rates_and_exact_stack_sums(tmp_path: Path, workload: Workload) -> None:
    # Flushing every 0.25 s keeps the step of the counters small against the 15 s rate() window.
    with ExporterProcess(["--pid", str(workload.pid), "--flush-interval", "0.25"]) as exporter:
        prom = PrometheusServer(tmp_path, scrape_config("offcpu", f"127.0.0.1:{exporter.port}"))
        try:
            prom.wait_target_up()
            workload.go()
            started = time.time()
            # Evaluate in the middle of the run: past the start (the main thread's wait for "go" is
            # charged when it wakes) and before the end (its pthread_join is charged when it returns).
            at = started + 8 + WINDOW_S
            time.sleep(max(0.0, at + 2 * SCRAPE_INTERVAL_S - time.time()))
            pid = str(workload.pid)
            process_rate = prom.value(f'sum(rate(offcpu_seconds_total{{pid="{pid}"}}[{WINDOW_S}s]))', at)
            stack_rate = prom.value(
                f'sum(rate(offcpu_stack_seconds_total{{pid="{pid}",user_function="offcpu_sleep_ms"}}[{WINDOW_S}s]))', at
            )
            sleeping_rate = prom.value(
                f'sum(rate(offcpu_seconds_total{{pid="{pid}",reason="sleeping"}}[{WINDOW_S}s]))', at
            )
            stack_sum = prom.query("sum by (pid) (offcpu_stack_seconds_total)", at)
            process_sum = prom.query("sum by (pid) (offcpu_seconds_total)", at)
            switches_diff = prom.value(
                f'sum(offcpu_stack_switches_total{{pid="{pid}"}}) - sum(offcpu_switches_total{{pid="{pid}"}})', at
            )
            # The histogram is per container: the watched process is the only one on the host's.
            median = prom.value(
                f'histogram_quantile(0.5, sum by (le) (rate(offcpu_block_duration_seconds_bucket{{pod=""}}'
                f"[{WINDOW_S}s])))",
                at,
            )
            up = prom.value('up{job="offcpu"}', at)
            scrape = exporter.get("/metrics")
            result = workload.wait(timeout=120)
        finally:
            prom.stop()

    known = sum(t.blocked_ns / t.wall_ns for t in result.threads)
    print(
        f"known {known:.4f} s/s; rate(): process {process_rate:.4f}, stack {stack_rate:.4f}, "
        f"sleeping {sleeping_rate:.4f}; median block {median * 1000:.1f} ms"
    )
    assert known == pytest.approx(2.0, rel=0.05)  # the workload did what it says
    assert up == 1.0
    # The process: its two sleepers, and its main thread waiting in pthread_join all along the window
    # (a block in progress, counted while it lasts).
    assert process_rate == pytest.approx(known + 1, rel=0.05)
    assert stack_rate == pytest.approx(known, rel=0.05)
    assert sleeping_rate == pytest.approx(known + 1, rel=0.05)
    # Per-stack series sum to the process total, for every process Prometheus has.
    stacks = {r["metric"]["pid"]: float(r["value"][1]) for r in stack_sum}
    processes = {r["metric"]["pid"]: float(r["value"][1]) for r in process_sum}
    assert pid in processes and stacks.keys() == processes.keys()
    for p, total in processes.items():
        assert stacks[p] == pytest.approx(total, rel=1e-9, abs=1e-9)
    assert switches_diff == 0.0
    # 20 ms sleeps: the median block is in the (16.384 ms, 32.768 ms] bucket.
    assert 0.016384 <= median <= 0.032768
    promtool_check(scrape)


def promtool_check(body: bytes) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found: scripts/setup --test installs Debian's prometheus package")
    r = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=60)
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), (r.stdout + r.stderr).decode()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--web.config.file", "/nonexistent/web.yml"], "cannot read web config file /nonexistent/web.yml"),
        (["--web.listen-address", "127.0.0.1"], "expected host:port"),
        (["--prometheus.top-stacks", "-1"], "must not be negative"),
        (["--prometheus.top-threads", "-1"], "must not be negative"),
        (["--prometheus.call-path-frames", "0"], "--prometheus.call-path-frames: must be positive"),
    ],
)
def test_bad_web_and_prometheus_options_exit_2_with_one_line(args: list[str], message: str) -> None:
    r = subprocess.run([sys.executable, "-m", "offcpu_exporter", "serve", "--pid", "1", "--web.listen-address",
                        "127.0.0.1:0", *args], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.splitlines() if message in line]
    assert len(lines) == 1, r.stderr
