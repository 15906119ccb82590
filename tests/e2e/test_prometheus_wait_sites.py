"""Issue 16, end to end: a real Prometheus server (Debian's package) scrapes a real `offcpu-exporter
serve --per-thread` watching tests/workloads/wait_sites.c, three threads that block through one
helper named like libc's `syscall` (two of them in nanosleep), and PromQL finds each code path by
its function name.

Ground truth: each thread times its own blocking calls (CLOCK_MONOTONIC around each call minus its
CPU time in the call). A thread's rate is its off-CPU time over its wall time; Prometheus' figure
for it is the value each series reached once the run was over (an instant query after the end, so
no rate() extrapolation at window edges) over the same wall time. They must agree within 2%, by
`app_function` for the stacks and by `thread` for the per-thread process counters; mid-run, rate()
over a window must agree within 5%.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testkit.exporter import ExporterProcess
from testkit.prometheus_server import SCRAPE_INTERVAL_S, PrometheusServer, scrape_config
from testkit.workloads import Workload, build

pytestmark = pytest.mark.kernel

SOURCE = Path(__file__).resolve().parents[1] / "workloads" / "wait_sites.c"
FUNCTIONS = {"hold_in_nanosleep": "sleeper", "wait_for_pipe_message": "reader", "feed_pipe_periodically": "feeder"}
FLUSH_S = 0.25
ITERATIONS, INTERVAL_MS = 800, 15  # 12 s per thread
WINDOW_S = 6


@pytest.fixture
def workload() -> Iterator[Workload]:
    with Workload("paths", iterations=ITERATIONS, interval_ms=INTERVAL_MS, binary=build(SOURCE)) as w:
        yield w


def test_prometheus_finds_each_code_path_by_function_name(tmp_path: Path, workload: Workload) -> None:
    pid = str(workload.pid)
    with ExporterProcess(["--pid", pid, "--per-thread", "--flush-interval", str(FLUSH_S)]) as exporter:
        prom = PrometheusServer(tmp_path, scrape_config("offcpu", f"127.0.0.1:{exporter.port}"))
        try:
            prom.wait_target_up()
            workload.go()
            started = time.time()
            mid = started + 2 + WINDOW_S
            time.sleep(max(0.0, mid + 2 * SCRAPE_INTERVAL_S - time.time()))
            mid_rates = {
                fn: prom.value(f'sum(rate(offcpu_stack_seconds_total{{pid="{pid}",app_function="{fn}"}}'
                               f"[{WINDOW_S}s]))", mid)
                for fn in FUNCTIONS
            }
            result = workload.wait(timeout=120)
            # Past the last flush of the run and the scrape after it.
            at = time.time() + 2 * FLUSH_S + 2 * SCRAPE_INTERVAL_S
            time.sleep(at + 0.5 - time.time())
            stacks = prom.query(f'offcpu_stack_seconds_total{{pid="{pid}",stack_id!="other"}}', at)
            by_function = {fn: prom.value(f'sum(offcpu_stack_seconds_total{{pid="{pid}",app_function="{fn}"}})', at)
                           for fn in FUNCTIONS}
            threads = prom.query(f'sum by (tid, thread) (offcpu_seconds_total{{pid="{pid}"}})', at)
        finally:
            prom.stop()

    by_name = {t.name: t for t in result.threads}
    assert set(by_name) == set(FUNCTIONS.values())
    # (The main thread's only counted wait, its pthread_join, ends as the process exits: its name could
    # not be read any more, and an empty label is no label.)
    per_thread = {r["metric"].get("thread", ""): (r["metric"]["tid"], float(r["value"][1])) for r in threads}
    assert per_thread["other"] == ("other", 0.0)  # three threads and main: all below --prometheus.top-threads
    for fn, name in FUNCTIONS.items():
        t = by_name[name]
        known = t.blocked_off_ns / t.wall_ns
        measured = by_function[fn] / (t.wall_ns / 1e9)
        tid, thread_total = per_thread[name]
        thread_rate = thread_total / (t.wall_ns / 1e9)
        off_cpu = (t.wall_ns - t.oncpu_ns) / t.wall_ns
        print(f"{fn:24} known {known:.4f} s/s; app_function series {measured:.4f} ({measured / known - 1:+.2%}); "
              f"mid-run rate() {mid_rates[fn]:.4f}; thread {name} {thread_rate:.4f} vs off CPU {off_cpu:.4f} "
              f"({thread_rate / off_cpu - 1:+.2%})")
        assert known > 0.9  # the thread did block nearly all the time
        assert measured == pytest.approx(known, rel=0.02)
        assert mid_rates[fn] == pytest.approx(known, rel=0.05)
        assert tid == str(t.tid)
        assert thread_rate == pytest.approx(off_cpu, rel=0.02)

    # The three code paths' stacks: one helper as the leaf, two of them with the same kernel function,
    # so the old labels alone cannot tell those two apart; the default labels can.
    main: dict[str, dict[str, Any]] = {}
    for r in stacks:
        fn = r["metric"]["app_function"]
        if fn in FUNCTIONS and float(r["value"][1]) > float(main.get(fn, {"value": (0, "0")})["value"][1]):
            main[fn] = r
    labels = {fn: {k: v for k, v in r["metric"].items() if k != "stack_id"} for fn, r in main.items()}
    assert set(labels) == set(FUNCTIONS)
    assert {lab["user_function"] for lab in labels.values()} == {"syscall"}
    assert labels["hold_in_nanosleep"]["kernel_function"] == labels["feed_pipe_periodically"]["kernel_function"]
    assert len({tuple(sorted(lab.items())) for lab in labels.values()}) == 3
    for fn, lab in labels.items():
        assert lab["call_path"] == f"thread_main;{fn}"
        assert not {"namespace", "pod", "container"} & lab.keys()  # a host process: empty, so no label
