"""The probe: bpf/offcpu.bpf.c compiled with bcc (probe/compile.py), attached to the scheduler
(probe/attach.py), and the only reader and writer of its maps (probe/access.py)."""

from __future__ import annotations

import ctypes
import logging
import os

from offcpu_exporter.clock import ktime_ns, wall_ns_at
from offcpu_exporter.probe.access import MapAccess
from offcpu_exporter.probe.attach import ATTACH_MODES, attach, check_mode, choose_mode
from offcpu_exporter.probe.compile import build_program, import_bcc, load
from offcpu_exporter.probe.config import ProbeConfig, ProbeError
from offcpu_exporter.probe.facts import KernelFacts, probe_kernel
from offcpu_exporter.probe.maps import ProgramRuns
from offcpu_exporter.probe.program_stats import read_program_runs
from offcpu_exporter.unwind import TableCache, Unwinder, UnwindMaps
from offcpu_exporter.unwind.build import build_in_child

__all__ = ["Probe", "ProbeConfig", "ProbeError"]

log = logging.getLogger(__name__)

_SYS_BPF = 321  # x86-64
_BPF_ENABLE_STATS = 32
_BPF_STATS_RUN_TIME = 0
_TABLE_MEMORY = 0  # unwind tables are not kept in memory once in the BPF maps (the disk cache has them)


class Probe(MapAccess):
    """The loaded BPF program: what the rest of the exporter holds (a KernelMaps). Its maps are
    read and written through MapAccess. Not thread-safe: one owner (the pipeline) calls it."""

    def __init__(self, config: ProbeConfig, facts: KernelFacts | None = None) -> None:
        if config.attach not in ATTACH_MODES:
            raise ProbeError(f"unknown attach mode {config.attach!r}; use one of {', '.join(ATTACH_MODES)}")
        super().__init__(config)
        self.facts = facts or probe_kernel()
        self.mode = ""
        self.why = ""
        self.hooked: tuple[str, ...] = ()
        # When counting began, on the wall clock and on the probe's clock (CLOCK_MONOTONIC).
        self.attached_wall_ns = 0
        self.attached_ktime_ns = 0
        self._stats_fd = -1
        self.unwinder: Unwinder | None = None  # set when user stacks are walked from CFI tables

    def start(self) -> None:
        bcc = import_bcc()
        mode, self.why = choose_mode(self.config.attach, self.facts)
        check_mode(mode, self.facts)
        program = build_program(self.config, self.facts, mode)
        self._bpf = load(bcc, program)
        self._lib = bcc.libbcc.lib
        if program.unwind is not None:
            # Tables missing from the cache are parsed in a child process: its memory is not ours to keep.
            self.unwinder = Unwinder(UnwindMaps(self._bpf), build_table=build_in_child,
                                     cache=TableCache(self.config.unwind_cache_dir, memory_bytes=_TABLE_MEMORY))
        self.mode = mode
        try:
            self.hooked = attach(self._bpf, program.variant, self.facts, wakers=self.config.wakers)
        except ProbeError:
            self.close()
            raise
        # Counting begins now (tracepoint programs are attached when bcc loads them, kprobes just above).
        self.attached_ktime_ns = ktime_ns()
        self.attached_wall_ns = wall_ns_at(self.attached_ktime_ns)
        if self.config.run_time_stats:
            self.enable_run_time_stats()
        log.info("probe attached: mode=%s (%s), hooked=%s", self.mode, self.why, ",".join(self.hooked))

    def close(self) -> None:
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None
        if self._stats_fd >= 0:
            os.close(self._stats_fd)
            self._stats_fd = -1

    @property
    def attached(self) -> bool:
        return self._bpf is not None

    # -- the probe's own cost --------------------------------------------------------------

    def enable_run_time_stats(self) -> bool:
        """Ask the kernel to time every run of BPF programs while this probe lives
        (BPF_ENABLE_STATS, 5.8+; the same as sysctl kernel.bpf_stats_enabled=1, undone when the
        exporter exits). Costs two clock reads per run."""
        if self._stats_fd >= 0:
            return True
        libc = ctypes.CDLL(None, use_errno=True)
        attr = (ctypes.c_uint32 * 4)(_BPF_STATS_RUN_TIME, 0, 0, 0)
        fd = libc.syscall(_SYS_BPF, _BPF_ENABLE_STATS, ctypes.byref(attr), ctypes.sizeof(attr))
        if fd < 0:
            log.warning("BPF run-time statistics unavailable: %s", os.strerror(ctypes.get_errno()))
            return False
        self._stats_fd = fd
        return True

    def program_runs(self) -> ProgramRuns:
        """The kernel's figures of the probe's programs since they were loaded (program_stats.py)."""
        assert self._bpf is not None
        return read_program_runs(fn.fd for fn in self._bpf.funcs.values())

