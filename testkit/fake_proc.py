"""A /proc tree on disk (maps, root/, status) for driving the symbolizer without a live process."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


class FakeProc:
    def __init__(self, base: Path) -> None:
        self.base = base
        base.mkdir(parents=True, exist_ok=True)

    def process(self, pid: int) -> Path:
        d = self.base / str(pid)
        (d / "root").mkdir(parents=True, exist_ok=True)
        (d / "status").write_text(f"Name:\tfake\nPid:\t{pid}\nNSpid:\t{pid}\n")
        return d

    def install(self, pid: int, source: Path | bytes, path: str) -> int:
        """Put a file at `path` inside the process's root; returns its inode for the maps line."""
        target = self.process(pid) / "root" / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(source, bytes):
            target.write_bytes(source)
        else:
            shutil.copyfile(source, target)
        return os.stat(target).st_ino

    def maps(self, pid: int, text: str) -> None:
        (self.process(pid) / "maps").write_text(text)
