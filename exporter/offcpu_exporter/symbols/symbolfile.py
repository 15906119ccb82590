"""One ELF image's symbols, loaded once: from the mapped file itself, a separate debug file, its
MiniDebugInfo, or (for the vDSO, which has no file) the image read from a process's memory."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from io import BytesIO

from offcpu_exporter.symbols.debuginfo import debug_file_candidates, read_debug_file
from offcpu_exporter.symbols.demangle import demangle
from offcpu_exporter.symbols.elf import ElfFormatError, ElfInfo, SymbolTable, read_elf, read_minidebuginfo
from offcpu_exporter.symbols.mapped import MappedFile

__all__ = ["MINIDEBUGINFO", "SymbolFile", "load_mapped_file", "load_vdso_image"]

log = logging.getLogger(__name__)

MINIDEBUGINFO = "[.gnu_debugdata]"  # SymbolFile.debug_file when the symbols came from MiniDebugInfo
_NAME_CACHE_LIMIT = 1 << 16  # names kept per file


@dataclass(slots=True)
class SymbolFile:
    """One ELF image's symbols, shared by all processes mapping it."""

    info: ElfInfo
    table: SymbolTable
    debug_file: str = ""  # host path of the debug file whose .symtab is used, if any
    names: dict[int, str | None] = field(default_factory=dict)

    def name(self, vaddr: int) -> str | None:
        names = self.names
        if vaddr in names:
            return names[vaddr]
        raw = self.table.lookup(vaddr)
        result = None
        if raw is not None:
            # .symtab names compat versions "clock_gettime@GLIBC_2.2.5"; the version is noise here.
            at = raw.find("@", 1)
            result = demangle(raw[:at] if at > 0 else raw)
        if len(names) >= _NAME_CACHE_LIMIT:
            names.clear()
        names[vaddr] = result
        return result


def load_mapped_file(mapped: MappedFile, binary_path: str, root: str, debug_dirs: Sequence[str]) -> SymbolFile | None:
    """The symbols of the file `mapped` opens, or None when it is not a usable ELF image (or no
    longer the file first opened). `binary_path` is its path as the process sees it, `root` that
    process's root directory (where its debug files are looked for)."""
    try:
        with open(mapped.open_path, "rb") as f:
            st = os.fstat(f.fileno())
            if (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) != mapped.key:
                raise ElfFormatError("file changed since it was first opened")
            info = read_elf(f, st.st_size)
    except (OSError, ElfFormatError) as exc:
        log.debug("%s: not usable for symbols: %s", mapped.open_path, exc)
        return None
    return _with_debug_symbols(info, binary_path, root, debug_dirs)


def load_vdso_image(image: bytes, pid: int) -> SymbolFile | None:
    """The symbols of a vDSO image read from the memory of process `pid`, or None if it is not ELF."""
    try:
        info = read_elf(BytesIO(image), len(image))
    except ElfFormatError as exc:
        log.debug("vDSO of %d: %s", pid, exc)
        return None
    return SymbolFile(info, SymbolTable.build([info.symtab, info.dynsym]))


def _with_debug_symbols(info: ElfInfo, binary_path: str, root: str, debug_dirs: Sequence[str]) -> SymbolFile:
    symtab = info.symtab
    debug_file = ""
    if symtab is None or not symtab.entries:
        for path, how, crc in debug_file_candidates(info.build_id, info.debuglink, binary_path, root, debug_dirs):
            debug = read_debug_file(path, info.build_id, crc)
            if debug is not None and debug.symtab is not None and debug.symtab.entries:
                symtab, debug_file = debug.symtab, path
                log.debug("symbols of %s from %s (%s)", binary_path, path, how)
                break
        else:
            mini = read_minidebuginfo(info)
            if mini is not None and mini.entries:
                symtab, debug_file = mini, MINIDEBUGINFO
                log.debug("symbols of %s from its .gnu_debugdata", binary_path)
    if not debug_file and (symtab is None or not symtab.entries):
        log.debug(
            "no .symtab and no debug file for %s (build id %s): .dynsym only", binary_path, info.build_id or "none"
        )
    table = SymbolTable.build([symtab, info.dynsym])
    info.symtab = info.dynsym = None  # the table holds what is needed
    info.gnu_debugdata = b""
    return SymbolFile(info, table, debug_file)
