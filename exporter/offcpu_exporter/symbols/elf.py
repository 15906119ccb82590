"""Reading what symbolization needs from one ELF file: load segments, build id, debuglink and the
function symbols of ``.symtab``/``.dynsym``.

pyelftools parses the headers, segments, sections and notes. The symbol tables themselves are
decoded with :func:`struct.iter_unpack` straight from the section bytes: going through
pyelftools' per-symbol objects costs ~20 us a symbol, which is 2 s for a 100k-function binary,
while a flat unpack is a few ms. Names stay undecoded in the string table until looked up.
"""

from __future__ import annotations

import io
import lzma
import struct
from array import array
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import BinaryIO

from elftools.elf.elffile import ELFFile

__all__ = ["ElfFormatError", "ElfInfo", "RawSymbols", "SymbolTable", "read_elf", "read_minidebuginfo"]

_STT_NOTYPE, _STT_FUNC, _STT_GNU_IFUNC = 0, 2, 10
_FUNCTION_TYPES = (_STT_FUNC, _STT_GNU_IFUNC)
_STB_LOCAL, _STB_GLOBAL, _STB_WEAK = 0, 1, 2
_SHN_LORESERVE = 0xFF00
_SHF_EXECINSTR = 0x4
_SHT_NOBITS = "SHT_NOBITS"
_MINIDEBUG_MAX = 64 << 20  # bytes of decompressed MiniDebugInfo accepted


class ElfFormatError(Exception):
    """The file is not an ELF file this module can use (any parse error ends here)."""


@dataclass(frozen=True, slots=True)
class RawSymbols:
    """Function symbols of one symbol table: (start, end, preference, name offset) tuples, plus
    the string table the name offsets point into. ``end`` is None for a zero-sized symbol."""

    strtab: bytes
    entries: list[tuple[int, int | None, int, int]]
    section_ends: dict[int, int]  # start -> end of the executable section holding a 0-sized symbol


@dataclass(slots=True)
class ElfInfo:
    elf_type: str  # "ET_EXEC" | "ET_DYN" | ...
    build_id: str
    debuglink: tuple[str, int] | None  # (file name, crc32)
    loads: tuple[tuple[int, int, int], ...]  # PT_LOAD (p_offset, p_filesz, p_vaddr)
    symtab: RawSymbols | None = None  # None when stripped (or only NOBITS)
    dynsym: RawSymbols | None = None
    gnu_debugdata: bytes = b""  # MiniDebugInfo: an xz-compressed ELF holding a .symtab (Fedora, RHEL)

    def file_offset_to_vaddr(self, offset: int) -> int | None:
        """Virtual address (as used by the symbol table) of a file offset, through the PT_LOAD
        segment holding it. This one formula covers ET_EXEC (p_vaddr absolute) and ET_DYN
        (p_vaddr relative to a load bias chosen at run time) alike, because the runtime mapping
        is expressed as a file offset first (`/proc/PID/maps` offset column)."""
        for p_offset, p_filesz, p_vaddr in self.loads:
            if p_offset <= offset < p_offset + p_filesz:
                return offset - p_offset + p_vaddr
        return None


def read_elf(stream: BinaryIO, file_size: int) -> ElfInfo:
    """Parse ``stream``; raises ElfFormatError for anything that is not a usable ELF file."""
    try:
        return _read_elf(stream, file_size)
    except ElfFormatError:
        raise
    except Exception as exc:  # pyelftools raises many types (ELFError, construct, struct, ...)
        raise ElfFormatError(f"{type(exc).__name__}: {exc}") from None


def read_elf_layout(stream: BinaryIO) -> ElfInfo:
    """Only the build id and the load segments (no symbol tables: a fraction of read_elf's work and
    memory), for who needs to place an object's addresses, not to name them."""
    try:
        stream.seek(0)
        if stream.read(4) != b"\x7fELF":
            raise ElfFormatError("not an ELF file")
        elf = ELFFile(stream)
        loads = []
        build_id = ""
        for seg in elf.iter_segments():
            if seg["p_type"] == "PT_LOAD":
                loads.append((int(seg["p_offset"]), int(seg["p_filesz"]), int(seg["p_vaddr"])))
            elif seg["p_type"] == "PT_NOTE" and not build_id:
                build_id = _build_id(seg)
        return ElfInfo(elf_type=str(elf["e_type"]), build_id=build_id, debuglink=None, loads=tuple(loads))
    except ElfFormatError:
        raise
    except Exception as exc:  # pyelftools raises many types (ELFError, construct, struct, ...)
        raise ElfFormatError(f"{type(exc).__name__}: {exc}") from None


def _read_elf(stream: BinaryIO, file_size: int) -> ElfInfo:
    stream.seek(0)
    if stream.read(4) != b"\x7fELF":
        raise ElfFormatError("not an ELF file")
    elf = ELFFile(stream)
    loads = []
    for seg in elf.iter_segments():
        if seg["p_type"] == "PT_LOAD":
            loads.append((int(seg["p_offset"]), int(seg["p_filesz"]), int(seg["p_vaddr"])))
    info = ElfInfo(
        elf_type=str(elf["e_type"]),
        build_id="",
        debuglink=None,
        loads=tuple(loads),
    )
    sections = list(elf.iter_sections())
    for sec in sections:
        stype = sec["sh_type"]
        if stype == "SHT_NOTE" and not info.build_id:
            info.build_id = _build_id(sec)
        elif sec.name == ".gnu_debuglink" and stype != _SHT_NOBITS:
            info.debuglink = _debuglink(_section_bytes(stream, sec, file_size))
        elif sec.name == ".gnu_debugdata" and stype != _SHT_NOBITS:
            info.gnu_debugdata = _section_bytes(stream, sec, file_size)
    if not info.build_id:
        for seg in elf.iter_segments():
            if seg["p_type"] == "PT_NOTE":
                info.build_id = _build_id(seg)
                if info.build_id:
                    break
    exec_ends = {
        i: int(s["sh_addr"]) + int(s["sh_size"]) for i, s in enumerate(sections) if int(s["sh_flags"]) & _SHF_EXECINSTR
    }
    fmt = _symbol_format(elf.elfclass, elf.little_endian)
    for sec in sections:
        stype = sec["sh_type"]
        if stype not in ("SHT_SYMTAB", "SHT_DYNSYM"):
            continue
        link = int(sec["sh_link"])
        if not 0 < link < len(sections):
            continue
        strsec = sections[link]
        if stype == _SHT_NOBITS or strsec["sh_type"] == _SHT_NOBITS:
            continue
        data = _section_bytes(stream, sec, file_size)
        strtab = _section_bytes(stream, strsec, file_size)
        raw = _function_symbols(data, strtab, fmt, elf.elfclass, exec_ends)
        if stype == "SHT_SYMTAB":
            info.symtab = raw
        else:
            info.dynsym = raw
    return info


def read_minidebuginfo(info: ElfInfo) -> RawSymbols | None:
    """The .symtab of the file's MiniDebugInfo (``.gnu_debugdata``): the local function symbols
    that .dynsym lacks, as distributions that strip binaries keep them. None when absent or bad."""
    if not info.gnu_debugdata:
        return None
    try:
        decompressor = lzma.LZMADecompressor()
        image = decompressor.decompress(info.gnu_debugdata, max_length=_MINIDEBUG_MAX)
        if not decompressor.eof:
            return None  # truncated, or larger than any real one
        inner = read_elf(io.BytesIO(image), len(image))
    except (lzma.LZMAError, ElfFormatError):
        return None
    return inner.symtab


def _section_bytes(stream: BinaryIO, sec, file_size: int) -> bytes:  # type: ignore[no-untyped-def]
    if sec["sh_type"] == _SHT_NOBITS:
        return b""
    offset, size = int(sec["sh_offset"]), int(sec["sh_size"])
    if offset < 0 or size < 0 or offset + size > file_size:
        raise ElfFormatError(f"section {sec.name!r} extends past the end of the file")
    stream.seek(offset)
    return stream.read(size)


def _build_id(note_container) -> str:  # type: ignore[no-untyped-def]
    for note in note_container.iter_notes():
        if note["n_type"] == "NT_GNU_BUILD_ID" and note["n_name"] == "GNU":
            desc = note["n_desc"]
            return desc if isinstance(desc, str) else bytes(desc).hex()
    return ""


def _debuglink(data: bytes) -> tuple[str, int] | None:
    nul = data.find(b"\0")
    if nul <= 0:
        return None
    crc_at = (nul + 4) & ~3  # name, NUL, padding to 4, then the CRC32 of the debug file
    if crc_at + 4 > len(data):
        return None
    name = data[:nul].decode("utf-8", "surrogateescape")
    if "/" in name:
        return None
    return name, int.from_bytes(data[crc_at : crc_at + 4], "little")


def _symbol_format(elfclass: int, little_endian: bool) -> struct.Struct:
    order = "<" if little_endian else ">"
    if elfclass == 64:
        return struct.Struct(order + "IBBHQQ")  # st_name, st_info, st_other, st_shndx, st_value, st_size
    return struct.Struct(order + "IIIBBH")  # st_name, st_value, st_size, st_info, st_other, st_shndx


# Preference among symbols at one address (higher wins): global over weak over local, as perf does.
_BIND_RANK = {_STB_GLOBAL: 2, _STB_WEAK: 1, _STB_LOCAL: 0}


def _function_symbols(
    data: bytes, strtab: bytes, fmt: struct.Struct, elfclass: int, exec_ends: dict[int, int]
) -> RawSymbols:
    usable = len(data) - len(data) % fmt.size
    entries: list[tuple[int, int | None, int, int]] = []
    section_ends: dict[int, int] = {}
    strtab_len = len(strtab)
    append = entries.append
    if elfclass == 64:
        rows: Iterable[tuple[int, ...]] = fmt.iter_unpack(data[:usable])
    else:
        rows = ((n, i, o, s, v, z) for n, v, z, i, o, s in fmt.iter_unpack(data[:usable]))
    for name, st_info, _other, shndx, value, size in rows:
        stype = st_info & 0xF
        if (
            value == 0
            or shndx == 0
            or shndx >= _SHN_LORESERVE
            or name == 0
            or name >= strtab_len
            or not (stype in _FUNCTION_TYPES or (stype == _STT_NOTYPE and shndx in exec_ends))
        ):
            continue
        rank = _BIND_RANK.get(st_info >> 4, 0) * 2 + (1 if size else 0)
        if size:
            append((value, value + size, rank, name))
        else:
            append((value, None, rank, name))
            end = exec_ends.get(shndx)
            if end is not None and end > value:
                section_ends[value] = end
    return RawSymbols(strtab, entries, section_ends)


@dataclass(slots=True)
class SymbolTable:
    """Sorted, non-overlapping-by-start function ranges with lazily decoded names."""

    # Machine-word arrays, not lists: a list holds a 32-byte int object per entry, and a process
    # maps libraries with tens of thousands of functions each (libLLVM: 70,000).
    starts: array[int] = field(default_factory=lambda: array("Q"))
    ends: array[int] = field(default_factory=lambda: array("Q"))
    refs: array[int] = field(default_factory=lambda: array("Q"))  # name offset * 4 + index into strtabs
    strtabs: list[bytes] = field(default_factory=list)

    @classmethod
    def build(cls, sources: Iterable[RawSymbols | None]) -> SymbolTable:
        """Merge symbol tables (earlier sources preferred at equal addresses and rank)."""
        # One dict pass instead of sorting every candidate: .symtab and .dynsym mostly repeat each
        # other, so the merged table is about half the candidates (and sorting ints is cheap).
        best: dict[int, tuple[int, int, int | None, int]] = {}  # start -> (rank, -source, end, ref)
        sized_end: dict[int, int] = {}
        section_ends: dict[int, int] = {}
        strtabs: list[bytes] = []
        for raw in sources:
            if raw is None or not raw.entries:
                continue
            index = len(strtabs)
            strtabs.append(raw.strtab)
            get = best.get
            for start, end, rank, off in raw.entries:
                current = get(start)
                if current is None or (rank, -index) > current[:2]:
                    best[start] = (rank, -index, end, off * 4 + index)
                if end is not None and end > sized_end.get(start, 0):
                    sized_end[start] = end
            for k, v in raw.section_ends.items():
                section_ends.setdefault(k, v)
        starts = sorted(best)
        ends: list[int | None] = []
        refs: list[int] = []
        for start in starts:
            _rank, _src, end, ref = best[start]
            # An unsized alias takes its sized twin's extent.
            ends.append(end if end is not None else sized_end.get(start))
            refs.append(ref)
        # A zero-sized symbol (hand-written assembly) reaches to the next symbol, within its section.
        n = len(starts)
        final_ends: list[int] = []
        for i in range(n):
            end = ends[i]
            if end is None:
                limit = section_ends.get(starts[i], starts[i] + 1)
                end = min(starts[i + 1], limit) if i + 1 < n else limit
            final_ends.append(end)
        return cls(array("Q", starts), array("Q", final_ends), array("Q", refs), strtabs)

    def __len__(self) -> int:
        return len(self.starts)

    def lookup(self, vaddr: int) -> str | None:
        """Name of the function whose [start, end) holds ``vaddr``, or None (never the previous
        function when the address lies past its end)."""
        i = bisect_right(self.starts, vaddr) - 1
        # A symbol may sit inside a larger one (nested ranges): look back a few entries.
        for j in range(i, max(i - 4, -1), -1):
            if vaddr < self.ends[j]:
                return self.name_at(j)
        return None

    def name_at(self, index: int) -> str:
        ref = self.refs[index]
        tab = self.strtabs[ref & 3]
        off = ref >> 2
        end = tab.find(b"\0", off)
        if end < 0:
            end = len(tab)
        return tab[off:end].decode("utf-8", "replace")
