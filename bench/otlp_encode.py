"""Cost of one OTLP profiles request: encode time, wire size, gzip size, for a flush of N stacks.

    PYTHONPATH=. .venv/bin/python bench/otlp_encode.py [--processes 50] [--stacks 40] [--depth 24]

A synthetic snapshot as the aggregator would produce it: every process has `--stacks` distinct
stacks of `--depth` frames (kernel half shared, user half sharing libc frames), each changed in the
interval. Reports the median of --repeat runs, with the switches profile on and off side by side
(the ratio shows what the second Profile costs: only samples, the dictionary is shared), for
stacks with distinct frames (worst case) and with shared frames (typical). Target: under 100 us
per stack with shared frames, i.e. 0.2 s of the sink's own thread (never the pipeline's) per 5 s flush of 2,000
stacks.
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from offcpu_exporter.formats.otlp_profiles import EncodeOptions, encode_profiles
from offcpu_exporter.snapshot import Snapshot
from testkit.snapshots import many_process_snapshot


def measure(snapshot: Snapshot, options: EncodeOptions, repeat: int) -> tuple[float, int, int]:
    times = []
    body = b""
    for _ in range(repeat):
        t0 = time.perf_counter()
        request = encode_profiles(snapshot, options)
        assert request is not None
        body = request.SerializeToString()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), len(body), len(gzip.compress(body, compresslevel=6))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--processes", type=int, default=50)
    ap.add_argument("--stacks", type=int, default=40)
    ap.add_argument("--depth", type=int, default=24)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    n = args.processes * args.stacks
    print(f"{n} stacks ({args.processes} processes x {args.stacks}), {args.depth} frames each")
    worst = 0.0
    for shared in (False, True):
        snap = many_process_snapshot(args.processes, args.stacks, args.depth, shared)
        print("  frames shared between stacks (typical)" if shared else "  every frame distinct (worst case)")
        rows = []
        for label, switches in (("off_cpu only", False), ("off_cpu + off_cpu_switches", True)):
            options = EncodeOptions(host_name="bench", switches_profile=switches)
            seconds, raw, packed = measure(snap, options, args.repeat)
            rows.append((seconds, raw, packed))
            if shared:
                worst = max(worst, seconds / n)
            print(
                f"    {label:28s} {seconds * 1e3:7.1f} ms  ({seconds / n * 1e6:5.1f} us/stack)"
                f"  {raw / 1024:8.1f} KiB  gzip {packed / 1024:7.1f} KiB"
            )
        (t0, b0, g0), (t1, b1, g1) = rows
        print(f"    with/without the switches profile: time {t1 / t0:.2f}x, bytes {b1 / b0:.2f}x, gzip {g1 / g0:.2f}x")
    print(
        f"  target: < 100 us per stack (0.2 s of the sink's thread per 5 s flush of 2,000 stacks): "
        f"{'ok' if worst < 100e-6 else 'SLOW'} ({worst * 1e6:.0f} us)"
    )


if __name__ == "__main__":
    main()
