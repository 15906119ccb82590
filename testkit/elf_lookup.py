"""Facts read from an ELF file with pyelftools, to check the exporter's own ELF reader against."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from elftools.construct.lib.container import Container
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import NoteSection, Section, SymbolTableSection
from elftools.elf.sections import Symbol as ElfSymbol


def section(elf: ELFFile, name: str) -> Section:
    found = elf.get_section_by_name(name)
    assert found is not None, f"no section {name}"
    return found


def symbol_table(elf: ELFFile, name: str) -> SymbolTableSection:
    """The symbol table `name` (".symtab", ".dynsym")."""
    found = section(elf, name)
    assert isinstance(found, SymbolTableSection), f"{name} is not a symbol table"
    return found


def symbol(elf: ELFFile, table: str, name: str) -> ElfSymbol:
    """The first symbol called `name` in the symbol table `table`."""
    found = symbol_table(elf, table).get_symbol_by_name(name)
    assert found, f"no symbol {name} in {table}"
    return found[0]


def notes(elf: ELFFile) -> Iterator[Container]:
    """Every note of every note section, in file order."""
    for s in elf.iter_sections():
        if isinstance(s, NoteSection):
            yield from s.iter_notes()


def gnu_build_id(path: str | Path) -> str:
    with open(path, "rb") as f:
        for note in notes(ELFFile(f)):
            if note["n_type"] == "NT_GNU_BUILD_ID":
                return str(note["n_desc"])
    raise AssertionError(f"{path} has no GNU build id")
