"""What the probe is asked to do (`ProbeConfig`: its hook, its filters, its map sizes, the -D
defines those make), and the error it reports when the kernel cannot do it (`ProbeError`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from offcpu_exporter.probe import layout

__all__ = ["ProbeConfig", "ProbeError", "pid_max"]

_U64_MAX = (1 << 64) - 1
_PID_MAX_LIMIT = 1 << 22  # PID_MAX_LIMIT on 64-bit kernels


class ProbeError(Exception):
    """The probe cannot run on this kernel; the message says why and what to do."""


@dataclass(frozen=True)
class ProbeConfig:
    attach: str = "auto"
    per_thread: bool = False
    watch_all: bool = False
    follow_children: bool = False
    min_block_ns: int = 0
    max_block_ns: int = _U64_MAX
    max_targets: int = 16384
    max_proc_events: int = 16384  # processes with news between two refreshes of the targets
    max_threads: int = 65536
    max_counts: int = 65536
    stack_storage: int = 16384
    max_hist: int = 16384  # processes with a histogram
    raw_tracepoint: bool | None = None  # tracepoint mode: raw when BTF allows (None), always, never
    # Stack captures: all of them (False), or a sample bounded per thread and per CPU (True).
    stack_sampling: bool = True
    stack_budget_thread: int = 1000  # captures per second per thread: threads that block less often have all
    stack_budget_cpu: int = 5000  # captures per second per CPU
    long_block_ns: int = 1_000_000  # kprobe mode: blocks at least this long always have their stacks
    sample_window_ns: int = 100_000_000
    run_time_stats: bool = False  # have the kernel time the programs (BPF_ENABLE_STATS)
    # User stacks from DWARF CFI tables for the processes user space describes (else frame pointers).
    unwind: bool = True
    unwind_cache_dir: str | None = None  # tables kept on disk by build id (None: not kept)
    # Who woke each block (a sched_waking hook; the counters' keys carry the waker). Off: the
    # program is built without either, at today's cost.
    wakers: bool = False

    @property
    def in_progress_credit(self) -> bool:
        """Whether blocks still going on at a flush are counted up to it. Not with --max-block: a
        block's length, and so whether it counts at all, is known only when it ends."""
        return self.max_block_ns == _U64_MAX

    def cflags(self, mode: str, extra: Sequence[str] = ()) -> list[str]:
        windows_per_second = 1e9 / self.sample_window_ns
        return [
            f"-I{layout.BPF_DIR}",
            f"-DOFFCPU_ATTACH_{mode.upper()}",
            *extra,
            f"-DPER_THREAD={int(self.per_thread)}",
            f"-DWATCH_ALL={int(self.watch_all)}",
            f"-DFOLLOW_CHILDREN={int(self.follow_children)}",
            f"-DMIN_BLOCK_NS={self.min_block_ns}ULL",
            f"-DMAX_BLOCK_NS={self.max_block_ns}ULL",
            f"-DMAX_TARGETS={self.max_targets}",
            f"-DMAX_PROC_EVENTS={self.max_proc_events}",
            f"-DMAX_PIDS={pid_max()}",
            f"-DMAX_THREADS={self.max_threads}",
            f"-DMAX_COUNTS={self.max_counts}",
            f"-DSTACK_STORAGE={self.stack_storage}",
            f"-DMAX_HIST={self.max_hist}",
            f"-DSTACK_SAMPLING={int(self.stack_sampling)}",
            f"-DSAMPLE_WINDOW_NS={self.sample_window_ns}ULL",
            f"-DTHREAD_BUDGET={max(1, round(self.stack_budget_thread / windows_per_second))}",
            f"-DCPU_BUDGET={max(1, round(self.stack_budget_cpu / windows_per_second))}",
            f"-DLONG_BLOCK_NS={self.long_block_ns}ULL",
            f"-DSTOLEN_MIN_NS={layout.STOLEN_MIN_NS}ULL",
            f"-DWAKERS={int(self.wakers)}",
            # bcc's Debian build warns about these in kernel headers it does not own.
            "-Wno-macro-redefined",
            "-Wno-unknown-warning-option",
        ]


def pid_max(path: str = "/proc/sys/kernel/pid_max") -> int:
    """The kernel's highest pid + 1: the size of the probe's per-pid arrays."""
    try:
        with open(path, encoding="ascii") as f:
            return max(1, min(int(f.read()), _PID_MAX_LIMIT))
    except (OSError, ValueError):
        return _PID_MAX_LIMIT
