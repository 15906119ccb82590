"""ELF reading: load segments, symbol ranges (sizes respected), aliases, build id, debuglink."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from offcpu_exporter.symbols.elf import ElfFormatError, RawSymbols, SymbolTable, read_elf
from testkit.elf_lookup import notes, section, symbol

ASM = r"""
    .text
    .globl big
    .type big, @function
big:
    .skip 32, 0x90
    .size big, 32
    .skip 16, 0xcc          # no symbol covers these bytes
    .globl alias_global
    .type alias_global, @function
    .weak alias_weak
    .type alias_weak, @function
alias_global:
alias_weak:
    ret
    .size alias_global, 1
    .size alias_weak, 1
    .globl unsized
unsized:                    # NOTYPE, size 0: reaches to the next symbol
    .skip 8, 0x90
    .globl last
    .type last, @function
last:
    ret
    .size last, 1
    .data
    .globl not_code
not_code:
    .quad 1
"""


@pytest.fixture(scope="module")
def shared_object(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("elf")
    src = d / "t.s"
    src.write_text(ASM)
    out = d / "t.so"
    subprocess.run(["gcc", "-shared", "-nostdlib", "-Wl,--build-id", "-o", str(out), str(src)], check=True, timeout=60)
    return out


def symbol_value(path: Path, name: str) -> int:
    with open(path, "rb") as f:
        return int(symbol(ELFFile(f), ".symtab", name)["st_value"])


def table_of(path: Path) -> SymbolTable:
    with open(path, "rb") as f:
        info = read_elf(f, path.stat().st_size)
    return SymbolTable.build([info.symtab, info.dynsym])


def test_sizes_are_respected(shared_object: Path) -> None:
    table = table_of(shared_object)
    big = symbol_value(shared_object, "big")
    assert table.lookup(big) == "big"
    assert table.lookup(big + 31) == "big"
    assert table.lookup(big + 32) is None  # past big's end: not big
    assert table.lookup(big + 47) is None
    assert table.lookup(big - 1) is None


def test_alias_prefers_global(shared_object: Path) -> None:
    table = table_of(shared_object)
    assert table.lookup(symbol_value(shared_object, "alias_global")) == "alias_global"


def test_unsized_symbol_reaches_the_next(shared_object: Path) -> None:
    table = table_of(shared_object)
    unsized = symbol_value(shared_object, "unsized")
    assert table.lookup(unsized + 7) == "unsized"
    assert table.lookup(unsized + 8) == "last"
    assert table.lookup(unsized + 9) is None
    assert "not_code" not in {table.name_at(i) for i in range(len(table))}


def test_build_id_and_segments(shared_object: Path) -> None:
    with open(shared_object, "rb") as f:
        info = read_elf(f, shared_object.stat().st_size)
        elf = ELFFile(f)
        note = next(notes(elf))
        text = section(elf, ".text")
    assert info.build_id == note["n_desc"]
    assert info.elf_type == "ET_DYN"
    assert info.file_offset_to_vaddr(text["sh_offset"]) == text["sh_addr"]


def test_debuglink(shared_object: Path, tmp_path: Path) -> None:
    debug = tmp_path / "t.debug"
    debug.write_bytes(b"anything")
    linked = tmp_path / "t.so"
    subprocess.run(
        ["objcopy", f"--add-gnu-debuglink={debug}", str(shared_object), str(linked)],
        check=True,
        cwd=tmp_path,
        timeout=60,
    )
    import zlib

    with open(linked, "rb") as f:
        info = read_elf(f, linked.stat().st_size)
    assert info.debuglink == ("t.debug", zlib.crc32(b"anything"))


def test_not_elf(tmp_path: Path) -> None:
    p = tmp_path / "x"
    p.write_bytes(b"#!/bin/sh\necho hi\n")
    with open(p, "rb") as f, pytest.raises(ElfFormatError):
        read_elf(f, p.stat().st_size)


def test_nested_symbol_lookup() -> None:
    strtab = b"\0outer\0inner\0"
    raw = RawSymbols(strtab, [(0x1000, 0x1100, 5, 1), (0x1010, 0x1020, 5, 7)], {})
    table = SymbolTable.build([raw])
    assert table.lookup(0x1015) == "inner"
    assert table.lookup(0x1050) == "outer"  # past inner, still inside outer
    assert table.lookup(0x1100) is None
