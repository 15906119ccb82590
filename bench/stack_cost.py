"""Where the probe's time per context switch goes: the BPF program's own run time with both stack
captures at every switch (--stack-sampling off), without the user one, without the kernel one,
without either, and with the default stack sampling.

    PYTHONPATH=. .venv/bin/python bench/stack_cost.py [--runs 2] [--round-trips 50000]

A diagnostic for bench/sched_overhead.py: the same pinned ping-pong workload, the probe compiled
from bpf/offcpu.bpf.c with the stack captures replaced by a lost stack (-EFAULT) in the
variants, in the attach mode `auto` picks. Run time per invocation comes from the kernel's BPF
statistics (kernel.bpf_stats_enabled), CPU time per switch from the workload.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import WORKLOADS, Result, Row, Stopwatch, build_c, shared, summary, write_outputs
from sched_overhead import bpf_stats, default_cpu, prog_stats, run_once

_USER = re.compile(r"= capture_user_stack\(ctx\)")
_KERNEL = re.compile(r"= capture_kernel_stack\(ctx\)")
_LOST = "= OFFCPU_STACK_ERRNO_BASE + 14 /* EFAULT */"
# name -> (drop the user stack, drop the kernel stack, stack sampling)
VARIANTS = {
    "both stacks, every switch (--stack-sampling off)": (False, False, False),
    "no user stack": (True, False, False),
    "no kernel stack": (False, True, False),
    "no stacks": (True, True, False),
    "stack sampling on (the default)": (False, False, True),
}


@contextlib.contextmanager
def probe_source(drop_user: bool, drop_kernel: bool) -> Iterator[None]:
    """Point the loader at a copy of bpf/ whose stack captures are removed."""
    from offcpu_exporter.probe import layout

    original = layout.BPF_DIR
    with tempfile.TemporaryDirectory() as tmp:
        for f in original.iterdir():
            if f.is_file():
                shutil.copy(f, tmp)
        source = Path(tmp, layout.SOURCE)
        text = source.read_text()
        if drop_user:
            text = _USER.sub(_LOST, text)
        if drop_kernel:
            text = _KERNEL.sub(_LOST, text)
        source.write_text(text)
        layout.BPF_DIR = Path(tmp)
        try:
            yield
        finally:
            layout.BPF_DIR = original


def measure(runs: int, round_trips: int, depth: int = 16, cpu: int | None = None) -> Result:
    from offcpu_exporter.probe.loader import Probe, ProbeConfig

    cpu = default_cpu() if cpu is None else cpu
    binary = build_c(WORKLOADS / "pingpong.c")
    clock = Stopwatch()
    affinity = os.sched_getaffinity(0)
    os.sched_setaffinity(0, sorted(set(range(os.cpu_count() or 1)) - {cpu}) or [cpu])
    figures: dict[str, dict[str, Any]] = {}
    mode = ""
    try:
        with bpf_stats():
            for name, (drop_user, drop_kernel, sampling) in VARIANTS.items():
                with probe_source(drop_user, drop_kernel):
                    probe = Probe(ProbeConfig(attach=os.environ.get("OFFCPU_ATTACH", "auto"), stack_sampling=sampling))
                    probe.start()
                mode = probe.mode
                per_run: list[float] = []
                per_switch: list[float] = []

                @contextlib.contextmanager
                def watching(pid: int, probe: Probe = probe,
                             per_run: list[float] = per_run) -> Iterator[dict[str, Any]]:
                    probe.set_target(pid, 1)
                    c0, n0 = prog_stats(os.getpid())
                    yield {}
                    c1, n1 = prog_stats(os.getpid())
                    per_run.append((n1 - n0) / max(1, c1 - c0))

                try:
                    for _ in range(runs):
                        per_switch.append(run_once(binary, cpu, round_trips, depth, watching)["ns_per_switch"])
                finally:
                    probe.close()
                figures[name] = {"bpf_ns_per_run": summary(per_run), "cpu_ns_per_switch": summary(per_switch)}
                print(f"{name:>26}: {figures[name]['bpf_ns_per_run']['median']:7.0f} ns per run, "
                      f"{figures[name]['cpu_ns_per_switch']['median']:7.0f} CPU ns per switch", file=sys.stderr)
    finally:
        os.sched_setaffinity(0, affinity)
    busy = shared(clock.done(), ours=1.0)
    result = Result("stack_cost", details={"mode": mode, "runs": runs, "round_trips": round_trips, "depth": depth,
                                           "variants": figures})
    full = figures["both stacks, every switch (--stack-sampling off)"]["bpf_ns_per_run"]["median"]
    for name, f in figures.items():
        s = f["bpf_ns_per_run"]
        result.rows.append(Row("stack cost", f"BPF program ns per run, {name}", f"{s['median']:.0f}",
                               f"{s['min']:.0f}..{s['max']:.0f}", shared=busy,
                               note=f"{s['median'] / full:.0%} of every-switch; {mode}; user stack {depth}+ frames"))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--round-trips", type=int, default=50_000)
    parser.add_argument("--out", help="results as JSON")
    parser.add_argument("--table", help="results as a Markdown table")
    options = parser.parse_args(argv)
    write_outputs([measure(options.runs, options.round_trips)], options.out, options.table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
