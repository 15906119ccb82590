"""Loads bpf/offcpu.bpf.c with bcc in one attach mode and checks it against a known workload.

A child process sleeps N times for a fixed time and reports how long its sleeps took (measured
around each clock_nanosleep with CLOCK_MONOTONIC, the clock bpf_ktime_get_ns reads). The check
passes when the probe counted exactly those sleeps under a do_nanosleep kernel stack, with the
reason "sleeping" (in kprobe mode read from task_struct::__state, so it needs headers that match
the running kernel) and an off-CPU total just under the child's own measurement.

It uses bcc directly, not the exporter, so that the kernel matrix (tests/kernels/matrix.sh) can
show that the probe source itself attaches and counts on a kernel, and so that its runner test can
break the attach on purpose (--symbol-regex). Exit status 0: passed; 1: a check failed; 2: the
probe could not be loaded or attached.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from offcpu_exporter.probe import layout
from offcpu_exporter.probe.loader import ProbeConfig

SOURCE = layout.BPF_DIR / layout.SOURCE
# bcc offcputime's pattern: gcc may emit finish_task_switch as a .isra/.constprop clone.
DEFAULT_SYMBOL_REGEX = r"^finish_task_switch(\.isra\.\d+|\.constprop\.\d+)*$"
REASON_SLEEPING = 1  # OFFCPU_REASON_SLEEPING in bpf/offcpu.h

CHILD = r"""
import sys, time
n, ms = int(sys.argv[1]), int(sys.argv[2])
sys.stdin.readline()
total = 0
for _ in range(n):
    t0 = time.monotonic_ns()
    time.sleep(ms / 1000)
    total += time.monotonic_ns() - t0
print(total, flush=True)
"""


class CheckFailed(Exception):
    pass


class AttachFailed(Exception):
    pass


@dataclass(frozen=True)
class Result:
    mode: str
    hooked: tuple[str, ...]
    compile_s: float
    sleeps: int
    sleeping_sleeps: int
    kernel_ns: int
    measured_ns: int


def kprobes_available() -> bool:
    tracefs = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
    return any(Path(d, "kprobe_events").exists() for d in tracefs)


def choose_mode(attach: str) -> str:
    if attach != "auto":
        return attach
    return "kprobe" if kprobes_available() else "tracepoint"


# The exporter's own defines (map sizes, sampling), from its configuration type only: the check
# loads the source with bcc itself, not through the exporter's loader. Every block's stacks.
CONFIG = ProbeConfig(max_targets=1024, max_threads=4096, max_counts=4096, stack_storage=4096, max_hist=4096,
                     stack_sampling=False)


def kernel_frames(bpf: Any, stack_id: int) -> list[bytes]:
    """A kernel stack's symbols (stack ids are hashes of the frames, keys of the `stacks` map)."""
    stacks = bpf[layout.MAP_STACKS.encode()]
    try:
        trace = stacks[stacks.Key(stack_id)]
    except KeyError:
        return []
    return [bpf.ksym(addr) for addr in trace.ips if addr]


def run(mode: str, symbol_regex: str, sleeps: int, sleep_ms: int) -> Result:
    from bcc import BPF

    hooked: tuple[str, ...] = ("sched:sched_switch",)
    t0 = time.monotonic()
    try:
        bpf = BPF(text=SOURCE.read_bytes(), cflags=CONFIG.cflags(mode))
    except Exception as e:  # bcc raises a bare Exception carrying the compiler's message
        raise AttachFailed(f"compile/load failed: {e}") from e
    compile_s = time.monotonic() - t0
    try:
        if mode == "kprobe":
            # bcc raises when no function matching the regex could be attached (or none matches).
            try:
                bpf.attach_kprobe(event_re=symbol_regex.encode(), fn_name=b"offcpu_finish_task_switch")
                hooked = tuple(sorted(s.decode() for s in BPF.get_kprobe_functions(symbol_regex.encode())))
            except Exception as e:
                raise AttachFailed(f"kprobe attach on /{symbol_regex}/ failed: {e}") from e
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(sleeps), str(sleep_ms)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        assert child.stdin is not None and child.stdout is not None
        targets = bpf["targets"]
        targets[targets.Key(child.pid)] = targets.Leaf(1)
        child.stdin.write("go\n")
        child.stdin.flush()
        measured_ns = int(child.stdout.readline() or "0")
        child.wait(timeout=60)
        if measured_ns <= 0:
            raise CheckFailed("the workload did not report its sleep time")

        count = sleeping = 0
        kernel_ns = 0
        for key, value in bpf["counts"].items():
            if key.tgid != child.pid or key.kernel_stack < layout.STACK_RESERVED:
                continue
            frames = kernel_frames(bpf, key.kernel_stack)
            if b"do_nanosleep" not in frames:
                continue
            count += value.count
            kernel_ns += value.ns
            if key.reason == REASON_SLEEPING:
                sleeping += value.count
        return Result(mode, hooked, compile_s, count, sleeping, kernel_ns, measured_ns)
    finally:
        bpf.cleanup()


def check(result: Result, sleeps: int, min_ratio: float) -> list[str]:
    problems = []
    # One switch-out per nanosleep; a spurious extra wakeup is possible but rare.
    if not sleeps <= result.sleeps <= sleeps + 2:
        problems.append(f"{result.sleeps} switches under do_nanosleep, expected {sleeps}")
    if result.sleeping_sleeps < sleeps:
        problems.append(f"only {result.sleeping_sleeps} of them with reason sleeping, expected {sleeps}")
    # The child's clock brackets each off-CPU interval, so the kernel's total is just under it.
    ratio = result.kernel_ns / result.measured_ns
    if not min_ratio <= ratio <= 1.0:
        problems.append(
            f"off-CPU {result.kernel_ns / 1e9:.4f} s vs measured {result.measured_ns / 1e9:.4f} s "
            f"(ratio {ratio:.4f}, expected {min_ratio}..1)"
        )
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attach", choices=("auto", "kprobe", "tracepoint"),
                        default=os.environ.get("OFFCPU_ATTACH", "auto"),
                        help="attach mode (default: $OFFCPU_ATTACH or auto)")
    parser.add_argument("--symbol-regex", default=DEFAULT_SYMBOL_REGEX,
                        help="kernel functions to kprobe (default: %(default)s)")
    parser.add_argument("--sleeps", type=int, default=20)
    parser.add_argument("--sleep-ms", type=int, default=50)
    # Under emulation (OFFCPU_GUEST_KERNEL is set by tests/kernels/run.sh) the on-CPU part of each
    # measured sleep is ~25x longer and the vCPU threads compete with the host for the CPU.
    default_ratio = 0.90 if os.environ.get("OFFCPU_GUEST_KERNEL") else 0.97
    parser.add_argument("--min-ratio", type=float, default=default_ratio,
                        help="lowest accepted off-CPU/measured ratio (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        re.compile(args.symbol_regex)
    except re.error as e:
        parser.error(f"--symbol-regex: {e}")

    mode = choose_mode(args.attach)
    try:
        result = run(mode, args.symbol_regex, args.sleeps, args.sleep_ms)
    except AttachFailed as e:
        print(f"probe_check: {os.uname().release} / {mode}: FAILED to attach: {e}", file=sys.stderr)
        return 2
    except CheckFailed as e:
        print(f"probe_check: {os.uname().release} / {mode}: FAILED: {e}", file=sys.stderr)
        return 1
    problems = check(result, args.sleeps, args.min_ratio)
    print(
        f"probe_check: {os.uname().release} / {mode}: hooked {','.join(result.hooked)}; "
        f"compile+load {result.compile_s:.1f} s; {result.sleeps} sleeps ({result.sleeping_sleeps} sleeping), "
        f"off-CPU {result.kernel_ns / 1e9:.4f} s of {result.measured_ns / 1e9:.4f} s measured "
        f"(ratio {result.kernel_ns / result.measured_ns:.4f}): {'FAILED' if problems else 'ok'}"
    )
    for p in problems:
        print(f"probe_check:   {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
