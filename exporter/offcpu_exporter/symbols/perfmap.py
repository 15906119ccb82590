"""JIT symbol maps: ``/tmp/perf-PID.map``, one ``START SIZE name`` line per code region (hex
numbers), written by Node ``--perf-basic-prof``, Python 3.12+ ``-X perf`` and JVM perf-map agents.
The file is appended to while the process runs, so it is re-read (from where the last read
stopped, when it only grew) whenever its size or mtime changes."""

from __future__ import annotations

import logging
import os
from bisect import bisect_right

__all__ = ["PerfMap"]

log = logging.getLogger(__name__)

_MAX_BYTES = 256 << 20  # a runaway map is not worth more memory than this


class PerfMap:
    __slots__ = ("_ends", "_names", "_read_to", "_regions", "_starts", "_version", "path")

    def __init__(self, path: str) -> None:
        self.path = path
        self._version: tuple[int, int, int] | None = None  # (inode, size, mtime_ns)
        self._read_to = 0
        self._regions: dict[int, tuple[int, str]] = {}  # start -> (end, name); later lines win
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._names: list[str] = []

    def refresh(self) -> bool:
        """Re-read the file if it changed; True when the symbols changed."""
        try:
            st = os.stat(self.path)
        except OSError:
            if self._version is None and not self._starts:
                return False
            self._version = None
            self._read_to = 0
            self._regions.clear()
            self._index()
            return True
        version = (st.st_ino, st.st_size, st.st_mtime_ns)
        if version == self._version:
            return False
        if self._version is None or self._version[0] != st.st_ino or st.st_size < self._read_to:
            self._regions.clear()
            self._read_to = 0
        self._version = version
        try:
            with open(self.path, "rb") as f:
                f.seek(self._read_to)
                chunk = f.read(max(0, min(st.st_size, _MAX_BYTES) - self._read_to))
        except OSError as exc:
            log.debug("cannot read perf map %s: %s", self.path, exc)
            return False
        complete = chunk.rfind(b"\n") + 1  # a writer may be in the middle of a line
        self._read_to += complete
        self._parse(chunk[:complete])
        self._index()
        return True

    def _parse(self, data: bytes) -> None:
        regions = self._regions
        for line in data.split(b"\n"):
            parts = line.split(None, 2)
            if len(parts) < 3:
                continue
            try:
                start = int(parts[0], 16)
                size = int(parts[1], 16)
            except ValueError:
                continue
            if size <= 0 or start < 0:
                continue
            regions[start] = (start + size, parts[2].strip().decode("utf-8", "replace"))

    def _index(self) -> None:
        items = sorted(self._regions.items())
        self._starts = [s for s, _ in items]
        self._ends = [e for _, (e, _n) in items]
        self._names = [n for _, (_e, n) in items]

    def lookup(self, address: int) -> str | None:
        i = bisect_right(self._starts, address) - 1
        for j in range(i, max(i - 4, -1), -1):
            if address < self._ends[j]:
                return self._names[j]
        return None

    def __len__(self) -> int:
        return len(self._starts)
