"""Process churn: 200 short-lived processes per second matching --comm for 30 s while a long-lived
workload is watched by a real `offcpu-exporter serve`. Runs about 45 s."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from testkit.exporter import ExporterProcess
from testkit.metrics_page import label_sets, rss_kib, samples, total
from testkit.workloads import Workload, build

pytestmark = [pytest.mark.kernel, pytest.mark.slow, pytest.mark.timeout(240)]

SPAWNER = Path(__file__).with_name("churn_spawner.c")
RATE, SECONDS, GRACE = 200, 30, 5


def _map_entries(text: str, name: str) -> float:
    return total(text, "offcpu_exporter_map_entries", map=name)


def test_churn_keeps_memory_maps_bounded_and_the_long_lived_figures_right() -> None:
    spawner = build(SPAWNER, name="churn_spawner")
    # Names of its own: other test runs on the machine start offcpu_workload processes too.
    long_lived = build(name="churn_longlived")
    # 1,400 x 20 ms: ~29 s asleep, through the whole churn.
    with Workload("sleep", threads=1, iterations=1400, interval_ms=20, binary=long_lived) as w, ExporterProcess(
            ["--comm", "^(churn_longlived|churn_child)$", "--flush-interval", "1", "--targets-interval", "0.2",
             "--exited-grace", str(GRACE)]) as exp:
        assert exp.proc is not None
        deadline = time.monotonic() + 10
        while str(w.pid) not in exp.get("/metrics").decode() and time.monotonic() < deadline:
            time.sleep(0.2)
        churn = subprocess.Popen([str(spawner), str(RATE), str(SECONDS)], stdout=subprocess.PIPE, text=True)
        w.go()
        rss, counts, targets, churn_pids = [], [], [], set()
        while churn.poll() is None:
            text = exp.get("/metrics").decode()
            rss.append(rss_kib(exp.proc.pid))
            counts.append(_map_entries(text, "counts"))
            targets.append(_map_entries(text, "targets"))
            churn_pids |= {s["pid"] for s in label_sets(text, "offcpu_seconds_total") if s.get("comm") == "churn_child"}
            time.sleep(1.0)
        started = int(churn.communicate()[0])
        result = w.wait()
        time.sleep(2.5)  # the flushes after the workload's exit
        after = exp.get("/metrics").decode()
        time.sleep(GRACE + 3)  # exited processes' series age out
        aged = exp.get("/metrics").decode()
        assert exp.proc.poll() is None, exp.log()
        log = exp.log()
    assert "Traceback" not in log, log
    print(f"churn: {started} processes in {SECONDS} s, {len(churn_pids)} got series; exporter RSS "
          f"{rss[0] / 1024:.0f}..{max(rss) / 1024:.0f} MiB (last {rss[-1] / 1024:.0f}); counts map max "
          f"{max(counts):.0f}, targets map max {max(targets):.0f}; RSS MiB every 5 s: "
          f"{[round(r / 1024) for r in rss[::5]]}")
    assert started >= RATE * SECONDS * 0.8
    # The churn was watched, not missed: a child lives 1-40 ms, so only those alive at one of the
    # 0.2 s /proc scans are matched (how many depends on the machine's load: tens to hundreds).
    assert len(churn_pids) >= 20
    # Memory: what is kept per exited process is bounded by the grace period, not the run length.
    half = len(rss) // 2
    assert max(rss[half:]) <= max(rss[:half]) + 30 * 1024, rss
    # Kernel maps: exited group leaders leave the filter at once; counters are drained.
    assert max(targets) < 200, targets
    assert max(counts) < 5000, counts
    measured = total(after, "offcpu_stack_seconds_total", pid=str(w.pid), user_function="offcpu_sleep_ms")
    print(f"long-lived workload: {measured:.3f} s measured, {result.blocked_ns / 1e9:.3f} s known")
    assert measured == pytest.approx(result.blocked_ns / 1e9, rel=0.05)
    leftover = [s for s in label_sets(aged, "offcpu_seconds_total") if s.get("comm") == "churn_child"]
    assert not leftover, leftover[:5]
    assert not samples(aged, "offcpu_seconds_total", lambda s: s.get("pid") == str(w.pid))
    assert total(aged, "offcpu_exporter_map_entries", map="targets") == 0
