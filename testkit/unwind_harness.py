"""Loads testkit/unwind_harness.bpf.c (bpf/unwind.h behind the probe's hooks) and
hands back the captured user stacks: by the unwinder and by bpf_get_stack (frame pointers), with
the time each took and how long the thread then stayed off CPU.

The hook follows OFFCPU_ATTACH like the probe tests (the kernel matrix sets it): ``kprobe`` on
finish_task_switch, ``tracepoint`` (raw sched_switch where BTF allows, else the perf-event one),
or ``auto`` (tracepoint: this machine has no kprobes). For the paths a kernel without BTF takes,
OFFCPU_UNWIND_HOOK=tracepoint forces the perf-event tracepoint and OFFCPU_UNWIND_REGS=headers reads
the user registers through task_struct.stack at the headers' offset (matching headers needed).
"""

from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from offcpu_exporter.probe.facts import KernelFacts, probe_kernel
from offcpu_exporter.probe.task_layout import read_task_layout
from offcpu_exporter.unwind import TableCache, UnwindConfig, Unwinder, UnwindMaps, bpf_text, layout

SOURCE = Path(__file__).resolve().parent / "unwind_harness.bpf.c"
MAX_FRAMES = 127


class _Capture(ctypes.Structure):
    _fields_ = (
        ("off_ns", ctypes.c_uint64),
        ("tgid", ctypes.c_uint32),
        ("tid", ctypes.c_uint32),
        ("frames", ctypes.c_int32),
        ("end", ctypes.c_uint32),
        ("fp_bytes", ctypes.c_int32),
        ("pad", ctypes.c_uint32),
        ("unwind_ns", ctypes.c_uint64),
        ("fp_ns", ctypes.c_uint64),
        ("ips", ctypes.c_uint64 * MAX_FRAMES),
        ("fp_ips", ctypes.c_uint64 * MAX_FRAMES),
    )


@dataclass(frozen=True)
class Capture:
    tgid: int
    tid: int
    off_ns: int
    frames: tuple[int, ...]  # the unwinder's, leaf first
    end: str  # layout.END_NAMES
    fp_frames: tuple[int, ...]  # bpf_get_stack's
    unwind_ns: int
    fp_ns: int


def hook(facts: KernelFacts, attach: str | None = None) -> str:
    """raw_tracepoint, tracepoint or kprobe, from OFFCPU_ATTACH and the running kernel."""
    forced = os.environ.get("OFFCPU_UNWIND_HOOK")
    if forced:
        return forced
    attach = attach or os.environ.get("OFFCPU_ATTACH", "auto")
    if attach == "kprobe":
        return "kprobe"
    return "raw_tracepoint" if facts.raw_sched_switch else "tracepoint"


class Harness:
    def __init__(self, attach: str | None = None, config: UnwindConfig | None = None,
                 cache_dir: str | None = None) -> None:
        from bcc import BPF

        facts = probe_kernel()
        self.hook = hook(facts, attach)
        regs = os.environ.get("OFFCPU_UNWIND_REGS")
        self.config = config or UnwindConfig(max_rows=1 << 20, max_pages=1 << 16, max_processes=64,
                                             regs_btf=facts.task_regs_btf if regs is None else regs == "btf")
        cflags = [*self.config.cflags(), f"-DHARNESS_{self.hook.upper()}", "-Wno-macro-redefined",
                  "-Wno-unknown-warning-option"]
        if self.hook == "raw_tracepoint":
            cflags.append(f"-DTASK_PID_OFFSET={read_task_layout().pid}")
        self.bpf: Any = BPF(text=bpf_text(SOURCE.read_text()).encode(), cflags=cflags)
        if self.hook == "kprobe":
            for symbol in facts.finish_task_switch or ("finish_task_switch",):
                self.bpf.attach_kprobe(event=symbol.encode(), fn_name=b"harness_finish_task_switch")
        self.maps = UnwindMaps(self.bpf)
        self.unwinder = Unwinder(self.maps, cache=TableCache(cache_dir))
        self._captures: list[Capture] = []
        self.bpf[b"captures"].open_perf_buffer(self._on_capture, page_cnt=256)

    def _on_capture(self, _cpu: int, data: Any, _size: int) -> None:
        c = ctypes.cast(data, ctypes.POINTER(_Capture)).contents
        frames = tuple(c.ips[: max(0, c.frames)])
        fp = tuple(c.fp_ips[: max(0, c.fp_bytes) // 8])
        self._captures.append(Capture(c.tgid, c.tid, c.off_ns, frames, layout.END_NAMES.get(c.end, str(c.end)),
                                      fp, c.unwind_ns, c.fp_ns))

    def watch(self, pid: int, tables: bool = True) -> None:
        """Capture the stacks of pid's threads; with tables (default), its unwind tables first."""
        if tables:
            self.unwinder.update(pid)
        targets = self.bpf[b"targets"]
        targets[targets.Key(pid)] = targets.Leaf(1)

    def unwatch(self, pid: int) -> None:
        targets = self.bpf[b"targets"]
        del targets[targets.Key(pid)]

    def collect(self, seconds: float) -> list[Capture]:
        """The captures delivered within the next `seconds`."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.bpf.perf_buffer_poll(timeout=max(1, int(min(left, 0.2) * 1000)))
        out, self._captures = self._captures, []
        return out

    def close(self) -> None:
        self.bpf.cleanup()

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
