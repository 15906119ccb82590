"""The exporter's cost as the node grows (issue 27): `offcpu-exporter serve` as deployed, with its
defaults (every process on the machine watched), while N tiny processes run, for N = 200, 2,000
and 10,000, at the same total switch rate for every N.

    PYTHONPATH=. .venv/bin/python bench/scale.py [--processes 200,2000,10000] [--rate 4000] [--duration 20]
                                                 [--warmup 20] [--out FILE] [--table FILE]

The processes are copies of bench/workloads/sleeper.c (static, no threads, ~230 KB RSS each, most
of it shared): each blocks in clock_nanosleep once per period N / --rate seconds at a random phase,
so that the machine sees --rate blocks/s in total whatever N (4,000/s: every 50 ms at 200
processes, every 2.5 s at 10,000). The rate achieved is read from voluntary_ctxt_switches of 100
of them picked at random, scaled to N, so that this script's own /proc reads stay small beside
the exporter's at 10,000.

For each N in turn: the sleepers start, then a fresh exporter (so that its warm-up covers finding
them), --warmup seconds pass (the BPF compile, the /proc scans finding the processes, symbols) and
at least two flushes (the first names every process's stacks for the first time: 14 s at 10,000
processes here), then over --duration seconds of steady state:
- CPU: utime + stime of the exporter from /proc/PID/stat, as % of one core;
- RSS: the largest VmRSS sampled every 0.5 s;
- flush time: the exporter's `offcpu_exporter_last_flush_duration_seconds` gauge, read at each
  scrape (one each just before and after the window as well, outside its CPU figure); distinct
  flushes told apart by `offcpu_exporter_last_flush_timestamp_seconds`;
- scrape time: wall time of 3 `GET /metrics` spread over the window (uncompressed, as urllib asks);
  the median is reported with the body's size;
- processes watched: the `offcpu_exporter_targets` gauge beside the count of user processes in
  /proc (kernel threads are not watched); with it the exporter's loss counters that grew (dropped,
  lost, overflow...) and the lines of its log (all warnings or worse).
Then the exporter and the sleepers stop before the next N. Each N takes a few seconds of start-up,
--warmup + --duration seconds, and the exporter's stop (it flushes once more: up to ~40 s at 10,000
processes here; killed after 60 s); the default run about 3 minutes.

Targets (issue 27): at 2,000 processes CPU <= 3% of one core, steady RSS <= 120 MB, scrape <= 0.3 s;
at 10,000 processes CPU <= 6%; CPU at 2,000 processes <= 3x CPU at 200. A target counts as met only
when the exporter watched all N sleepers and the rate achieved was within 10% of --rate.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import random
import resource
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import (
    ROOT,
    WORKLOADS,
    Result,
    Row,
    Stopwatch,
    build_c,
    cpu_seconds,
    python_path,
    shared,
    status_kib,
    stop_exporter,
    write_outputs,
)

from testkit.exporter import free_port

PROCESSES = (200, 2000, 10_000)
RATE = 4000.0
SAMPLED = 100
SCRAPES = 3
WARMUP_FLUSHES = 2  # the warm-up lasts at least this many flushes
# Keyed by N; a metric with no target at that N is shown without one.
TARGETS: dict[int, dict[str, float]] = {2000: {"cpu": 3.0, "rss": 120.0, "scrape": 0.3}, 10_000: {"cpu": 6.0}}
GROWTH_TARGET = (200, 2000, 3.0)
# Self-metrics whose growth means data was lost or cut short; any nonzero one is reported.
LOSS_WORDS = ("dropped", "lost", "overflow", "clamped", "failures", "failed", "no_space", "missed")


def status_field(pid: int, name: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(name + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


PF_KTHREAD = 0x00200000


def user_processes() -> int:
    """Processes in /proc but kernel threads, which the exporter does not watch."""
    n = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                flags = int(f.read().rsplit(")", 1)[1].split()[6])
        except (OSError, IndexError, ValueError):
            continue
        n += not flags & PF_KTHREAD
    return n


def mem_available_kib() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    raise KeyError("MemAvailable")


def make_room(count: int) -> dict[str, int]:
    """Fail early, with the reason, when COUNT more processes cannot exist; raise RLIMIT_NPROC when
    it is the soft limit that stands in the way (root is exempt in the kernel, other users not)."""
    with open("/proc/loadavg") as f:
        tasks = int(f.read().split()[3].split("/")[1])  # threads too: they take pids as well
    need = tasks + count + 1000
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    threads_max = int(Path("/proc/sys/kernel/threads-max").read_text())
    if need > min(pid_max, threads_max):
        raise RuntimeError(f"{count:,} more processes do not fit: {tasks:,} tasks now, pid_max {pid_max:,}, "
                           f"threads-max {threads_max:,}")
    soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft != resource.RLIM_INFINITY and soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            raise RuntimeError(f"RLIMIT_NPROC hard limit {hard:,} is below the {need:,} processes needed")
        resource.setrlimit(resource.RLIMIT_NPROC, (need, hard))
    return {"tasks_before": tasks, "pid_max": pid_max}


class Sleepers:
    """COUNT copies of workloads/sleeper.c in a process group of their own."""

    def __init__(self, binary: Path, count: int, period: float, timeout: float = 120.0) -> None:
        self.count = count
        started = time.monotonic()
        self.proc = subprocess.Popen([str(binary), str(round(period * 1e9)), str(count)], stdout=subprocess.PIPE,
                                     text=True, start_new_session=True)
        try:
            self.pids = self._ready(timeout)
        except BaseException:
            self.stop()
            raise
        self.spawn_seconds = time.monotonic() - started

    def _ready(self, timeout: float) -> list[int]:
        stdout = self.proc.stdout
        assert stdout is not None
        if not select.select([stdout], [], [], timeout)[0]:
            raise RuntimeError(f"{self.count:,} sleepers not started within {timeout:.0f} s")
        words = stdout.readline().split()
        stdout.close()
        if not words or words[0] != "ready":
            raise RuntimeError(f"sleeper failed to start its copies (exit status {self.proc.wait()})")
        return [int(w) for w in words[1:]]

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM to the first process, which ends its copies a batch at a time (a group kill
        would make them all runnable at once: a jump of the load average that would mark the next
        measurements as shared) and exits; SIGKILL to the whole group if it has not within
        `timeout` seconds. Returns how many copies are still in /proc after."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        finally:
            # While the first process is not reaped its pid, the group's id, cannot be reused; once
            # it exited by itself, it had reaped every copy before.
            if self.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        # Copies orphaned by a SIGKILL are reaped by init, here only every few seconds.
        deadline = time.monotonic() + 30
        while (left := self.left()) and time.monotonic() < deadline:
            time.sleep(0.5)
        return left

    def left(self) -> int:
        n = 0
        for pid in getattr(self, "pids", ()):
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            n += int(fields[2]) == self.proc.pid  # pgrp: a pid reused by another process does not count
        return n


def voluntary_switches(pids: Sequence[int]) -> list[int | None]:
    return [status_field(pid, "voluntary_ctxt_switches") for pid in pids]


def scrape(port: int) -> tuple[float, bytes]:
    start = time.perf_counter()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as r:
        body = r.read()
    return time.perf_counter() - start, bytes(body)


def self_metrics(body: bytes) -> dict[str, float]:
    """The exporter's own series (offcpu_exporter_*), by series text (name and labels)."""
    out: dict[str, float] = {}
    for line in body.decode(errors="replace").splitlines():
        if line.startswith("offcpu_exporter_"):
            series, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                out[series] = float(value)
    return out


def log_problems(path: str) -> list[str]:
    """Its log at --log.level warning: every line is a warning or worse (tracebacks included)."""
    return [line for line in Path(path).read_text(errors="replace").splitlines() if line.strip()]


def settled(exporter: subprocess.Popen[bytes], port: int, log: str, flushes: int = WARMUP_FLUSHES,
            timeout: float = 180.0) -> bytes:
    """/metrics once the exporter has done `flushes` flushes: the first one names every process's
    stacks for the first time (14 s at 10,000 processes here), which is start-up, not steady state.
    Read before the window: its flush gauge and counters are the window's start, outside its CPU
    figure."""
    deadline = time.monotonic() + timeout
    while True:
        if exporter.poll() is not None:
            raise RuntimeError(f"exporter exited with {exporter.returncode}: {Path(log).read_text()}")
        _, body = scrape(port)
        if self_metrics(body).get("offcpu_exporter_flushes_total", 0.0) >= flushes:
            return body
        if time.monotonic() > deadline:
            raise RuntimeError(f"exporter not past {flushes} flushes {timeout:.0f} s after the warm-up")
        time.sleep(1.0)


def one_size(binary: Path, count: int, rate: float, duration: float, warmup: float) -> dict[str, Any]:
    clock = Stopwatch()
    room = make_room(count)
    available_before = mem_available_kib()
    period = count / rate
    log = tempfile.NamedTemporaryFile("w+", prefix=f"offcpu-scale-{count}-", suffix=".log", delete=False)  # noqa: SIM115
    sleepers = Sleepers(binary, count, period)
    exporter: subprocess.Popen[bytes] | None = None
    figures: dict[str, Any] = {"processes": count, "period_seconds": period, "spawn_seconds": sleepers.spawn_seconds,
                               "log": log.name, **room}
    try:
        sampled = random.sample(sleepers.pids, min(SAMPLED, len(sleepers.pids)))
        rss = [status_field(pid, "VmRSS") for pid in sampled]
        figures["sleeper_rss_kib_mean"] = statistics.mean(v for v in rss if v is not None)
        figures["mem_available_drop_kib_per_process"] = (available_before - mem_available_kib()) / count
        port = free_port()
        exporter = subprocess.Popen([sys.executable, "-m", "offcpu_exporter", "serve", "--web.listen-address",
                                     f"127.0.0.1:{port}", "--log.level", "warning"], cwd=ROOT,
                                    env={**os.environ, "PYTHONPATH": python_path(ROOT), "PYTHONDONTWRITEBYTECODE": "1"},
                                    stdout=log, stderr=subprocess.STDOUT)
        started = time.monotonic()
        time.sleep(warmup)
        body = settled(exporter, port, log.name)
        figures["warmup_seconds"] = time.monotonic() - started
        views = [self_metrics(body)]
        on_machine = [user_processes() - 1]  # less the exporter, which does not watch itself
        cpu0, t0, sw0 = cpu_seconds(exporter.pid), time.monotonic(), voluntary_switches(sampled)
        due = [t0 + duration * (i + 0.5) / SCRAPES for i in range(SCRAPES)]
        scrapes: list[float] = []
        # The first sample too: RSS still climbing through the window is not a steady state yet.
        figures["rss_window_start_kib"] = largest = status_kib(exporter.pid, "VmRSS")
        while (now := time.monotonic()) - t0 < duration:
            largest = max(largest, status_kib(exporter.pid, "VmRSS"))
            if due and now >= due[0]:
                due.pop(0)
                seconds, body = scrape(port)
                scrapes.append(seconds)
                views.append(self_metrics(body))
                figures["scrape_bytes"] = len(body)
            time.sleep(0.5)
        cpu1, t1, sw1 = cpu_seconds(exporter.pid), time.monotonic(), voluntary_switches(sampled)
        figures.update(vm_hwm_kib=status_kib(exporter.pid, "VmHWM"), rss_anon_kib=status_kib(exporter.pid, "RssAnon"),
                       rss_file_kib=status_kib(exporter.pid, "RssFile"))
        _, body = scrape(port)
        views.append(self_metrics(body))
        on_machine.append(user_processes() - 1)
    finally:
        if exporter is not None:
            figures.update(stop_exporter(exporter))
        log.close()
        figures["sleepers_left_after_stop"] = sleepers.stop()
    deltas = [b - a for a, b in zip(sw0, sw1, strict=True) if a is not None and b is not None]
    window = t1 - t0
    flushes = {v["offcpu_exporter_last_flush_timestamp_seconds"]: v["offcpu_exporter_last_flush_duration_seconds"]
               for v in views if "offcpu_exporter_last_flush_timestamp_seconds" in v}
    first, last = views[0], views[-1]  # the first read is after the warm-up's flushes (settled())
    losses = {k: {"end": v, "window": v - first.get(k, 0.0)} for k, v in last.items()
              if any(w in k.split("{")[0] for w in LOSS_WORDS) and v > 0}
    figures.update(
        window_seconds=window, warmup=warmup, cpu_seconds=cpu1 - cpu0, cpu_percent=100 * (cpu1 - cpu0) / window,
        steady_rss_max_kib=largest, scrapes=scrapes,
        flushes=[{"timestamp": t, "seconds": s} for t, s in sorted(flushes.items())],
        flushes_in_window=(last.get("offcpu_exporter_flushes_total", 0.0)
                           - first.get("offcpu_exporter_flushes_total", 0.0)),
        targets=[v.get("offcpu_exporter_targets") for v in views], processes_on_machine=on_machine,
        unwind_processes=[v.get("offcpu_exporter_unwind_processes") for v in views],
        rate_sampled=len(deltas), rate_achieved=statistics.mean(deltas) * count / window if deltas else 0.0,
        probe_blocks_per_second=(last.get("offcpu_exporter_blocks_total", 0.0)
                                 - first.get("offcpu_exporter_blocks_total", 0.0)) / window,
        losses=losses, log_problems=log_problems(log.name), self_metrics_end=last, context=clock.done(),
    )
    return figures


def size_rows(f: dict[str, Any], rate: float) -> tuple[list[Row], bool]:
    n = f["processes"]
    targets = TARGETS.get(n, {})
    busy = shared(f["context"], ours=1.0)
    watched = int(min((t for t in f["targets"] if t is not None), default=0))
    valid = watched >= n and abs(f["rate_achieved"] - rate) <= 0.1 * rate
    name = f"{n:,} processes"
    rows: list[Row] = []

    def row(measure: str, value: float, fmt: str, key: str, unit: str, spread: str = "", note: str = "") -> None:
        target = targets.get(key)
        rows.append(Row("scale", f"{name}: {measure}", fmt.format(value), spread,
                        "" if target is None else f"<= {target:g}{unit}",
                        None if target is None else valid and value <= target, busy, note))

    row("exporter CPU, % of one core", f["cpu_percent"], "{:.2f}", "cpu", "%",
        note=f"{f['window_seconds']:.0f} s after a {f['warmup_seconds']:.0f} s warm-up ({WARMUP_FLUSHES} flushes "
             f"at least); serve, defaults: every process")
    row("exporter steady RSS (largest VmRSS sampled), MB", f["steady_rss_max_kib"] / 1024, "{:.0f}", "rss", " MB",
        f"{f['rss_window_start_kib'] / 1024:.0f} at start; at end {f['rss_anon_kib'] / 1024:.0f} anon + "
        f"{f['rss_file_kib'] / 1024:.0f} file")
    flush = [x["seconds"] for x in f["flushes"]]  # never empty: the window starts after 2 flushes
    row("flush time (last_flush_duration gauge), s", statistics.median(flush), "{:.3f}", "flush", " s",
        f"{min(flush):.3f}..{max(flush):.3f}", f"median of {len(flush)} distinct flushes seen at the scrapes")
    if f["scrapes"]:
        row("GET /metrics, s", statistics.median(f["scrapes"]), "{:.3f}", "scrape", " s",
            f"{min(f['scrapes']):.3f}..{max(f['scrapes']):.3f}",
            f"median of {len(f['scrapes'])}; body {f.get('scrape_bytes', 0) / 1024:,.0f} KiB uncompressed")
    grew = [f"{k} +{v['window']:g}" for k, v in f["losses"].items() if v["window"] > 0]
    losses = ", ".join(grew) or "no loss counter grew"
    rows.append(Row("scale", f"{name}: processes watched (offcpu_exporter_targets)", f"{watched:,}",
                    " / ".join(f"{t:,.0f}" for t in f["targets"] if t is not None), "", None, busy,
                    f"lowest of {len(f['targets'])} reads; user processes in /proc then: "
                    f"{min(f['processes_on_machine']):,}..{max(f['processes_on_machine']):,}; unwind tables for "
                    f"{f['unwind_processes'][-1] or 0:,.0f} processes; {losses}; "
                    f"{len(f['log_problems'])} log lines at warning or above"))
    rows.append(Row("scale", f"{name}: blocks/s made by the sleepers", f"{f['rate_achieved']:,.0f}", "",
                    f"{rate:,.0f} (+-10%)", None, busy,
                    f"voluntary switches of {f['rate_sampled']} sleepers picked at random, scaled to {n:,}; "
                    f"the probe counted {f['probe_blocks_per_second']:,.0f} blocks/s machine-wide"))
    return rows, valid


def measure(processes: Sequence[int] = PROCESSES, rate: float = RATE, duration: float = 20.0,
            warmup: float = 20.0) -> Result:
    binary = build_c(WORKLOADS / "sleeper.c", extra_flags=["-static"])
    sizes: list[dict[str, Any]] = []
    result = Result("scale", details={"rate": rate, "duration": duration, "warmup": warmup, "sizes": sizes})
    valid: dict[int, bool] = {}
    busy: dict[int, bool] = {}
    for n in processes:
        print(f"   scale: {n:,} processes", file=sys.stderr, flush=True)
        figures = one_size(binary, n, rate, duration, warmup)
        sizes.append(figures)
        rows, valid[n] = size_rows(figures, rate)
        busy[n] = rows[0].shared
        result.rows.extend(rows)
    cpu = {f["processes"]: f["cpu_percent"] for f in sizes}
    for a, b in itertools.pairwise(processes):
        if cpu[a] <= 0:
            continue
        growth = cpu[b] / cpu[a]
        target = GROWTH_TARGET[2] if (a, b) == GROWTH_TARGET[:2] else None
        result.rows.append(Row("scale", f"CPU growth {a:,} -> {b:,} processes", f"{growth:.2f}x",
                               f"{cpu[a]:.2f}% -> {cpu[b]:.2f}%", "" if target is None else f"<= {target:g}x",
                               None if target is None else valid[a] and valid[b] and growth <= target,
                               busy[a] or busy[b], f"{b / a:g}x the processes, same {rate:,.0f} blocks/s"))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", default=",".join(str(n) for n in PROCESSES),
                        help="comma-separated numbers of sleeper processes, measured in this order")
    parser.add_argument("--rate", type=float, default=RATE, help="blocks per second of all sleepers together")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of steady state measured per size")
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds left out after the exporter starts")
    parser.add_argument("--out", help="results as JSON")
    parser.add_argument("--table", help="results as a Markdown table")
    options = parser.parse_args(argv)
    # So that a plain `kill` of this script still runs the clean-up in the finally blocks.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    processes = [int(n) for n in options.processes.split(",")]
    write_outputs([measure(processes, options.rate, options.duration, options.warmup)], options.out, options.table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
