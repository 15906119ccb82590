"""The unwinder's test program (tests/e2e/unwind/unwind_target.c), the flags that build it without
frame pointers, and starting it (or any program) until it says it is ready."""

from __future__ import annotations

import subprocess
from pathlib import Path

__all__ = ["OMIT_FP", "TARGET", "start"]

TARGET = Path(__file__).resolve().parent.parent / "tests" / "e2e" / "unwind" / "unwind_target.c"
OMIT_FP = ("-O2", "-fomit-frame-pointer", "-pthread")


def start(procs: list[subprocess.Popen[str]], *argv: str, ready: str | None = None) -> subprocess.Popen[str]:
    """Starts `argv`, appended to `procs` (the caller stops them); with `ready`, waits for the
    first line of its output to begin with it."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    procs.append(p)
    if ready is not None:
        assert p.stdout is not None
        line = p.stdout.readline()
        assert line.startswith(ready), line
    return p
