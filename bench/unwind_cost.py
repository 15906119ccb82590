"""What the DWARF unwinder (bpf/unwind.h) costs, beside bpf_get_stack() with frame
pointers, in one run:

- ns per captured user stack: both are called on the same switch-outs by the test harness
  (testkit/unwind_harness.py, the probe's hook) and timed with bpf_ktime_get_ns() around each;
  on a frame-pointer workload with tables (both walk the whole stack), the same without tables
  (both walk frame pointers), and on code built with -O2 -fomit-frame-pointer (the unwinder walks
  the whole stack, frame pointers stop after a frame or two);
- table build time for Debian's libc.so.6 and python3.11: cold (CFI parsed), from the in-memory
  cache, from the disk cache.

    PYTHONPATH=. .venv/bin/python bench/unwind_cost.py [--seconds 3] [--out F.json] [--table F.md]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import WORKLOADS, Result, Row, Stopwatch, build_c, shared, summary, write_outputs

from offcpu_exporter.unwind import TableCache
from offcpu_exporter.unwind.objects import object_info, object_table
from testkit.unwind_harness import Capture, Harness

OBJECTS = ("/lib/x86_64-linux-gnu/libc.so.6", "/usr/bin/python3.11")
TARGET = Path(__file__).resolve().parents[1] / "tests" / "e2e" / "unwind" / "unwind_target.c"


def table_build(path: str, repeats: int = 3) -> dict[str, Any]:
    cold, memory, disk = [], [], []
    rows = 0
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeats):
            t0 = time.perf_counter()
            info = object_info(path)
            table = object_table(path, info, path, "/", [])
            cold.append(time.perf_counter() - t0)
            rows = table.row_count
            cache = TableCache(tmp)
            cache.put(info.build_id, table)
            t0 = time.perf_counter()
            cache.get(info.build_id)
            memory.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            object_info(path)  # the build id is read from the file on every lookup
            TableCache(tmp).get(info.build_id)
            disk.append(time.perf_counter() - t0)
    return {"rows": rows, "bytes": len(table.rows) + len(table.pages), "cold_s": summary(cold),
            "memory_s": summary(memory), "disk_s": summary(disk)}


def captures_of(harness: Harness, argv: list[str], seconds: float, tables: bool, go: bool = False) -> list[Capture]:
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdout.readline()  # "ready ..."
        harness.watch(proc.pid, tables=tables)
        harness.collect(0.2)  # drop what was captured while the tables were written
        if go:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        captures = [c for c in harness.collect(seconds) if c.tgid == proc.pid]
        harness.unwatch(proc.pid)
        return captures
    finally:
        proc.kill()
        proc.wait()


def stack_cost(harness: Harness, seconds: float) -> dict[str, dict[str, Any]]:
    pingpong = build_c(WORKLOADS / "pingpong.c")
    omit = build_c(TARGET, "unwind_target_omitfp", ("-O2", "-fomit-frame-pointer"))
    runs = {
        "frame-pointer workload (pingpong depth 16), with tables":
            ([str(pingpong), "--round-trips", "100000000", "--depth", "16", "--wait-go"], True, True),
        "frame-pointer workload (pingpong depth 16), no tables (frame-pointer walk)":
            ([str(pingpong), "--round-trips", "100000000", "--depth", "16", "--wait-go"], False, True),
        "-O2 -fomit-frame-pointer workload (4 threads, 8-13 frames), with tables":
            ([str(omit)], True, False),
    }
    out: dict[str, dict[str, Any]] = {}
    for name, (argv, tables, go) in runs.items():
        caps = captures_of(harness, argv, seconds, tables, go)
        out[name] = {
            "captures": len(caps),
            "unwind_ns": summary([c.unwind_ns for c in caps]),
            "fp_ns": summary([c.fp_ns for c in caps]),
            "unwind_frames": statistics.median(len(c.frames) for c in caps) if caps else 0,
            "fp_frames": statistics.median(len(c.fp_frames) for c in caps) if caps else 0,
            "root": sum(c.end == "root" for c in caps) / max(1, len(caps)),
        }
        print(f"{name}: {out[name]['unwind_ns']['median']:.0f} ns ({out[name]['unwind_frames']} frames) vs "
              f"bpf_get_stack {out[name]['fp_ns']['median']:.0f} ns ({out[name]['fp_frames']} frames)",
              file=sys.stderr)
    return out


def measure(seconds: float) -> Result:
    clock = Stopwatch()
    builds = {path: table_build(path) for path in OBJECTS}
    with Harness() as harness:
        hook = harness.hook
        stacks = stack_cost(harness, seconds)
    busy = shared(clock.done(), ours=1.0)
    result = Result("unwind_cost", details={"hook": hook, "tables": builds, "stacks": stacks})
    for name, s in stacks.items():
        u, f = s["unwind_ns"], s["fp_ns"]
        result.rows.append(Row(
            "unwind cost", f"ns per user stack, DWARF unwinder | bpf_get_stack: {name}",
            f"{u['median']:.0f} \\| {f['median']:.0f}",
            f"{u['q1']:.0f}..{u['q3']:.0f} \\| {f['q1']:.0f}..{f['q3']:.0f}",
            shared=busy,
            note=f"{s['captures']} stacks; frames {s['unwind_frames']:.0f} \\| {s['fp_frames']:.0f}; "
                 f"{u['median'] / max(1, s['unwind_frames']):.0f} ns per unwound frame; "
                 f"{s['root']:.0%} reach the root; {hook}"))
    for path, b in builds.items():
        result.rows.append(Row(
            "unwind tables", f"build time, s, cold | memory cache | disk cache: {Path(path).name}",
            f"{b['cold_s']['median']:.2f} \\| {b['memory_s']['median'] * 1e6:.0f} us \\| "
            f"{b['disk_s']['median'] * 1e3:.1f} ms",
            f"{b['cold_s']['min']:.2f}..{b['cold_s']['max']:.2f}", shared=busy,
            note=f"{b['rows']:,} rows, {b['bytes'] / 1024:.0f} KiB in the maps"))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0, help="capture time per workload")
    parser.add_argument("--out", help="results as JSON")
    parser.add_argument("--table", help="results as a Markdown table")
    options = parser.parse_args(argv)
    write_outputs([measure(options.seconds)], options.out, options.table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
