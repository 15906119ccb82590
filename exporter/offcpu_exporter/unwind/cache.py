"""Built unwind tables kept by build id: in memory (LRU, bounded by bytes) and on disk (one file
per build id, oldest removed past a byte budget), so that a library shared by many processes, or
seen again after a restart, is not parsed again (python3.11: ~1 s, libLLVM: ~16 s)."""

from __future__ import annotations

import logging
import os
import tempfile
from collections import OrderedDict
from pathlib import Path

from offcpu_exporter.unwind.table import TableError, UnwindTable

__all__ = ["TableCache"]

log = logging.getLogger(__name__)

_SUFFIX = ".unwind"


class TableCache:
    def __init__(self, directory: str | None, *, memory_bytes: int = 256 << 20, disk_bytes: int = 1 << 30) -> None:
        self._dir = Path(directory) if directory else None
        self._memory_limit = memory_bytes
        self._disk_limit = disk_bytes
        self._tables: OrderedDict[str, UnwindTable] = OrderedDict()
        self._bytes = 0
        self.disk_errors = 0

    def get(self, build_id: str) -> UnwindTable | None:
        table = self._tables.get(build_id)
        if table is not None:
            self._tables.move_to_end(build_id)
            return table
        table = self._read(build_id)
        if table is not None:
            self._remember(build_id, table)
        return table

    def put(self, build_id: str, table: UnwindTable) -> None:
        self._remember(build_id, table)
        self._write(build_id, table)

    def _remember(self, build_id: str, table: UnwindTable) -> None:
        old = self._tables.pop(build_id, None)
        if old is not None:
            self._bytes -= _size(old)
        self._tables[build_id] = table
        self._bytes += _size(table)
        while self._bytes > self._memory_limit and self._tables:
            _, dropped = self._tables.popitem(last=False)
            self._bytes -= _size(dropped)

    def _path(self, build_id: str) -> Path | None:
        if self._dir is None or not build_id.isalnum():
            return None
        return self._dir / f"{build_id}{_SUFFIX}"

    def _read(self, build_id: str) -> UnwindTable | None:
        path = self._path(build_id)
        if path is None:
            return None
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            self.disk_errors += 1
            log.debug("unwind cache %s unreadable: %s", path, exc)
            return None
        try:
            table = UnwindTable.from_bytes(data)
        except (TableError, ValueError) as exc:
            log.debug("unwind cache %s unusable (%s): removed", path, exc)
            path.unlink(missing_ok=True)
            return None
        os.utime(path)  # recently used: evicted last
        return table

    def _write(self, build_id: str, table: UnwindTable) -> None:
        path = self._path(build_id)
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(table.to_bytes())
            os.replace(tmp, path)
            self._trim()
        except OSError as exc:
            self.disk_errors += 1
            log.warning("cannot write the unwind cache %s: %s", path, exc)

    def _trim(self) -> None:
        assert self._dir is not None
        files = []
        for entry in os.scandir(self._dir):
            if entry.name.endswith(_SUFFIX):
                st = entry.stat()
                files.append((st.st_mtime_ns, st.st_size, entry.path))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total <= self._disk_limit:
                break
            Path(path).unlink(missing_ok=True)
            total -= size


def _size(table: UnwindTable) -> int:
    return len(table.rows) + len(table.pages)
