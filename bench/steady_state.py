"""The exporter's own cost at steady state: CPU seconds per second and peak RSS of the exporter
process while a workload makes ~100,000 context switches/s across ~1,000 distinct stacks.

    PYTHONPATH=. .venv/bin/python bench/steady_state.py [--duration 60] [--rate 100000] [--stacks 1000] [--otlp]

The workload is bench/flush_cost.py's generated program (one user stack per number k, a pipe round
trip with an echo thread at the bottom), both threads pinned to CPU 0 and paced to --rate
switches/s (unpinned, a cross-CPU pipe round trip tops out near 30,000 switches/s on a 2-vCPU VM).
The exporter runs as its
own process, as deployed: `offcpu-exporter serve` with its defaults (every process on the machine,
stack sampling on), scraped every 15 s by this script. With --otlp, `serve` also pushes profiles and
metrics (default interval) to the project's gRPC test receiver in this process. CPU is utime+stime
from /proc/PID/stat over the steady window (after --warmup seconds:
start-up compiles the BPF program and loads symbols); RSS is the largest VmRSS sampled every 0.5 s
over the same window. The start-up peak, VmHWM (bcc compiles the probe with clang and LLVM inside
the process, and gives that memory back afterwards), is reported beside it.
Targets (issue 17): < 3% of one core at 100,000+ switches/s, steady RSS < 100 MB.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from flush_cost import generate_source
from measure import (
    ROOT,
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

SCRAPE_INTERVAL = 15.0


def switches(pid: int) -> int:
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            for line in (task / "status").read_text().splitlines():
                if "ctxt_switches:" in line:
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def otlp_receiver() -> Any:
    """The project's OTLP gRPC test receiver (real grpc server on loopback), when the OTLP sink
    and its test support are installed; None otherwise."""
    if importlib.util.find_spec("offcpu_exporter.sinks.otlp") is None:
        return None
    try:
        from testkit.otlp_receivers import GrpcReceiver
    except ImportError:
        return None
    return GrpcReceiver().start()


def measure(duration: float, warmup: float, rate: float, stacks: int, otlp: bool = False) -> Result:
    binary = build_c(generate_source(stacks), name=f"many_stacks_{stacks}")
    serve = importlib.util.find_spec("offcpu_exporter.web.server") is not None
    receiver = otlp_receiver() if serve and otlp else None
    clock = Stopwatch()
    workload = subprocess.Popen([str(binary), str(rate / 2), "pin"], stdout=subprocess.PIPE, text=True)
    assert workload.stdout is not None
    workload.stdout.readline()
    env = {**os.environ, "PYTHONPATH": python_path(ROOT)}
    port = free_port()
    if serve:
        args = ["serve", "--web.listen-address", f"127.0.0.1:{port}"]  # the default: every process
        if receiver is not None:
            # OTLP profiles and metrics pushed to a gRPC receiver in this process, at the default interval.
            args += ["--otlp.endpoint", receiver.endpoint]
    else:
        args = ["record", "--pid", str(workload.pid), "--duration", str(warmup + duration + 30), "-o", os.devnull]
    log = tempfile.NamedTemporaryFile("w+", prefix="offcpu-steady-", suffix=".log", delete=False)  # noqa: SIM115
    exporter = subprocess.Popen([sys.executable, "-m", "offcpu_exporter", *args, "--log.level", "warning"], cwd=ROOT,
                                env=env, stdout=log, stderr=subprocess.STDOUT)
    scrapes: list[float] = []
    scrape_bytes = 0
    try:
        time.sleep(warmup)
        if exporter.poll() is not None:
            raise RuntimeError(f"exporter exited with {exporter.returncode}: {Path(log.name).read_text()}")
        cpu0, t0, sw0 = cpu_seconds(exporter.pid), time.monotonic(), switches(workload.pid)
        next_scrape = t0
        steady_rss = 0
        while time.monotonic() - t0 < duration:
            steady_rss = max(steady_rss, status_kib(exporter.pid, "VmRSS"))
            if serve and time.monotonic() >= next_scrape:
                s0 = time.perf_counter()
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
                    scrape_bytes = len(r.read())
                scrapes.append(time.perf_counter() - s0)
                next_scrape += SCRAPE_INTERVAL
            time.sleep(0.5)
        cpu1, t1, sw1 = cpu_seconds(exporter.pid), time.monotonic(), switches(workload.pid)
        hwm = status_kib(exporter.pid, "VmHWM")
        rss = status_kib(exporter.pid, "VmRSS")
        rss_anon = status_kib(exporter.pid, "RssAnon")
        rss_file = status_kib(exporter.pid, "RssFile")
    finally:
        stop_exporter(exporter)
        workload.kill()
        workload.wait()
        log.close()
        if receiver is not None:
            receiver.stop()
    context = clock.done()
    busy = shared(context, ours=1.5)
    cores = (cpu1 - cpu0) / (t1 - t0)
    rate_seen = (sw1 - sw0) / (t1 - t0)
    how = "serve (defaults: every process), /metrics scraped every 15 s" if serve else "record (no HTTP, no OTLP)"
    pushes: dict[str, int] | None = None
    if receiver is not None:
        pushes = {"profiles": len(receiver.received.profiles), "metrics": len(receiver.received.metrics)}
        how += f", OTLP gRPC pushes on ({pushes['profiles']} profile + {pushes['metrics']} metric requests)"
    details: dict[str, Any] = {
        "mode": how, "duration": t1 - t0, "warmup": warmup, "cpu_seconds": cpu1 - cpu0,
        "cpu_per_second": cores, "switches_per_second": rate_seen, "stacks": stacks,
        "vm_hwm_kib": hwm, "vm_rss_kib": rss, "steady_rss_max_kib": steady_rss,
        "rss_anon_kib": rss_anon, "rss_file_kib": rss_file,
        "scrapes": scrapes, "otlp": pushes, "scrape_bytes": scrape_bytes, "context": context,
    }
    note = f"{rate_seen:,.0f} switches/s, {stacks:,} stacks, {t1 - t0:.0f} s; {how}"
    result = Result("steady_state", details=details)
    result.rows.append(Row("steady state", "exporter CPU: % of one core", f"{cores * 100:.2f}", "", "< 3%",
                           cores < 0.03 and rate_seen >= 100_000, busy, note))
    result.rows.append(Row("steady state", "exporter RSS at steady state (largest VmRSS sampled): MB",
                           f"{steady_rss / 1024:.0f}", f"at end {rss / 1024:.0f}", "< 100 MB",
                           steady_rss / 1024 < 100, busy,
                           f"at end: {rss_anon / 1024:.0f} MB anonymous, {rss_file / 1024:.0f} MB file-backed"))
    result.rows.append(Row("steady state", "exporter start-up peak RSS (VmHWM): MB", f"{hwm / 1024:.0f}", "", "",
                           None, busy, "bcc's in-process clang/LLVM compile of the probe; given back after"))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of steady state measured")
    parser.add_argument("--warmup", type=float, default=12.0, help="seconds left out at the start")
    parser.add_argument("--rate", type=float, default=100_000, help="workload context switches per second")
    parser.add_argument("--stacks", type=int, default=1000)
    parser.add_argument("--otlp", action="store_true", help="also push OTLP to a loopback receiver")
    parser.add_argument("--out", help="results as JSON")
    parser.add_argument("--table", help="results as a Markdown table")
    options = parser.parse_args(argv)
    result = measure(options.duration, options.warmup, options.rate, options.stacks, options.otlp)
    write_outputs([result], options.out, options.table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
