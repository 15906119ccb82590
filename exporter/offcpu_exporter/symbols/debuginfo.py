"""Finding a binary's separate debug file, the way gdb and perf do: by build id
(``<debug dir>/.build-id/ab/cdef....debug``) and by ``.gnu_debuglink`` (next to the binary, in
its ``.debug/`` directory, or under ``<debug dir>/<binary's directory>/``). Paths are looked up
inside the process's root first (a container ships its own debug files), then on the host."""

from __future__ import annotations

import logging
import os
import zlib
from collections.abc import Iterator, Sequence

from offcpu_exporter.symbols.elf import ElfFormatError, ElfInfo, read_elf
from offcpu_exporter.symbols.rootfs import resolve_in_root

__all__ = ["debug_file_candidates", "file_crc32", "read_debug_file"]

log = logging.getLogger(__name__)

DEFAULT_DEBUG_DIRS = ("/usr/lib/debug",)


def debug_file_candidates(
    build_id: str,
    debuglink: tuple[str, int] | None,
    binary_path: str,
    root: str,
    debug_dirs: Sequence[str],
) -> Iterator[tuple[str, str, int | None]]:
    """Yield (host path, how it was found, expected crc32 or None) of existing candidate files,
    best first. The caller checks the build id / CRC before using one."""
    seen: set[str] = set()
    roots = [root] if root and root != "/" else []
    roots.append("")

    def existing(base: str, path: str) -> str | None:
        found = resolve_in_root(base, path) if base else (path if os.path.isfile(path) else None)
        if found is None or found in seen:
            return None
        seen.add(found)
        return found

    if len(build_id) > 2:
        rel = f".build-id/{build_id[:2]}/{build_id[2:]}.debug"
        for base in roots:
            for d in debug_dirs:
                found = existing(base, f"{d.rstrip('/')}/{rel}")
                if found:
                    yield found, "build-id", None
    if debuglink is not None and binary_path.startswith("/"):
        name, crc = debuglink
        directory = os.path.dirname(binary_path)
        in_process = [f"{directory}/{name}", f"{directory}/.debug/{name}"]
        in_process += [f"{d.rstrip('/')}{directory}/{name}" for d in debug_dirs]
        for base in roots:
            for path in in_process:
                found = existing(base, path)
                if found:
                    yield found, "debuglink", crc


def file_crc32(path: str, limit: int = 4 << 30) -> int | None:
    """CRC32 of a whole file (the checksum .gnu_debuglink records), None when unreadable."""
    crc = 0
    read = 0
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                crc = zlib.crc32(chunk, crc)
                read += len(chunk)
                if read > limit:
                    return None
    except OSError:
        return None
    return crc


def read_debug_file(path: str, build_id: str, crc: int | None) -> ElfInfo | None:
    """The debug file at ``path`` if it belongs to the binary (same build id, or the debuglink
    CRC32 when one is expected); None otherwise or when unreadable."""
    try:
        with open(path, "rb") as f:
            debug = read_elf(f, os.fstat(f.fileno()).st_size)
    except (OSError, ElfFormatError) as exc:
        log.debug("debug file %s unusable: %s", path, exc)
        return None
    if build_id and debug.build_id and debug.build_id != build_id:
        log.debug("debug file %s is for another build (%s)", path, debug.build_id)
        return None
    if crc is not None and file_crc32(path) != crc:
        log.debug("debug file %s fails its debuglink CRC", path)
        return None
    return debug
