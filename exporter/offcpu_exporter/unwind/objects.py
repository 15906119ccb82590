"""The unwind table of one ELF object: its ``.eh_frame``, completed by a ``.debug_frame`` (its own,
its separate debug file's found by build id or debuglink, or its MiniDebugInfo's) for code the
``.eh_frame`` does not cover."""

from __future__ import annotations

import io
import logging
import lzma
import os
from collections.abc import Sequence
from typing import BinaryIO

from elftools.elf.elffile import ELFFile

from offcpu_exporter.symbols.debuginfo import debug_file_candidates, read_debug_file
from offcpu_exporter.symbols.elf import ElfFormatError, ElfInfo, read_elf, read_elf_layout
from offcpu_exporter.unwind.cfi import CfiStats, Fde, fde_rows
from offcpu_exporter.unwind.table import TableError, UnwindTable, build_table

__all__ = ["ObjectError", "build_in_process", "object_info", "object_layout", "object_table"]

log = logging.getLogger(__name__)

_MINIDEBUG_MAX = 64 << 20


class ObjectError(Exception):
    """The object has no usable CFI (or is not an ELF file): its frames use the frame pointer."""


def object_info(path: str) -> ElfInfo:
    """Build id and load segments of the file at ``path``."""
    try:
        with open(path, "rb") as f:
            return read_elf(f, os.fstat(f.fileno()).st_size)
    except (OSError, ElfFormatError) as exc:
        raise ObjectError(str(exc)) from None


def object_layout(path: str) -> ElfInfo:
    """Build id and load segments of the file at ``path``, without its symbol tables."""
    try:
        with open(path, "rb") as f:
            return read_elf_layout(f)
    except (OSError, ElfFormatError) as exc:
        raise ObjectError(str(exc)) from None


def build_in_process(path: str, layout: ElfInfo, binary_path: str, root: str, debug_dirs: Sequence[str]) -> UnwindTable:
    """The table of the file at ``path`` (``layout`` from :func:`object_layout`), built here."""
    del layout  # the debug file search needs what object_info reads
    return object_table(path, object_info(path), binary_path, root, debug_dirs)


def object_table(path: str, info: ElfInfo, binary_path: str, root: str, debug_dirs: Sequence[str]) -> UnwindTable:
    """Build the table of the file at ``path`` (``info`` from :func:`object_info`); ``binary_path``
    and ``root`` locate its debug file as the process sees it."""
    stats = CfiStats()
    try:
        with open(path, "rb") as f:
            primary, secondary = _frames(f, stats)
    except (OSError, ElfFormatError) as exc:
        raise ObjectError(str(exc)) from None
    except Exception as exc:  # pyelftools raises many types on malformed CFI
        raise ObjectError(f"malformed CFI: {type(exc).__name__}: {exc}") from None
    sources = ["eh_frame"] if primary else []
    if secondary:
        sources.append("debug_frame")
    else:
        secondary, found = _debug_frames(info, binary_path, root, debug_dirs, stats)
        if secondary:
            sources.append(found)
    try:
        table = build_table(primary, secondary)
    except TableError as exc:
        raise ObjectError(str(exc)) from None
    table.stats.update({f"unsupported: {why}": n for why, n in stats.bad_kinds.items()})
    table.stats["source"] = " + ".join(sources)
    return table


def _frames(stream: BinaryIO, stats: CfiStats) -> tuple[list[Fde], list[Fde]]:
    """FDE rows of the stream's .eh_frame and .debug_frame (empty when absent or NOBITS)."""
    elf = ELFFile(stream)
    if elf["e_machine"] != "EM_X86_64":
        raise ElfFormatError(f"{elf['e_machine']}: the tables are for x86-64")
    eh = elf.get_section_by_name(".eh_frame")
    debug = elf.get_section_by_name(".debug_frame")
    has_eh = eh is not None and eh["sh_type"] != "SHT_NOBITS" and eh["sh_size"] > 0
    has_debug = debug is not None and debug["sh_type"] != "SHT_NOBITS" and debug["sh_size"] > 0
    if not (has_eh or has_debug):
        return [], []
    dwarf = elf.get_dwarf_info(relocate_dwarf_sections=False, follow_links=False)
    primary = fde_rows(dwarf.EH_CFI_entries(), stats) if has_eh and dwarf.has_EH_CFI() else []
    secondary = fde_rows(dwarf.CFI_entries(), stats) if has_debug and dwarf.has_CFI() else []
    return primary, secondary


def _debug_frames(info: ElfInfo, binary_path: str, root: str, debug_dirs: Sequence[str],
                  stats: CfiStats) -> tuple[list[Fde], str]:
    for path, how, crc in debug_file_candidates(info.build_id, info.debuglink, binary_path, root, debug_dirs):
        if read_debug_file(path, info.build_id, crc) is None:
            continue
        try:
            with open(path, "rb") as f:
                _, frames = _frames(f, stats)
        except Exception as exc:
            log.debug("debug file %s: no usable .debug_frame: %s", path, exc)
            continue
        if frames:
            return frames, f"debug_frame of {how} debug file"
    if info.gnu_debugdata:
        try:
            decompressor = lzma.LZMADecompressor()
            image = decompressor.decompress(info.gnu_debugdata, max_length=_MINIDEBUG_MAX)
            _, frames = _frames(io.BytesIO(image), stats)
        except Exception as exc:
            log.debug("%s: .gnu_debugdata unusable: %s", binary_path, exc)
            frames = []
        if frames:
            return frames, "debug_frame of .gnu_debugdata"
    return [], ""
