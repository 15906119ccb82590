"""`offcpu-exporter record` as a user runs it, against a workload with known blocking."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from testkit.exporter import ROOT, parse_folded
from testkit.inprocess import FLUSH_TIMEOUT, running_pipeline, total, with_function
from testkit.workloads import Workload

pytestmark = pytest.mark.kernel


def _record(args: list[str], timeout: float = 120) -> subprocess.Popen[bytes]:
    """Start `record` and return once its window has begun (its log says so on stderr)."""
    proc = subprocess.Popen([sys.executable, "-m", "offcpu_exporter", "record", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout
    for line in proc.stderr:
        if b"recording for" in line or time.monotonic() > deadline:
            break
    time.sleep(0.3)  # the first targets sync follows the attach
    return proc


def test_record_folded_sums_to_the_known_blocking(tmp_path: Path) -> None:
    out = tmp_path / "out.folded"
    with Workload("sleep", threads=2, iterations=40, interval_ms=20) as w:
        rec = _record(["--pid", str(w.pid), "--duration", "3", "--format", "folded", "-o", str(out)])
        w.go()
        result = w.wait()
        _, err = rec.communicate(timeout=120)
    assert rec.returncode == 0, err.decode()
    folded = parse_folded(out.read_text())
    mine = {stack: us for stack, us in folded.items() if "offcpu_sleep_ms" in stack}
    assert all(stack.startswith("offcpu_workload;") for stack in mine)
    assert any(stack.endswith("do_nanosleep;schedule;__schedule") for stack in mine), out.read_text()[:3000]
    assert sum(mine.values()) * 1000 == pytest.approx(result.blocked_ns, rel=0.05)


def test_record_text_shows_kernel_then_user_frames() -> None:
    with Workload("pipe", threads=1, iterations=30, interval_ms=10) as w:
        rec = _record(["--pid", str(w.pid), "--duration", "2", "--format", "text"])
        w.go()
        w.wait()
        out, err = rec.communicate(timeout=120)
    assert rec.returncode == 0, err.decode()
    text = out.decode()
    block = next(b for b in text.split("\n\n") if "offcpu_pipe_read" in b)
    lines = [line.strip() for line in block.splitlines()]
    assert lines.index("--") < lines.index("offcpu_pipe_read")
    assert f"offcpu_workload ({w.pid})" in block


def test_min_block_filters_short_blocks_in_the_kernel() -> None:
    from offcpu_exporter.probe import layout
    from offcpu_exporter.probe.loader import ProbeConfig
    from testkit.inprocess import ATTACH

    # 2^15 us, a slot boundary of the workload's own per-call histogram: calls at least that long
    # are in its slots 16 and up. 10 ms sleeps only get there when woken very late.
    config = ProbeConfig(attach=ATTACH, per_thread=True, min_block_ns=(1 << 15) * 1000)
    with (Workload("sleep", threads=1, iterations=20, interval_ms=10) as w,
          running_pipeline(pids=(w.pid,), probe_config=config) as p):
        w.go()
        result = w.wait()
        snap = p.flush_now(FLUSH_TIMEOUT)
        stats = p.probe.stats()
    assert snap.health.filtered_blocks == stats[layout.STAT_FILTERED] > 0
    kept = total(with_function(snap, "offcpu_sleep_ms", w.pid)).count
    long_calls = sum(result.threads[0].hist[16:])
    assert abs(kept - long_calls) <= 1

    assert stats[layout.STAT_FILTERED] >= 20 - long_calls - 1
    assert snap.health.filtered_ns > 0


def test_record_covers_exactly_its_duration(tmp_path: Path) -> None:
    """Two threads off CPU all along (a sleeper and the main thread joining it), since before the
    recording began: each shows the duration, never more (the window is [attach, attach + D])."""
    out = tmp_path / "out.folded"
    with Workload("sleep", threads=1, iterations=1, interval_ms=120_000) as w:
        w.go()
        time.sleep(0.2)
        rec = _record(["--pid", str(w.pid), "--duration", "3", "--format", "folded", "-o", str(out)])
        _, err = rec.communicate(timeout=120)
    assert rec.returncode == 0, err.decode()
    seconds = sum(parse_folded(out.read_text()).values()) / 1e6
    assert 2 * 3 * 0.99 <= seconds <= 2 * 3 * (1 + 1e-4), out.read_text()
