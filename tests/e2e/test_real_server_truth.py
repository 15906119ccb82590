"""Real software, as deployed: `offcpu-exporter serve` on a PostgreSQL server under pgbench (one
process per connection, plus the postmaster and its background workers), its /metrics against the
kernel's own per-thread accounting, ten runs in a row.

Each run starts a new exporter with an empty unwind-table cache (a node's first run, or the first
after its binaries changed): the tables are built while it counts, which once held the flush up and
published 14 s old figures as current ones (1.9x wall time over a 21 s window). The window starts
at the first published flush, so that it holds that start-up.
"""

from __future__ import annotations

import tempfile

import pytest

from testkit.exporter import ExporterProcess
from testkit.kernel_truth import KernelTruth, ProcessWindow
from testkit.postgres import postgres_under_load

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(1200)]

RUNS = 10
WINDOW_NS = 8_000_000_000
CLIENTS = 6
TOLERANCE = 0.02  # off-CPU seconds and switches, per process


def _misses(windows: list[ProcessWindow]) -> list[str]:
    out = []
    for w in windows:
        if w.truth_seconds > 1.0 and abs(w.exporter_seconds / w.truth_seconds - 1) > TOLERANCE:
            out.append(f"pid {w.pid}: {w.exporter_seconds:.3f} s off CPU, kernel {w.truth_seconds:.3f} s")
        if abs(w.exporter_switches - w.truth_switches) > max(2, TOLERANCE * w.truth_switches):
            out.append(f"pid {w.pid}: {w.exporter_switches:.0f} switches, kernel {w.truth_switches:.0f}")
    return out


def test_postgres_under_pgbench_matches_the_kernel_ten_runs_in_a_row() -> None:
    report = []
    with postgres_under_load(clients=CLIENTS, seconds=RUNS * 60) as pg:
        pids = pg.processes()
        for run in range(RUNS):
            with (tempfile.TemporaryDirectory() as cache,
                  ExporterProcess(["--comm", "^postgres$", "--flush-interval", "1s", "--unwind-cache-dir", cache])
                  as exporter):
                truth = KernelTruth(lambda: pids, lambda: exporter.get("/metrics").decode())
                first = truth.next_flush()
                last = truth.next_flush(after_ns=first.time_ns + WINDOW_NS - 500_000_000)
                windows = truth.window(first, last)
            assert {w.pid for w in windows} == set(pids), "every server process lived through the window"
            total = sum(w.exporter_seconds for w in windows) / sum(w.truth_seconds for w in windows)
            switches = sum(w.exporter_switches for w in windows) / sum(w.truth_switches for w in windows)
            report.append(f"run {run + 1}: {len(windows)} processes, {(last.time_ns - first.time_ns) / 1e9:.2f} s, "
                          f"off-CPU {total:.4f} of the kernel's, switches {switches:.4f}, "
                          f"clamped {last.clamped_seconds:.3f} s")
            print(report[-1], flush=True)
            misses = _misses(windows)
            assert not misses and last.clamped_seconds == 0, "\n".join([*report, *misses])
