"""A workload that runs as another user, from a binary only that user may read: what a process in
another container looks like to the exporter (its maps and binary unreadable without SYS_PTRACE or
DAC_READ_SEARCH)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from testkit.workloads import build

NOBODY = 65534


@contextlib.contextmanager
def nobody_workload() -> Iterator[Path]:
    """A wrapper that runs the workload as nobody, from a copy only nobody can read (mode 0711)."""
    if shutil.which("setpriv") is None:
        raise RuntimeError("setpriv (util-linux) is needed")
    work = Path(tempfile.mkdtemp(prefix="offcpu-caps-", dir="/tmp"))
    try:
        work.chmod(0o755)
        binary = work / "offcpu_workload"
        shutil.copy(build(), binary)
        os.chown(binary, NOBODY, NOBODY)
        binary.chmod(0o711)
        wrapper = work / "as-nobody"
        run_as = f"setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups"
        wrapper.write_text(f"#!/bin/sh\nexec {run_as} {binary} \"$@\"\n")
        wrapper.chmod(0o755)
        yield wrapper
    finally:
        shutil.rmtree(work)
