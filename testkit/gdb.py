"""gdb's backtraces of a live process: the independent reference the unwinder's stacks are compared with."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

__all__ = ["gdb_backtraces"]

SCRIPT = Path(__file__).parent / "gdb_frames.py"


def gdb_backtraces(pid: int) -> dict[int, list[tuple[int, str]]]:
    """tid -> [(pc, name)] of every thread's physical frames, newest first."""
    gdb = shutil.which("gdb")
    if gdb is None:
        pytest.fail("gdb is not installed (scripts/setup --test installs it)")
    out = subprocess.run([gdb, "-p", str(pid), "-batch", "-nx", "-x", str(SCRIPT)],
                         capture_output=True, text=True, timeout=120).stdout
    threads: dict[int, list[tuple[int, str]]] = {}
    frames: list[tuple[int, str]] = []
    for line in out.splitlines():
        words = line.split()
        if words[:1] == ["THREAD"]:
            frames = threads.setdefault(int(words[1]), [])
        elif words[:1] == ["FRAME"]:
            frames.append((int(words[1], 16), words[2]))
    return threads
