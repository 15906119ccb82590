"""Opening the very file a process maps: through ``/proc/PID/map_files/`` (exactly the mapped file,
even deleted or replaced on disk; needs CAP_SYS_ADMIN), else through ``/proc/PID/root`` (the
process's own filesystem, resolved without escaping it). Either way the inode must be the one in
the maps line, or the file is not the code that runs."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from offcpu_exporter.symbols.proc_maps import Mapping
from offcpu_exporter.symbols.rootfs import resolve_in_root

__all__ = ["FileKey", "MappedFile", "open_mapped_file"]

log = logging.getLogger(__name__)

# (st_dev, st_ino, st_size, st_mtime_ns) of a file; other kinds of key for images without a file.
FileKey = tuple[object, ...]


@dataclass(frozen=True, slots=True)
class MappedFile:
    key: FileKey
    open_path: str  # a path that opens this very file (map_files entry or resolved root path)


def open_mapped_file(proc_root: str, pid: int, mapping: Mapping) -> MappedFile | None:
    base = f"{proc_root}/{pid}"
    candidates = [f"{base}/map_files/{mapping.map_files_name}"]
    in_root = resolve_in_root(f"{base}/root", mapping.path)
    if in_root is not None:
        candidates.append(in_root)
    for path in candidates:
        try:
            st = os.stat(path)
        except OSError:
            continue
        if st.st_ino != mapping.inode:
            continue  # replaced on disk since it was mapped: not the code that runs
        return MappedFile((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns), path)
    log.debug("cannot open %s mapped by %d", mapping.path, pid)
    return None
