"""Scrape load on /metrics: 50 concurrent clients for 30 s against 2,000 stack series.

    PYTHONPATH=. .venv/bin/python bench/scrape_load.py [--clients 50] [--duration 30] [--processes 200]

Runs the real web server and Prometheus sink in this process on 127.0.0.1 (loopback only), with a
synthetic snapshot replaced every 5 s as the pipeline would, and the clients in separate processes
(so that their Python does not share the server's interpreter lock). Clients keep connections alive
and ask for gzip, as Prometheus does. Bounded: the run stops after --duration seconds or
--max-requests requests, whichever comes first. Reports requests/s and latency percentiles, with the
render cache on and (for the ratio) off. Target: p99 under 100 ms with the cache on.
"""

from __future__ import annotations

import argparse
import http.client
import multiprocessing as mp
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from offcpu_exporter.sinks import SinkContext
from offcpu_exporter.sinks.prometheus.options import PrometheusOptions
from offcpu_exporter.sinks.prometheus.sink import PrometheusSink
from offcpu_exporter.web import Routes
from offcpu_exporter.web.options import WebOptions
from offcpu_exporter.web.server import WebServer
from testkit.snapshots import scrape_snapshot


def client_process(port: int, threads: int, stop_at: float, max_requests: int, out: mp.Queue) -> None:
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    count = [0]

    def worker() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        mine: list[float] = []
        while time.time() < stop_at:
            with lock:
                if count[0] >= max_requests:
                    break
                count[0] += 1
            t0 = time.perf_counter()
            try:
                conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
                r = conn.getresponse()
                r.read()
                ok = r.status == 200
            except (OSError, http.client.HTTPException):
                ok = False
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            mine.append(time.perf_counter() - t0)
            if not ok:
                with lock:
                    errors[0] += 1
        conn.close()
        with lock:
            latencies.extend(mine)

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    out.put((latencies, errors[0]))


def run(label: str, args: argparse.Namespace, cache: bool) -> dict[str, float]:
    current = [scrape_snapshot(1, args.processes, args.stacks)]
    routes = Routes()
    ctx = SinkContext(latest=lambda: current[0], flush_now=lambda t: current[0], routes=routes)
    sink = PrometheusSink(ctx, PrometheusOptions(top_stacks=args.stacks, max_processes=args.processes))
    ctx.sinks.append(sink)
    if not cache:
        # Every scrape renders, as without the cache.
        sink.cache._state = lambda: object()  # type: ignore[method-assign]
    # Without the cache, requests queue (no 503 at a concurrency limit) so that the figures compare.
    limit = args.clients + 10 if cache else 0
    server = WebServer(routes, WebOptions(listen_address="127.0.0.1:0", max_requests=limit))
    server.start()
    stop = threading.Event()

    def flusher() -> None:
        seq = 1
        while not stop.wait(5.0):
            seq += 1
            current[0] = scrape_snapshot(seq, args.processes, args.stacks)

    threading.Thread(target=flusher, daemon=True).start()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("GET", "/metrics")
    body = conn.getresponse().read()
    conn.close()
    stack_series = sum(
        1
        for line in body.splitlines()
        if line.startswith(b"offcpu_stack_seconds_total{") and b'stack_id="other"' not in line
    )
    renders_before = sink.cache.renders
    procs = max(1, min(args.client_processes, args.clients))
    per = [args.clients // procs + (1 if i < args.clients % procs else 0) for i in range(procs)]
    queue: mp.Queue = mp.Queue()
    start = time.time()
    stop_at = start + args.duration
    workers = [
        mp.Process(target=client_process, args=(server.port, n, stop_at, args.max_requests // procs, queue))
        for n in per
    ]
    for w in workers:
        w.start()
    latencies: list[float] = []
    errors = 0
    for _ in workers:
        lat, err = queue.get(timeout=args.duration + 90)
        latencies.extend(lat)
        errors += err
    for w in workers:
        w.join()
    elapsed = time.time() - start
    stop.set()
    server.stop()
    latencies.sort()

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p / 100 * len(latencies)))] * 1000 if latencies else 0.0

    result = {
        "requests": len(latencies),
        "errors": errors,
        "rps": len(latencies) / elapsed,
        "p50_ms": pct(50),
        "p90_ms": pct(90),
        "p99_ms": pct(99),
        "max_ms": latencies[-1] * 1000 if latencies else 0,
        "mean_ms": statistics.fmean(latencies) * 1000 if latencies else 0,
        "renders": sink.cache.renders - renders_before,
        "stack_series": stack_series,
        "body_bytes": len(body),
    }
    print(
        f"{label:>12}: {result['requests']} requests, {errors} errors, {result['rps']:.0f} req/s, "
        f"p50 {result['p50_ms']:.1f} ms, p90 {result['p90_ms']:.1f} ms, p99 {result['p99_ms']:.1f} ms, "
        f"max {result['max_ms']:.1f} ms, {result['renders']} renders "
        f"({stack_series} stack series, {len(body) / 1e6:.2f} MB uncompressed)",
        flush=True,
    )
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--processes", type=int, default=200)
    ap.add_argument("--stacks", type=int, default=10, help="stacks per process (processes x stacks series)")
    ap.add_argument("--client-processes", type=int, default=2)
    ap.add_argument("--max-requests", type=int, default=2_000_000)
    ap.add_argument("--no-compare", action="store_true", help="skip the run without the render cache")
    args = ap.parse_args()
    print(
        f"{args.clients} clients x {args.duration:.0f} s, {args.processes} processes x {args.stacks} stacks, "
        "gzip, keep-alive, loopback",
        flush=True,
    )
    cached = run("cache on", args, cache=True)
    if not args.no_compare:
        uncached = run("cache off", args, cache=False)
        if uncached["p99_ms"] and cached["rps"]:
            print(
                f"{'ratio':>12}: {cached['rps'] / max(uncached['rps'], 1e-9):.1f}x req/s, "
                f"p99 {uncached['p99_ms'] / max(cached['p99_ms'], 1e-9):.1f}x lower with the cache"
            )
    ok = cached["errors"] == 0 and cached["p99_ms"] < 100
    print(f"target p99 < 100 ms with the cache: {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
