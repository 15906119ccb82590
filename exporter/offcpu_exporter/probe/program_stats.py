"""What the kernel keeps about each of the probe's BPF programs: its runs, their time, and the runs
it skipped.

The kernel skips a run of a kprobe or perf-event tracepoint program on a CPU while that CPU's
`bpf_prog_active` guard is held: by a BPF map system call of any BPF user (and by another such
program), so that a program cannot recurse into a map it is updating. A skipped run of the switch
hook is a switch the probe never saw. On PREEMPT_RT kernels map system calls can be preempted while
they hold the guard, so every switch on that CPU meanwhile is skipped. The raw tracepoint keeps a
guard of its own per program. Each skip is counted per program (`recursion_misses`, since 5.12:
kernel/bpf/syscall.c, bpf_prog_show_fdinfo()), whether or not the kernel times the programs.
"""

from __future__ import annotations

from collections.abc import Iterable

from offcpu_exporter.probe.maps import ProgramRuns

__all__ = ["parse_fdinfo", "read_program_runs"]


def parse_fdinfo(text: str) -> dict[str, int]:
    """The numeric fields of a /proc/PID/fdinfo/FD file ("name:\\tvalue" lines)."""
    fields = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        try:
            fields[name] = int(value.strip())
        except ValueError:
            continue
    return fields


def read_program_runs(fds: Iterable[int], fdinfo: str = "/proc/self/fdinfo") -> ProgramRuns:
    """The sums over these program fds of this process (one closed meanwhile is left out)."""
    ns = runs = skipped = 0
    for fd in fds:
        try:
            with open(f"{fdinfo}/{fd}", encoding="ascii") as f:
                fields = parse_fdinfo(f.read())
        except OSError:
            continue
        ns += fields.get("run_time_ns", 0)
        runs += fields.get("run_cnt", 0)
        skipped += fields.get("recursion_misses", 0)
    return ProgramRuns(ns, runs, skipped)
