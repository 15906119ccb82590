"""After loading the probe the exporter gives back what bcc's in-process compiler used."""

from __future__ import annotations

import os

import pytest

from offcpu_exporter.probe.compiler_memory import compiler_code_mappings
from testkit.exporter import ExporterProcess

pytestmark = pytest.mark.kernel

MAPS = """\
7f0000000000-7f0000400000 r--p 00000000 fe:01 1 /usr/lib/x86_64-linux-gnu/libLLVM-14.so.1
7f0000400000-7f0003000000 r-xp 00400000 fe:01 1 /usr/lib/x86_64-linux-gnu/libLLVM-14.so.1
7f0004000000-7f0005000000 r-xp 00100000 fe:01 2 /usr/lib/llvm-14/lib/libclang-cpp.so.14
7f0006000000-7f0006100000 r-xp 00010000 fe:01 3 /usr/lib/x86_64-linux-gnu/libbcc.so.0.26.0
7f0007000000-7f0007100000 r-xp 00010000 fe:01 4 /usr/lib/x86_64-linux-gnu/libc.so.6
"""


def test_only_the_compiler_libraries_code_is_advised() -> None:
    assert compiler_code_mappings(MAPS) == [(0x7F0000400000, 0x7F0003000000), (0x7F0004000000, 0x7F0005000000)]


def _private_kb(pid: int, predicate: object) -> int:
    total = 0
    name = perms = ""
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
                perms, name = head[1], head[5] if len(head) > 5 else ""
            elif head[0] in ("Private_Clean:", "Private_Dirty:") and predicate(perms, name):  # type: ignore[operator]
                total += int(head[1])
    return total


def test_compiler_code_is_not_resident_once_serving() -> None:
    with ExporterProcess(["--pid", str(os.getpid())]) as exporter:
        assert exporter.proc is not None
        pid = exporter.proc.pid
        with open(f"/proc/{pid}/maps") as f:
            assert compiler_code_mappings(f.read()), "bcc's LLVM is not mapped: another bcc build?"
        # Private pages only: pages also mapped by another process (this test's own bcc, say) are
        # not the exporter's to give back, and the kernel leaves them.
        llvm_kb = _private_kb(pid, lambda p, n: p.startswith("r-x") and ("libLLVM" in n or "libclang" in n))
    # Without the advice: ~74 MB alone, ~29 MB beside this test's bcc (LLVM 14).
    assert llvm_kb < 8 * 1024, f"{llvm_kb} kB of compiler code still resident"
