"""The pprof sink's HTTP handlers, called directly with a scripted snapshot source (the web
server and the real pipeline are exercised by tests/e2e/test_pprof_e2e.py)."""

from __future__ import annotations

import argparse
import gzip
import threading
import time
from dataclasses import replace
from typing import Any
from urllib.parse import parse_qs

import pytest

from offcpu_exporter.formats.proto import profile_pb2 as pb
from offcpu_exporter.sinks import SinkContext
from offcpu_exporter.sinks.pprof import options as pprof_options
from offcpu_exporter.sinks.pprof import sink as pprof_sink
from offcpu_exporter.sinks.pprof.options import PprofOptions
from offcpu_exporter.snapshot import Counter, Snapshot
from offcpu_exporter.web import Request, Response, Routes
from testkit.snapshots import WORKLOAD, make_after, make_before, workload_snapshot


class Source:
    """Hands out snapshots in order on each flush_now, and keeps them as the history."""

    def __init__(self, *snapshots: Snapshot, history: bool = True, steps: list[int] | None = None) -> None:
        self._queue = list(snapshots)
        self._steps = list(steps or [])  # snapshots taken per flush_now call (default 1)
        self.taken: list[Snapshot] = []
        self._history = history
        self.fail = False

    def flush_now(self, timeout: float) -> Snapshot:
        if self.fail:
            raise TimeoutError("no flush within 10 s")
        for _ in range(self._steps.pop(0) if self._steps else 1):
            if self._queue:
                self.taken.append(self._queue.pop(0))
        return self.taken[-1]

    def history(self, seconds: float) -> list[Snapshot]:
        return list(self.taken) if self._history else []

    def latest(self) -> Snapshot:
        return self.taken[-1] if self.taken else Snapshot.empty()


def make_sink(source: Source, **kwargs: Any) -> tuple[pprof_sink.PprofSink, Routes]:
    routes = Routes()
    context = SinkContext(latest=source.latest, flush_now=source.flush_now, routes=routes, history=source.history)
    sink = pprof_sink.PprofSink(context, PprofOptions(**kwargs))
    sink.register(routes)
    return sink, routes


def get(routes: Routes, url: str) -> Response:
    path, _, query = url.partition("?")
    handler = routes.get(path)
    assert handler is not None, path
    return handler(Request("GET", path, parse_qs(query), {}))


def decode(body: bytes) -> pb.Profile:
    p = pb.Profile()
    p.ParseFromString(gzip.decompress(body))
    return p


def by_tid(p: pb.Profile) -> dict[str, list[int]]:
    out = {}
    for s in p.sample:
        labels = {p.string_table[lb.key]: p.string_table[lb.str] for lb in s.label}
        out[labels["tid"]] = list(s.value)
    return out


def test_routes() -> None:
    _, routes = make_sink(Source(make_before()))
    assert routes.paths() == ["/debug/pprof/", "/debug/pprof/offcpu", "/debug/pprof/profile", "/flamegraph"]


def test_cpu_profile_path_is_not_served_as_off_cpu() -> None:
    # Pyroscope, Grafana Alloy and Parca scrape /debug/pprof/profile as CPU time by default.
    source = Source(make_before(), make_after())
    _, routes = make_sink(source)
    response = get(routes, "/debug/pprof/profile?seconds=0.3")
    assert response.status == 404 and source.taken == []
    assert response.body.decode().count("\n") == 1 and "/debug/pprof/offcpu?seconds=N" in response.body.decode()


def test_profile_waits_and_differences() -> None:
    source = Source(make_before(), make_after())
    sink, routes = make_sink(source)
    started = time.monotonic()
    response = get(routes, "/debug/pprof/offcpu?seconds=0.3")
    assert time.monotonic() - started >= 0.3
    assert response.status == 200
    assert response.content_type == "application/octet-stream"
    assert response.headers["Content-Disposition"] == 'attachment; filename="profile"'
    assert len(source.taken) == 2  # one flush before, one after the wait
    p = decode(response.body)
    assert by_tid(p) == {
        "4242": [1_500_000_000, 15],
        "4243": [250_000_000, 4],
        "4244": [1_234_567, 3],
        "779": [40_000_499, 2],
    }
    assert sink.stats.get("sent") == 1


def test_profile_sums_the_history_between_its_flushes() -> None:
    # A periodic flush (sequence 2) happens while the request waits; in the handler's second
    # snapshot (3) the OTHER process's rows are gone, but the history still has its increase.
    before, middle = make_before(), make_after()
    gone = tuple(replace(s, increase=Counter()) for s in middle.samples if s.process == WORKLOAD.key)
    last = replace(workload_snapshot(3, []), samples=gone)
    for history, expected in ((True, [40_000_499, 2]), (False, None)):
        source = Source(before, middle, last, history=history, steps=[1, 2])
        _, routes = make_sink(source)
        p = decode(get(routes, "/debug/pprof/offcpu?seconds=0.01").body)
        assert [s.sequence for s in source.taken] == [1, 2, 3]
        assert by_tid(p).get("779") == expected
        assert by_tid(p)["4242"] == [1_500_000_000, 15]


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("seconds=abc", "is not a number"),
        ("seconds=0", "must be positive"),
        ("seconds=-3", "must be positive"),
        ("seconds=301", "exceeds the maximum of 300"),
        ("seconds=1&pid=12x", "is not a process id"),
        ("seconds=1&comm=(", "is not a regular expression"),
    ],
)
def test_bad_parameters(query: str, message: str) -> None:
    source = Source(make_before(), make_after())
    _, routes = make_sink(source, max_seconds=300)
    response = get(routes, f"/debug/pprof/offcpu?{query}")
    assert response.status == 400
    assert message in response.body.decode()
    assert response.body.count(b"\n") == 1
    assert source.taken == []  # nothing was flushed for a bad request


def test_filters() -> None:
    _, routes = make_sink(Source(make_before(), make_after()))
    assert set(by_tid(decode(get(routes, "/debug/pprof/offcpu?seconds=0.01&pid=777").body))) == {"779"}
    _, routes = make_sink(Source(make_before(), make_after()))
    both = decode(get(routes, "/debug/pprof/offcpu?seconds=0.01&pid=1,4242&pid=777&comm=^off").body)
    assert set(by_tid(both)) == {"4242", "4243", "4244"}


def test_concurrency_limit_and_shutdown() -> None:
    source = Source(make_before(), make_after())
    sink, routes = make_sink(source, max_concurrent=1)
    results: list[Response] = []
    worker = threading.Thread(target=lambda: results.append(get(routes, "/debug/pprof/offcpu?seconds=60")))
    worker.start()
    deadline = time.monotonic() + 5
    while not source.taken and time.monotonic() < deadline:
        time.sleep(0.01)
    busy = get(routes, "/debug/pprof/offcpu?seconds=1")
    assert busy.status == 429 and sink.stats.get("dropped") == 1
    started = time.monotonic()
    sink.close(1.0)
    worker.join(5)
    assert not worker.is_alive() and time.monotonic() - started < 2
    assert results[0].status == 503


def test_flush_failure_is_a_503() -> None:
    source = Source(make_before())
    source.fail = True
    sink, routes = make_sink(source)
    response = get(routes, "/debug/pprof/offcpu?seconds=0.01")
    assert response.status == 503 and "no flush within" in response.body.decode()
    assert sink.stats.get("failed") == 1


def test_flamegraph_from_history() -> None:
    source = Source(make_before(), make_after())
    source.flush_now(1)
    source.flush_now(1)
    _, routes = make_sink(source)
    page = get(routes, "/flamegraph?minutes=2")
    assert page.status == 200 and page.content_type.startswith("text/html")
    text = page.body.decode()
    # The history holds 5 s: the title says so instead of claiming 2 minutes.
    assert "Off-CPU flame graph: last 0.1 minutes, all the history kept" in text
    assert "offcpu_pipe_read" in text
    assert b"Off-CPU flame graph: last 0.05 minutes" in get(routes, "/flamegraph?minutes=0.05").body
    folded = get(routes, "/flamegraph?format=folded&comm=work").body.decode()
    assert sum(int(line.rsplit(" ", 1)[1]) for line in folded.splitlines()) == 1_751_235
    assert get(routes, "/flamegraph?minutes=61").status == 400
    assert get(routes, "/flamegraph?format=svg").status == 400


def test_flamegraph_without_history_shows_totals_since_start() -> None:
    source = Source(make_before(), make_after(), history=False)
    source.flush_now(1)
    source.flush_now(1)
    _, routes = make_sink(source)
    folded = get(routes, "/flamegraph?format=folded&pid=4242").body.decode()
    assert sum(int(line.rsplit(" ", 1)[1]) for line in folded.splitlines()) == 2_500_000 + 550_000 + 1_235
    assert b"since the exporter started" in get(routes, "/flamegraph").body


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    pprof_options.add_arguments(p)
    return p


def test_options() -> None:
    source = Source(make_before())
    context = SinkContext(latest=source.latest, flush_now=source.flush_now, routes=Routes())
    options = parser().parse_args([])
    assert (options.pprof_max_seconds, options.flamegraph_max_minutes) == (300.0, 60.0)
    sink = pprof_sink.create(options, context)
    assert sink is not None and sink.max_seconds == 300.0 and "/debug/pprof/offcpu" in context.routes.paths()
    assert pprof_sink.create(parser().parse_args(["--pprof.disable"]), context) is None
    options = parser().parse_args(["--pprof.max-seconds", "10"])
    assert options.pprof_max_seconds == 10.0


@pytest.mark.parametrize("value", ["0", "-1", "x"])
def test_bad_option_exits_2(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parser().parse_args(["--pprof.max-seconds", value])
    assert exit_info.value.code == 2
    assert "--pprof.max-seconds" in capsys.readouterr().err
