"""Compiling bpf/unwind.h into a bcc program: its text and its -D defines."""

from __future__ import annotations

import re
from dataclasses import dataclass

from offcpu_exporter.bpf import SOURCE_DIR as BPF_DIR
from offcpu_exporter.probe.facts import probe_kernel
from offcpu_exporter.unwind import layout

__all__ = ["UnwindConfig", "bpf_text"]

_INCLUDE = re.compile(r'^#include "unwind\.h"[ \t]*$', re.MULTILINE)


def bpf_text(source: str) -> str:
    """``source`` with its ``#include "unwind.h"`` replaced by the header itself. bcc turns
    ``map.lookup()`` calls into map references only in the text it is given, not in the headers it
    includes: from an included header they stay indirect calls the verifier rejects ("unknown
    opcode 8d")."""
    header = (BPF_DIR / layout.WALK_HEADER).read_text()
    text, n = _INCLUDE.subn(lambda _: header, source, count=1)
    if n != 1:
        raise ValueError('the BPF source does not #include "unwind.h" on a line of its own')
    return text


@dataclass(frozen=True)
class UnwindConfig:
    max_frames: int = 127  # the probe's user-stack depth
    max_rows: int = 1 << 20  # 12 MiB: libc 28k rows, python3.11 65k, libLLVM-14 950k
    max_pages: int = 1 << 16  # 512 KiB: one entry per 4 KiB of code with tables
    # Processes with tables (8 bytes each, allocated on use) and their mappings with tables, all
    # together (32 bytes each, 8 MiB): a node of 10,000 processes at 26 objects with CFI each.
    max_processes: int = 1 << 16
    mapping_slots: int = 1 << 18
    regs_btf: bool | None = None  # None: from the running kernel (KernelFacts.task_regs_btf)

    def cflags(self) -> list[str]:
        regs_btf = self.regs_btf if self.regs_btf is not None else probe_kernel().task_regs_btf
        return [
            f"-I{BPF_DIR}",
            f"-DUNWIND_MAX_FRAMES={self.max_frames}",
            f"-DUNWIND_MAX_ROWS={self.max_rows}",
            f"-DUNWIND_MAX_PAGES={self.max_pages}",
            f"-DUNWIND_MAX_PROCESSES={self.max_processes}",
            f"-DUNWIND_MAX_MAPPING_SLOTS={self.mapping_slots}",
            f"-DUNWIND_REGS_BTF={int(regs_btf)}",
        ]
