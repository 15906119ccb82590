"""What the running kernel offers the probe: read from /proc, /sys and tracefs, never guessed.

The one place the kernel's release is parsed and version-gated features are decided: the loader,
the unwinder's build settings, `doctor` and `--drop-privileges` ask here."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "FINISH_TASK_SWITCH_PATTERN",
    "KernelFacts",
    "current_capabilities",
    "finish_task_switch_symbols",
    "kernel_version",
    "probe_kernel",
]

# The reference hooks every compiler-made copy of finish_task_switch (e.g. `.isra.0` on Debian).
FINISH_TASK_SWITCH_PATTERN = re.compile(r"^finish_task_switch$|^finish_task_switch\.isra\.\d+$")

_TRACEFS_CANDIDATES = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
_VERSION = re.compile(r"(\d+)\.(\d+)")


def kernel_version(release: str | None = None) -> tuple[int, int]:
    """(major, minor) of a kernel release ("6.1.0-57-amd64", "6.12.9+rt", "6.8-rc3"), the running
    kernel's by default; (0, 0) when it does not start with one, so that every feature gated on a
    version counts as absent."""
    m = _VERSION.match(os.uname().release if release is None else release)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


@dataclass(frozen=True)
class KernelFacts:
    release: str
    tracefs: str | None  # where tracefs is mounted, None if nowhere
    btf: bool
    kprobes: bool  # the kernel can create kprobes (CONFIG_KPROBE_EVENTS)
    sched_switch_tracepoint: bool
    sched_exit_tracepoint: bool
    kallsyms_readable: bool  # addresses are real (not zeroed by kptr_restrict)
    finish_task_switch: tuple[str, ...]
    headers_dir: str | None  # /lib/modules/<release>/build (or source) if it holds linux/sched.h
    headers_release: str | None  # UTS_RELEASE of those headers
    capabilities: frozenset[int] = field(default_factory=frozenset)
    preempt_rt: bool = False  # a PREEMPT_RT kernel

    @property
    def version(self) -> tuple[int, int]:
        return kernel_version(self.release)

    @property
    def headers_match(self) -> bool:
        return self.headers_release is not None and self.headers_release == self.release

    @property
    def raw_sched_switch(self) -> bool:
        """A raw sched_switch tracepoint the probe can read: the 4-argument one (with prev_state,
        since 5.18), and BTF to find task_struct.pid in."""
        return self.btf and self.version >= (5, 18)

    @property
    def task_regs_btf(self) -> bool:
        """A task's saved user registers reachable through BTF: bpf_task_pt_regs() and BTF task
        pointers, since 5.15."""
        return self.btf and self.version >= (5, 15)

    @property
    def kprobe_exact(self) -> bool:
        """kprobe mode reads prev's task_struct at this kernel's offsets: from BTF
        (probe/task_layout.py), whatever the headers, or from headers that match it."""
        return self.btf or self.headers_match

    @property
    def kprobe_runs_skipped(self) -> bool:
        """Whether kprobe runs can be skipped in bulk: kprobe (and perf-event tracepoint) programs
        share one per-CPU guard, bpf_prog_active, with the BPF system calls on maps, which take it
        with migration, not preemption, disabled on PREEMPT_RT (bpf_disable_instrumentation()). A
        system call preempted there leaves it held, and every switch on that CPU until the call
        resumes goes unseen (each counted in the program's recursion_misses). Seen on Debian's
        6.12-rt: 30-51 skipped runs in 1.5 s of a three-thread workload, blocks lost (92 of 98).
        A raw tracepoint program has a guard of its own (bpf_trace_run*(): prog->active)."""
        return self.preempt_rt

    def auto_attach(self) -> tuple[str, str]:
        """The attach mode `auto` chooses, and why: the reference's hook (a kprobe on
        finish_task_switch) wherever it can be attached and read exactly, and no switch goes
        unseen for it."""
        if self.kprobe_runs_skipped and self.raw_sched_switch and self.sched_switch_tracepoint:
            return "tracepoint", ("PREEMPT_RT kernel: a kprobe does not run while a preempted BPF system call "
                                  "holds its CPU's guard; the raw sched_switch tracepoint has a guard of its own")
        if self.kprobes and self.finish_task_switch and self.kprobe_exact:
            source = "BTF" if self.btf else "headers that match the kernel"
            return "kprobe", f"kprobes available, {self.finish_task_switch[0]} found, task_struct layout from {source}"
        if not self.kprobes:
            why = "kernel has no kprobes (CONFIG_KPROBES/CONFIG_KPROBE_EVENTS not set)"
        elif not self.finish_task_switch:
            why = "no finish_task_switch symbol in /proc/kallsyms"
        else:
            why = (f"no BTF and the kernel headers ({self.headers_release or 'none'}) do not match the kernel "
                   f"({self.release}); kprobe mode reads struct task_struct and needs one of them")
        return "tracepoint", why


def _tracefs() -> str | None:
    for path in _TRACEFS_CANDIDATES:
        if os.path.isdir(os.path.join(path, "events")):
            return path
    return None


def finish_task_switch_symbols(kallsyms: str = "/proc/kallsyms") -> tuple[str, ...] | None:
    """Every text symbol matching the reference's pattern; None if kallsyms cannot be read."""
    found: list[str] = []
    try:
        with open(kallsyms, encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and parts[1] in "tT" and FINISH_TASK_SWITCH_PATTERN.match(parts[2]):
                    found.append(parts[2])
    except OSError:
        return None
    return tuple(dict.fromkeys(found))


def _kallsyms_readable(kallsyms: str = "/proc/kallsyms") -> bool:
    """Whether kptr_restrict leaves the addresses visible. Per-CPU symbols sit at address 0 even
    then (the first line is often `0000000000000000 A fixed_percpu_data`): look at text symbols."""
    try:
        with open(kallsyms, encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.split(None, 2)
                if len(parts) >= 2 and parts[1] in "tT":
                    return int(parts[0], 16) != 0
    except (OSError, ValueError):
        return False
    return False


def _headers(release: str) -> tuple[str | None, str | None]:
    for sub in ("build", "source"):
        base = Path("/lib/modules") / release / sub
        if (base / "include" / "linux" / "sched.h").exists():
            build = Path("/lib/modules") / release / "build"
            uts = build / "include" / "generated" / "utsrelease.h"
            version = None
            try:
                m = re.search(r'UTS_RELEASE\s+"([^"]+)"', uts.read_text())
                version = m.group(1) if m else None
            except OSError:
                pass
            return str(base), version
    return None, None


def current_capabilities(field: str = "CapEff", status_path: str = "/proc/self/status") -> frozenset[int]:
    """Capability bits of one set (CapEff, CapPrm, CapInh, CapBnd, CapAmb) from /proc/.../status."""
    with open(status_path) as f:
        for line in f:
            if line.startswith(field + ":"):
                mask = int(line.split()[1], 16)
                return frozenset(bit for bit in range(64) if mask >> bit & 1)
    return frozenset()


def _capabilities() -> frozenset[int]:
    try:
        return current_capabilities("CapEff")
    except OSError:
        return frozenset()


def probe_kernel() -> KernelFacts:
    release = os.uname().release
    tracefs = _tracefs()
    kprobes = bool(tracefs and os.path.exists(os.path.join(tracefs, "kprobe_events")))
    events = os.path.join(tracefs or "/nonexistent", "events", "sched")
    headers_dir, headers_release = _headers(release)
    symbols = finish_task_switch_symbols()
    return KernelFacts(
        release=release,
        tracefs=tracefs,
        btf=os.path.exists("/sys/kernel/btf/vmlinux"),
        kprobes=kprobes,
        sched_switch_tracepoint=os.path.exists(os.path.join(events, "sched_switch", "format")),
        sched_exit_tracepoint=os.path.exists(os.path.join(events, "sched_process_exit", "format")),
        kallsyms_readable=_kallsyms_readable(),
        finish_task_switch=symbols or (),
        headers_dir=headers_dir,
        headers_release=headers_release,
        capabilities=_capabilities(),
        preempt_rt=_preempt_rt(),
    )


def _preempt_rt() -> bool:
    # The kernel's version string names its preemption model ("#1 SMP PREEMPT_RT Debian ..."), and
    # PREEMPT_RT kernels have /sys/kernel/realtime (kernel/ksysfs.c).
    if "PREEMPT_RT" in os.uname().version:
        return True
    try:
        with open("/sys/kernel/realtime", encoding="ascii") as f:
            return f.read().strip() == "1"
    except OSError:
        return False
