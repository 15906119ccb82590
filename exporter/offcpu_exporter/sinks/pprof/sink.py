"""On-demand profiles over HTTP: ``/debug/pprof/offcpu?seconds=N`` returns a gzip pprof of the
next N seconds, as Go's net/http/pprof does for CPU, so that
``go tool pprof http://HOST:PORT/debug/pprof/offcpu?seconds=30``, Parca and Grafana Alloy read it;
``/flamegraph?minutes=N`` shows the last N minutes from the in-memory snapshot history as an
interactive flame graph.

``/debug/pprof/profile`` is Go's *CPU* profile, and Pyroscope, Grafana Alloy and Parca scrape it
as CPU time by default: off-CPU time served there would be stored and shown as CPU time. It
answers 404 with a pointer to the off-CPU path instead.

This sink publishes nothing per flush: it only registers HTTP handlers. A profile request asks
the pipeline for a flush now and another one N seconds later, so its interval is exact and
independent of the flush period. Filters on every endpoint: ``pid=`` (repeatable or
comma-separated) and ``comm=`` (a regular expression searched in the process name).
"""

from __future__ import annotations

import argparse
import logging
import re
import threading
import time
from dataclasses import replace

from offcpu_exporter import formats
from offcpu_exporter.formats import Profile, ProfileFilter
from offcpu_exporter.formats import flamegraph as flamegraph_format
from offcpu_exporter.formats import pprof as pprof_format
from offcpu_exporter.sinks import SinkContext, SinkStats
from offcpu_exporter.sinks.pprof.options import FLAMEGRAPH_PATH, PROFILE_PATH, PprofOptions, enabled
from offcpu_exporter.snapshot import Snapshot
from offcpu_exporter.web import Request, Response, Routes

__all__ = ["PprofSink", "create"]

log = logging.getLogger(__name__)

CPU_PROFILE_PATH = "/debug/pprof/profile"
INDEX_PATH = "/debug/pprof/"
DEFAULT_SECONDS = 30.0
DEFAULT_MINUTES = 5.0
# How long one of the profile's two flushes may take (a flush of a busy host takes well under 1 s).
FLUSH_TIMEOUT = 10.0
_WARN_EVERY = 60.0


def create(options: argparse.Namespace, context: SinkContext) -> PprofSink | None:
    if not enabled(options):
        return None
    sink = PprofSink(context, PprofOptions.from_args(options))
    sink.register(context.routes)
    return sink


class BadRequest(ValueError):
    """A query parameter that cannot be served; the message is the response body."""


def _number(request: Request, name: str, default: float, maximum: float) -> float:
    text = request.arg(name)
    if text is None or text == "":
        return min(default, maximum)
    try:
        value = float(text)
    except ValueError:
        raise BadRequest(f"{name}={text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise BadRequest(f"{name}={text!r} must be positive")
    if value > maximum:
        raise BadRequest(f"{name}={text!r} exceeds the maximum of {maximum:g} set by the exporter's options")
    return value


def profile_filter(request: Request) -> ProfileFilter:
    pids: set[int] = set()
    for value in request.query.get("pid", []):
        for part in value.split(","):
            part = part.strip()
            if not part:
                continue
            if not part.isdigit() or int(part) <= 0:
                raise BadRequest(f"pid={part!r} is not a process id")
            pids.add(int(part))
    comm = None
    pattern = request.arg("comm")
    if pattern:
        try:
            comm = re.compile(pattern)
        except re.error as e:
            raise BadRequest(f"comm={pattern!r} is not a regular expression: {e}") from None
    return ProfileFilter(frozenset(pids), comm)


def _describe(keep: ProfileFilter) -> str:
    parts = []
    if keep.pids:
        parts.append("pid " + ",".join(str(p) for p in sorted(keep.pids)))
    if keep.comm is not None:
        parts.append(f"comm ~ /{keep.comm.pattern}/")
    return ", ".join(parts)


def _text(status: int, message: str) -> Response:
    return Response(status, (message.rstrip("\n") + "\n").encode(), headers={"X-Content-Type-Options": "nosniff"})


class PprofSink:
    name = "pprof"

    def __init__(
        self,
        context: SinkContext,
        options: PprofOptions,
    ) -> None:
        self.stats = SinkStats()
        self._context = context
        self.max_seconds = options.max_seconds
        self.max_minutes = options.max_minutes
        self._max_concurrent = options.max_concurrent
        self._slots = threading.BoundedSemaphore(options.max_concurrent)
        self._closing = threading.Event()
        self._warned: dict[str, float] = {}

    def register(self, routes: Routes) -> None:
        routes.add(PROFILE_PATH, self.profile)
        routes.add(CPU_PROFILE_PATH, self.not_cpu)
        routes.add(INDEX_PATH, self.index)
        routes.add(FLAMEGRAPH_PATH, self.flamegraph)

    def publish(self, snapshot: Snapshot) -> None:
        """Nothing to do per flush: profiles are made on request."""

    def close(self, timeout: float) -> None:
        # Requests waiting out their interval return 503 at once instead of holding shutdown.
        self._closing.set()

    def _warn(self, what: str, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._warned.get(what, -_WARN_EVERY) >= _WARN_EVERY:
            self._warned[what] = now
            log.warning(message, *args)

    # GET /debug/pprof/profile
    def not_cpu(self, request: Request) -> Response:
        return _text(
            404,
            f"{CPU_PROFILE_PATH} is a CPU profile, which this exporter does not make; "
            f"its off-CPU profile is {PROFILE_PATH}?seconds=N",
        )

    # GET /debug/pprof/offcpu?seconds=N
    def profile(self, request: Request) -> Response:
        try:
            seconds = _number(request, "seconds", DEFAULT_SECONDS, self.max_seconds)
            keep = profile_filter(request)
        except BadRequest as e:
            return _text(400, str(e))
        if not self._slots.acquire(blocking=False):
            self.stats.add("dropped")
            self._warn("busy", "pprof: refused a profile request, %d already running", self._max_concurrent)
            return _text(429, "too many profiles in progress; retry later")
        try:
            if self._closing.is_set():
                return _text(503, "the exporter is shutting down")
            try:
                before = self._context.flush_now(FLUSH_TIMEOUT)
                if self._closing.wait(seconds):
                    return _text(503, "the exporter is shutting down")
                after = self._context.flush_now(FLUSH_TIMEOUT)
            except Exception as e:  # the pipeline's failure must not kill the server thread
                self.stats.add("failed")
                self._warn("flush", "pprof: could not take a snapshot for a profile: %s", e)
                return _text(503, f"could not take a snapshot: {e}")
        finally:
            self._slots.release()
        description = f"{seconds:g} s profile" + (f", {_describe(keep)}" if _describe(keep) else "")
        body = pprof_format.encode(self._interval(before, after, keep, description))
        self.stats.add("sent")
        return Response(
            200,
            body,
            "application/octet-stream",
            {"Content-Disposition": 'attachment; filename="profile"', "X-Content-Type-Options": "nosniff"},
        )

    def _interval(self, before: Snapshot, after: Snapshot, keep: ProfileFilter, description: str) -> Profile:
        """Sums the increases of every snapshot between the two flushes when the history still
        holds all of them (so rows that vanish meanwhile keep their time), else differences
        the two snapshots' totals."""
        span = max(0.0, (after.time_ns - before.time_ns) / 1e9) + 5.0
        try:
            history = [s for s in self._context.history(span) if before.sequence <= s.sequence <= after.sequence]
        except Exception as e:
            self._warn("history", "pprof: snapshot history unavailable: %s", e)
            history = []
        # The history's entries are consecutive; older ones are summed into buckets, and one that
        # began before `before` cannot be split at it.
        unique = sorted({s.sequence: s for s in history}.values(), key=lambda s: s.sequence)
        if len(unique) > 1 and unique[0].sequence == before.sequence and unique[-1].sequence == after.sequence:
            return Profile.over(unique, keep, description)
        return Profile.between(before, after, keep, description)

    # GET /flamegraph?minutes=N[&format=html|folded|text|pprof]
    def flamegraph(self, request: Request) -> Response:
        try:
            minutes = _number(request, "minutes", DEFAULT_MINUTES, self.max_minutes)
            keep = profile_filter(request)
            fmt = request.arg("format", "html") or "html"
            if fmt not in formats.FORMATS:
                raise BadRequest(f"format={fmt!r} is not one of {', '.join(formats.FORMATS)}")
        except BadRequest as e:
            return _text(400, str(e))
        filters = _describe(keep)
        history = self._context.history(minutes * 60.0)
        # Without a history (none kept yet) the newest snapshot's totals since start are shown.
        if history:
            profile = Profile.over(history, keep)
            covered = profile.duration_ns / 60e9
            description = f"last {minutes:g} minutes"
            if covered < minutes * 0.9:
                # The exporter has not run that long, or keeps less history (--history).
                description = f"last {covered:.1f} minutes, all the history kept"
        else:
            profile = Profile.since_start(self._context.latest(), keep)
            description = "since the exporter started"
        profile = replace(profile, description=description + (f", {filters}" if filters else ""))
        self.stats.add("sent")
        if fmt == "html":
            title = f"Off-CPU flame graph: {description}"
            return Response(200, flamegraph_format.encode(profile, title), "text/html; charset=utf-8")
        content_type = "application/octet-stream" if fmt == "pprof" else "text/plain; charset=utf-8"
        return Response(200, formats.render(fmt, profile), content_type)

    # GET /debug/pprof/
    def index(self, request: Request) -> Response:
        rows = (
            f'<li><a href="{PROFILE_PATH}?seconds=30">{PROFILE_PATH}</a>?seconds=N: '
            "off-CPU pprof of the next N seconds</li>"
        )
        page = (
            "<!DOCTYPE html><html><head><meta charset='utf-8'><title>/debug/pprof/</title></head><body>"
            f"<h1>offcpu-exporter profiles</h1><ul>{rows}"
            f'<li><a href="{FLAMEGRAPH_PATH}">{FLAMEGRAPH_PATH}</a>?minutes=N: '
            "flame graph of the last N minutes</li>"
            "</ul><p>Filters: pid=PID[,PID...], comm=REGEX. "
            f"Longest profile: {self.max_seconds:g} s.</p>"
            f"<p><code>go tool pprof http://HOST:PORT{PROFILE_PATH}?seconds=30</code></p></body></html>"
        )
        return Response(200, page.encode(), "text/html; charset=utf-8")
