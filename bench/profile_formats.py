"""Cost of the profile outputs on a large host: building a Profile from the snapshot history and
encoding it in each format.

    PYTHONPATH=. .venv/bin/python bench/profile_formats.py [--processes 200] [--stacks 50] [--depth 30]
                                                           [--snapshots 180]

Synthetic snapshots: processes x stacks rows, frames `depth` deep, libc and kernel frames and
the outer half of each process's frames shared, as on a real host; every row grows in every
snapshot (the worst case). --snapshots is the history /flamegraph sums (180 = 15 minutes at the
default 5 s flush). Reports seconds per operation and output size, each with its ratio to the
cheapest (folded) encoding, and `Profile.over` (sum of increases, what /flamegraph and the pprof
endpoint do) beside `Profile.between` (two snapshots' difference). Target: a 15-minute flame
graph of 10,000 stacks in under 5 s on a 2-core machine (it runs on a web server thread, never
on the pipeline's).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from offcpu_exporter.formats import Profile, render
from offcpu_exporter.history import History
from testkit.snapshots import snapshot_history


def timed(fn: Callable[[], object], repeat: int = 3) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, default=200)
    parser.add_argument("--stacks", type=int, default=50)
    parser.add_argument("--depth", type=int, default=30)
    parser.add_argument("--snapshots", type=int, default=180)
    args = parser.parse_args()
    snaps = snapshot_history(args.processes, args.stacks, args.depth, args.snapshots)
    rows = len(snaps[-1].samples)
    print(
        f"{args.processes} processes x {args.stacks} stacks = {rows} rows, depth {args.depth}, {len(snaps)} snapshots"
    )

    # As the exporter keeps them: each flush's changes, older ones summed into one-minute buckets.
    history = History(args.snapshots * 5.0 + 5.0)
    start = time.perf_counter()
    for snapshot in snaps:
        history.add(snapshot)
    t_add = (time.perf_counter() - start) / len(snaps)
    kept = history.since(0)
    t_between, _ = timed(lambda: Profile.between(snaps[0], snaps[-1]))
    t_over, profile = timed(lambda: Profile.over(kept), repeat=1)
    assert isinstance(profile, Profile)
    print(f"history: {len(kept)} entries kept, {t_add * 1e3:.1f} ms per flush to add (the pipeline's thread)")
    print(f"{'build':<24}{'seconds':>10}{'ratio':>8}")
    print(f"{'Profile.between':<24}{t_between:>10.3f}{1.0:>8.2f}")
    print(f"{'Profile.over (history)':<24}{t_over:>10.3f}{t_over / t_between:>8.2f}")

    results = {}
    for fmt in ("folded", "text", "pprof", "html"):
        seconds, data = timed(partial(render, fmt, profile))
        assert isinstance(data, bytes)
        results[fmt] = (seconds, len(data))
    base_t, base_size = results["folded"]
    print(f"\n{'encode':<24}{'seconds':>10}{'ratio':>8}{'bytes':>12}{'ratio':>8}")
    for fmt, (seconds, size) in results.items():
        print(f"{fmt:<24}{seconds:>10.3f}{seconds / base_t:>8.2f}{size:>12}{size / base_size:>8.2f}")
    total = t_over + results["html"][0]
    print(f"\n/flamegraph end to end (over + html): {total:.3f} s (target < 5 s)")
    small = replace(profile, samples=profile.samples[:1])
    assert render("pprof", small)
    return 0


if __name__ == "__main__":
    sys.exit(main())
