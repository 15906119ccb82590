"""Runs every benchmark of bench/ and writes one table.

    PYTHONPATH=. .venv/bin/python bench/run.py --out bench/results.json --table bench/RESULTS.md [--quick]

In order: scheduler overhead, where the probe's time goes (stack_cost), flush cost, steady state,
steady RSS with Kubernetes metadata on and off (metadata_memory), the cost as the node grows to
10,000 processes (scale), then the symbolizer benchmark
(bench/symbols_bench.py) and the /metrics load benchmark
(bench/scrape_load.py) when they are present. Each is bounded in time; the whole run takes about
12 minutes on the 2-core test machine (--quick: about 7), scale about 3 of them. Needs root (BPF), gcc, bpftrace and
perf (scripts/setup --test installs them).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import flush_cost
import metadata_memory
import scale
import sched_overhead
import stack_cost
import steady_state
import unwind_cost
from measure import ROOT, Result, Row, Stopwatch, python_path, shared, write_outputs

HERE = Path(__file__).resolve().parent


def _env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": python_path(tree), "PYTHONDONTWRITEBYTECODE": "1"}


def _find(name: str, peers: Path) -> tuple[Path, Path] | None:
    """(script, the checkout it belongs to): this one first, then the peers tree."""
    for tree in (ROOT, peers):
        if (tree / "bench" / name).exists():
            return tree / "bench" / name, tree
    return None


def symbols(quick: bool, peers: Path = ROOT) -> Result | None:
    found = _find("symbols_bench.py", peers)
    if found is None:
        return None
    script, tree = found
    clock = Stopwatch()
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        args = [sys.executable, str(script), "--out", out.name]
        if quick:
            args += ["--functions", "20000", "--lookups", "2000"]
        subprocess.run(args, cwd=tree, env=_env(tree), check=True, timeout=600, stdout=sys.stderr)
        data = json.loads(Path(out.name).read_text())
    busy = shared(clock.done(), ours=1.0)
    result = Result("symbols", details=data)
    n = data["functions"]
    rows = [
        (f"cold load of {n:,} symbols: s (ours / bcc)", "cold_seconds", "{:.3f}", "< 2 s", "cold_under_2s"),
        ("first-sight lookups/s (ours / bcc)", "first_sight_per_second", "{:,.0f}", "", None),
        ("warm lookups/s (ours / bcc)", "warm_per_second", "{:,.0f}", ">= 1/2 of bcc", "warm_at_least_half_of_bcc"),
        ("kernel warm lookups/s (ours / bcc)", "kernel_warm_per_second", "{:,.0f}", "", None),
    ]
    for label, key, fmt, target, target_key in rows:
        v = data[key]
        result.rows.append(Row("symbols", label, f"{fmt.format(v['ours'])} / {fmt.format(v['bcc'])}",
                               f"ratio {v['ours'] / v['bcc']:.2f}" if v.get("bcc") else "", target,
                               data["targets"][target_key] if target_key else None, busy))
    return result


_SCRAPE = re.compile(r"^\s*(?P<label>cache on|cache off): (?P<requests>\d+) requests, (?P<errors>\d+) errors, "
                     r"(?P<rps>[\d.]+) req/s, p50 (?P<p50>[\d.]+) ms, p90 (?P<p90>[\d.]+) ms, p99 (?P<p99>[\d.]+) ms, "
                     r"max (?P<max>[\d.]+) ms.*?\((?P<series>\d+) stack series", re.M)


def scrape_load(quick: bool, peers: Path = ROOT) -> Result | None:
    found = _find("scrape_load.py", peers)
    if found is None:
        return None
    script, tree = found
    clock = Stopwatch()
    args = [sys.executable, str(script), "--duration", "10" if quick else "20"]
    proc = subprocess.run(args, cwd=tree, env=_env(tree), timeout=600, capture_output=True, text=True)
    sys.stderr.write(proc.stdout)
    busy = shared(clock.done(), ours=2.0)
    result = Result("scrape_load", details={"output": proc.stdout, "returncode": proc.returncode})
    for m in _SCRAPE.finditer(proc.stdout):
        on = m["label"] == "cache on"
        result.rows.append(Row("/metrics load", f"{m['label']}: p99 ms (50 clients, {m['series']} stack series)",
                               m["p99"], f"p50 {m['p50']}, max {m['max']}; {float(m['rps']):.0f} req/s, "
                               f"{m['errors']} errors", "< 100 ms" if on else "",
                               float(m["p99"]) < 100 and m["errors"] == "0" if on else None, busy))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(HERE / "results.json"))
    parser.add_argument("--table", default=str(HERE / "RESULTS.md"))
    parser.add_argument("--quick", action="store_true", help="fewer rounds and shorter runs (about 3 minutes)")
    parser.add_argument("--only",
                        help="comma-separated: sched,stacks,unwind,flush,steady,metadata,scale,symbols,scrape")
    parser.add_argument("--peers-tree", type=Path, default=ROOT, metavar="DIR",
                        help="where symbols_bench.py or scrape_load.py are not in this checkout, take them (and "
                             "the code they test) from this one, e.g. a `git worktree` of their branch")
    options = parser.parse_args(argv)
    only = set(options.only.split(",")) if options.only else {"sched", "stacks", "unwind", "flush", "steady",
                                                                      "metadata", "scale", "symbols", "scrape"}
    q = options.quick
    results: list[Result] = []
    started = time.monotonic()
    steps = [
        ("sched", lambda: sched_overhead.measure(rounds=3 if q else 5, round_trips=100_000 if q else 150_000,
                                                 depth=16, cpu=sched_overhead.default_cpu(),
                                                 program_runs=1 if q else 2)),
        ("stacks", lambda: stack_cost.measure(runs=1 if q else 2, round_trips=50_000)),
        ("unwind", lambda: unwind_cost.measure(seconds=2.0 if q else 3.0)),
        ("flush", lambda: flush_cost.measure([100, 1000, 10000], flushes=3 if q else 5, interval=2.0, profile=False,
                                             rate=10_000)),
        ("steady", lambda: steady_state.measure(duration=20 if q else 60, warmup=12, rate=100_000, stacks=1000)),
        ("metadata", lambda: metadata_memory.measure(pods=110, duration=20 if q else 30, warmup=30 if q else 60)),
        ("scale", lambda: scale.measure(scale.PROCESSES, rate=scale.RATE, duration=10 if q else 20,
                                        warmup=15 if q else 20)),
        ("symbols", lambda: symbols(q, options.peers_tree)),
        ("scrape", lambda: scrape_load(q, options.peers_tree)),
    ]
    for name, step in steps:
        if name not in only:
            continue
        print(f"== {name} ({time.monotonic() - started:.0f} s so far)", file=sys.stderr, flush=True)
        result = step()
        if result is None:
            print(f"   {name}: not present on this branch, skipped", file=sys.stderr)
            continue
        results.append(result)
        # Written after each step: an interrupted run keeps what it measured.
        write_outputs(results, options.out, options.table, echo=False)
    write_outputs(results, options.out, options.table)
    print(f"done in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
