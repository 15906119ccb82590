from __future__ import annotations

import io
import time
from pathlib import Path

import pytest

from offcpu_exporter import cli
from offcpu_exporter.record import Progress, RecordOptions, RecordSink
from testkit.snapshots import make_after, make_before, workload_snapshot


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_record_sink_sums_increases_and_keeps_exited_processes() -> None:
    sink = RecordSink()
    before, after = make_before(), make_after()
    gone = workload_snapshot(3, [])  # every process gone from the outputs
    for s in (before, after, after, gone):  # the same snapshot twice counts once
        sink.publish(s)
    profile = sink.profile("test")
    totals = {k.pid: v for k, v in profile.totals_by_process().items()}
    # before's own increases (from the probe's start) plus after's.
    assert totals[4242].ns == 10**9 + 300_000_000 + 1_500_000_000 + 250_000_000 + 1_234_567
    assert totals[777].ns == 1_000 + 40_000_499
    assert profile.start_ns == before.interval_start_ns and profile.end_ns == gone.time_ns
    assert sink.seen() == (4, 2, profile.total.seconds)
    assert profile.processes[before.samples[0].process].comm == "offcpu_workload"


def test_progress_on_a_terminal() -> None:
    now = [100.0]
    term = Terminal()
    progress = Progress(30, lambda: (12, 3, 4.5), stream=term, clock=lambda: now[0])
    progress.update()
    now[0] += 10
    progress.update()
    progress.finish()
    out = term.getvalue()
    assert out.startswith("\rrecording:   30 s left, 12 stacks, 3 processes, 4.500 s off CPU")
    assert "\rrecording:   20 s left," in out
    assert out.endswith("\r")  # the line is erased before the profile is written


def test_no_progress_when_piped() -> None:
    piped = io.StringIO()
    progress = Progress(30, lambda: (1, 1, 1.0), stream=piped)
    progress.update()
    progress.finish()
    assert not progress.enabled and piped.getvalue() == ""


def test_unwritable_output_fails_before_recording(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    started = time.monotonic()
    status = cli.main(["record", "--pid", "1", "--duration", "60", "-o", str(tmp_path / "missing" / "out.html")])
    assert status == 2 and time.monotonic() - started < 10  # no probe loaded, no 60 s wait
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot write" in err and "No such file or directory" in err


def test_record_options_and_their_flush_interval() -> None:
    parsed = cli.parse_args(["record", "--pid", "1", "--duration", "30s", "--format", "text", "-o", "out.txt"])
    options = RecordOptions.from_args(parsed)
    assert options == RecordOptions(duration=30.0, format="text", output="out.txt")
    # Flushes every second, or once for a shorter recording; the core config takes it, not the namespace.
    assert options.flush_interval == 1.0
    assert RecordOptions(duration=0.25, format="folded", output="-").flush_interval == 0.25
    assert cli.core_config(parsed, flush_interval=options.flush_interval).flush_interval == 1.0
    assert not hasattr(parsed, "flush_interval")
