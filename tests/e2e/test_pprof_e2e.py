"""End to end, on the real kernel: `go tool pprof` fetching /debug/pprof/offcpu from a real
`offcpu-exporter serve` watching a workload with known blocking; the same handler on an
in-process pipeline built as `serve` builds it (cli.build_pipeline); `record --format html`
rendered in Chromium; record's progress line on a terminal."""

from __future__ import annotations

import os
import pty
import re
import select
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs

import pytest

from offcpu_exporter import cli
from offcpu_exporter.sinks import SinkContext
from offcpu_exporter.sinks.pprof import sink as pprof_sink
from offcpu_exporter.snapshot import Snapshot
from offcpu_exporter.web import Request, Response, Routes
from testkit import chromium
from testkit.exporter import SOURCE_ENV, ExporterProcess
from testkit.gopprof import go_pprof, top_cum
from testkit.workloads import Workload, build

pytestmark = pytest.mark.kernel

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"


class Served:
    """A pipeline as `serve` wires it, with the pprof sink's routes, stopped at the end."""

    def __init__(self, argv: list[str]) -> None:
        options = cli.parse_args(["serve", *argv])
        self.probe, self.pipeline, self.metadata = cli.build_pipeline(options)
        self.probe.start()
        self.flushes: list[Snapshot] = []
        self.first_flush = threading.Event()
        self.routes = Routes()

        def flush_now(timeout: float) -> Snapshot:
            snapshot = self.pipeline.flush_now(timeout)
            self.flushes.append(snapshot)
            self.first_flush.set()
            return snapshot

        context = SinkContext(
            latest=self.pipeline.latest, flush_now=flush_now, routes=self.routes, history=self.pipeline.history
        )
        self.sink = pprof_sink.create(options, context)
        assert self.sink is not None
        self.pipeline.sinks = [self.sink]
        self.pipeline.start()

    def get(self, url: str) -> Response:
        path, _, query = url.partition("?")
        handler = self.routes.get(path)
        assert handler is not None
        return handler(Request("GET", path, parse_qs(query), {}))

    def close(self) -> None:
        self.pipeline.stop()
        self.metadata.close()
        self.probe.close()


@pytest.fixture
def workload() -> Iterator[Workload]:
    build()
    with Workload("sleep", threads=2, iterations=60, interval_ms=20) as w:
        yield w


def test_profile_endpoint_matches_known_blocking(workload: Workload, tmp_path: Path) -> None:
    # Short flushes, so that the workload's stacks are symbolized while it is alive.
    served = Served(["--pid", str(workload.pid), "--flush-interval", "0.5"])
    try:
        responses: list[Response] = []
        request = threading.Thread(
            target=lambda: responses.append(served.get(f"/debug/pprof/offcpu?seconds=3&pid={workload.pid}"))
        )
        request.start()
        assert served.first_flush.wait(10), "the handler never flushed"
        workload.go()  # all of the workload's blocking happens inside the profile's 3 s
        result = workload.wait(30)
        request.join(20)
        assert not request.is_alive()
    finally:
        served.close()
    response = responses[0]
    assert response.status == 200, response.body
    path = tmp_path / "profile.pb.gz"
    path.write_bytes(response.body)
    (ARTIFACTS / "e2e-profile.pb.gz").parent.mkdir(exist_ok=True)
    (ARTIFACTS / "e2e-profile.pb.gz").write_bytes(response.body)

    out = go_pprof(tmp_path, "-top", "-unit=ms", "-nodefraction=0", str(path))
    cum = top_cum(out)
    known_ms = sum(t.blocked_ns for t in result.threads if t.function == "offcpu_sleep_ms") / 1e6
    assert known_ms > 2 * 60 * 20 * 0.9  # 2 threads x 60 sleeps of 20 ms
    assert "offcpu_sleep_ms" in cum, out
    (ARTIFACTS / "e2e-profile.txt").write_text(
        f"known blocked {known_ms:.1f} ms in {result.calls} calls; "
        f"pprof offcpu_sleep_ms {cum['offcpu_sleep_ms']} ms\n{out}"
    )
    assert cum["offcpu_sleep_ms"] == pytest.approx(known_ms, rel=0.10), out
    sw = top_cum(go_pprof(tmp_path, "-top", "-sample_index=switches", "-nodefraction=0", str(path)))
    assert sw["offcpu_sleep_ms"] == pytest.approx(result.calls, rel=0.10)
    # The interval is the one between the handler's two flushes: 3 s plus the second flush.
    duration = re.search(r"^Duration: ([\d.]+)s", out, re.M)
    assert duration is not None and 3.0 <= float(duration.group(1)) < 3.0 + pprof_sink.FLUSH_TIMEOUT, out


def flushes(exporter: ExporterProcess) -> float:
    text = exporter.get("/metrics").decode()
    m = re.search(r"^offcpu_exporter_flushes_total (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def test_go_tool_pprof_fetches_a_served_profile(workload: Workload, tmp_path: Path) -> None:
    go = shutil.which("go")
    assert go is not None, "go (Debian golang-go) is needed: scripts/setup --test"
    # No periodic flush during the test: the only flushes are the handler's two.
    with ExporterProcess(["--pid", str(workload.pid), "--flush-interval", "600"]) as exporter:
        assert flushes(exporter) == 0
        env = dict(os.environ, HOME=str(tmp_path), GOCACHE=str(tmp_path / "gocache"), PPROF_TMPDIR=str(tmp_path))
        fetch = subprocess.Popen(
            [
                go,
                "tool",
                "pprof",
                "-top",
                "-unit=ms",
                "-nodefraction=0",
                "-seconds=3",
                "-timeout=60",
                f"{exporter.url}/debug/pprof/offcpu",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        deadline = time.monotonic() + 30
        while flushes(exporter) < 1:  # the handler took its first snapshot
            assert time.monotonic() < deadline and fetch.poll() is None, fetch.stderr.read() if fetch.stderr else ""
            time.sleep(0.05)
        workload.go()
        result = workload.wait(30)
        out, err = fetch.communicate(timeout=60)
        assert fetch.returncode == 0, err
        assert flushes(exporter) == 2
    cum = top_cum(out)
    known_ms = sum(t.blocked_ns for t in result.threads) / 1e6
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "e2e-http-profile.txt").write_text(f"known blocked {known_ms:.1f} ms\n{out}")
    assert "Type: off_cpu" in out and "offcpu_sleep_ms" in cum, out
    assert cum["offcpu_sleep_ms"] == pytest.approx(known_ms, rel=0.10), out


def test_record_html_shows_the_function(tmp_path: Path) -> None:
    build()
    page = ARTIFACTS / "e2e-record.html"
    page.parent.mkdir(exist_ok=True)
    # The workload outlives the recording (it is killed after), so every stack is symbolized.
    with Workload("pipe", threads=2, iterations=2000, interval_ms=10) as w:
        record = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "offcpu_exporter",
                "record",
                "--pid",
                str(w.pid),
                "--duration",
                "3",
                "--format",
                "html",
                "-o",
                str(page),
            ],
            cwd=ROOT,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **SOURCE_ENV},
        )
        assert record.stderr is not None
        deadline = time.monotonic() + 60
        for line in record.stderr:
            if "recording for" in line or time.monotonic() > deadline:
                break
        w.go()
        _, err = record.communicate(timeout=60)
        assert record.returncode == 0, err
        assert "recording:" not in err  # no progress line when stderr is not a terminal
    chromium.screenshot(page, ARTIFACTS / "e2e-record.png")
    dom = chromium.dump_dom(page)
    widths = [
        float(m.group(1))
        for m in re.finditer(r'<div class="frame[^"]*" data-name="offcpu_pipe_read" style="[^"]*width: ([\d.]+)px', dom)
    ]
    assert widths, "offcpu_pipe_read is not drawn"
    assert max(widths) > 200  # the readers wait nearly all the time: a wide frame
    assert re.search(r">offcpu_pipe_read<", dom)  # and it is labelled


def test_record_progress_only_on_a_terminal(tmp_path: Path) -> None:
    build()
    with Workload("sleep", threads=1, iterations=3000, interval_ms=10, wait_go=False) as w:
        primary, secondary = pty.openpty()
        try:
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "offcpu_exporter",
                    "record",
                    "--pid",
                    str(w.pid),
                    "--duration",
                    "6",
                    "--format",
                    "folded",
                    "-o",
                    str(tmp_path / "out.folded"),
                    "--log.level",
                    "warning",
                ],
                cwd=ROOT,
                stderr=secondary,
                stdout=subprocess.DEVNULL,
                timeout=60,
                check=False,
                env={**os.environ, **SOURCE_ENV},
            )
            os.close(secondary)
            secondary = -1
            chunks = []
            while select.select([primary], [], [], 0.5)[0]:
                try:
                    chunk = os.read(primary, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                chunks.append(chunk)
        finally:
            if secondary >= 0:
                os.close(secondary)
            os.close(primary)
    assert done.returncode == 0
    text = b"".join(chunks).decode()
    lefts = [int(m) for m in re.findall(r"recording:\s+(\d+) s left, \d+ stacks?, \d+ process(?:es)?", text)]
    assert len(lefts) >= 3 and lefts[0] == 6 and lefts == sorted(lefts, reverse=True), text
    assert re.search(r"recording:\s+\d+ s left, [1-9]\d* stacks?, 1 process,", text), text
    assert (tmp_path / "out.folded").read_text().count("offcpu_sleep_ms") >= 1


def test_profile_covers_exactly_its_seconds() -> None:
    """Three threads off CPU all along (two long sleepers and the main thread joining them), since
    before the request: the profile holds each one's time over the profile's own interval, within
    1%, and not more (blocks in progress count up to each flush, not when they end)."""
    import gzip

    from offcpu_exporter.formats.proto import profile_pb2

    with Workload("sleep", threads=2, iterations=1, interval_ms=120_000) as w:
        w.go()
        time.sleep(0.3)
        served = Served(["--pid", str(w.pid), "--flush-interval", "0.5"])
        try:
            time.sleep(1.0)  # watched, and the blocks seeded
            response = served.get(f"/debug/pprof/offcpu?seconds=3&pid={w.pid}")
        finally:
            served.close()
    assert response.status == 200, response.body
    profile = profile_pb2.Profile.FromString(gzip.decompress(response.body))
    strings = profile.string_table
    index = next(i for i, t in enumerate(profile.sample_type) if strings[t.unit] == "nanoseconds")
    total_s = sum(s.value[index] for s in profile.sample) / 1e9
    duration_s = profile.duration_nanos / 1e9
    assert 3.0 <= duration_s < 3.5
    print(f"profile of {duration_s:.4f} s: {total_s:.4f} s off CPU over 3 threads")
    assert total_s == pytest.approx(3 * duration_s, rel=0.01)
    assert total_s <= 3 * duration_s * 1.001
