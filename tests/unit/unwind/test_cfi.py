"""The tables agree with binutils' own interpretation of the same CFI (``readelf
--debug-dump=frames-interp``) at every row of every FDE, on Debian's libc and python3.11 and on a
program built with -O2 -fomit-frame-pointer."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from offcpu_exporter.unwind import layout
from offcpu_exporter.unwind.objects import object_info, object_table
from offcpu_exporter.unwind.table import UnwindTable
from testkit.workloads import build

TARGET = Path(__file__).resolve().parents[2] / "e2e" / "unwind" / "unwind_target.c"
_FDE = re.compile(r"FDE cie=(\w+) pc=([0-9a-f]+)\.\.([0-9a-f]+)")
_VALUE = re.compile(r"r\d+ \(\w+\)|\S+")
_CIE = re.compile(r"^([0-9a-f]+) [0-9a-f]+ [0-9a-f]+ CIE")


def readelf_rows(path: str) -> list[tuple[int, dict[str, str]]]:
    """(pc, {column: rule}) of every row readelf prints for the FDEs of .eh_frame."""
    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.fail("readelf (binutils) is missing")
    # readelf exits 1 on libc over an unrelated warning (its .gnu_debuglink file is absent); the
    # frames it prints are complete.
    out = subprocess.run([readelf, "--debug-dump=frames-interp", path], capture_output=True, text=True).stdout
    rows: list[tuple[int, dict[str, str]]] = []
    cies: dict[str, dict[str, str]] = {}
    columns: list[str] = []
    cie: str | None = None
    fde: tuple[int, str] | None = None  # (start, its CIE)
    fde_rows = 0
    for line in [*out.splitlines(), ""]:
        if m := _CIE.match(line):
            cie, fde, columns = m.group(1), None, []
        elif m := _FDE.search(line):
            cie, fde, fde_rows, columns = None, (int(m.group(2), 16), m.group(1)), 0, []
        elif line.strip().startswith("LOC"):
            columns = line.split()[1:]
        elif columns and re.match(r"^[0-9a-f]{16} ", line):
            values = _VALUE.findall(line)  # a register rule prints as "r9 (r9)"
            rule = dict(zip(columns, values[1:], strict=True))
            if fde is not None:
                rows.append((int(values[0], 16), rule))
                fde_rows += 1
            elif cie is not None:
                cies[cie] = rule
        elif not line.strip() and fde is not None:
            if fde_rows == 0:  # no instructions: the CIE's initial rules
                rows.append((fde[0], cies[fde[1]]))
            fde = None
    return rows


def expected(rule: dict[str, str]) -> tuple[set[int], int | None, int, int]:
    """(acceptable cfa rules, cfa offset or None, rbp rule, rbp offset) for a readelf row."""
    if rule.get("ra") == "u":
        return {layout.CFA_END}, None, layout.RBP_SAME, 0
    cfa = rule["CFA"]
    if cfa == "exp":
        return {layout.CFA_PLT, layout.CFA_SIGNAL, layout.CFA_BAD}, None, layout.RBP_SAME, 0
    reg, _, offset = cfa.partition("+")
    if reg not in ("rsp", "rbp"):
        return {layout.CFA_BAD}, None, layout.RBP_SAME, 0
    rbp = rule.get("rbp", "u")
    if rbp.startswith("c"):
        rbp_rule, rbp_offset = layout.RBP_OFFSET, int(rbp[1:])
    elif rbp in ("u", "s"):
        rbp_rule, rbp_offset = layout.RBP_SAME, 0
    else:
        return {layout.CFA_BAD}, None, layout.RBP_SAME, 0
    return {layout.CFA_RSP if reg == "rsp" else layout.CFA_RBP}, int(offset), rbp_rule, rbp_offset


def check_against_readelf(path: str) -> UnwindTable:
    table = object_table(path, object_info(path), path, "/", [])
    rows = readelf_rows(path)
    assert len(rows) > 10
    for pc, rule in rows:
        cfa_rules, cfa_offset, rbp_rule, rbp_offset = expected(rule)
        got = table.row_at(pc)
        assert got is not None, (hex(pc), rule)
        _, got_cfa, got_offset, got_rbp_offset, got_rbp = got
        assert got_cfa in cfa_rules, (hex(pc), rule, got)
        if got_cfa in (layout.CFA_RSP, layout.CFA_RBP):
            assert (got_offset, got_rbp, got_rbp_offset) == (cfa_offset, rbp_rule, rbp_offset), (hex(pc), rule, got)
    return table


@pytest.mark.parametrize("path", ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/bin/python3.11"])
def test_stock_debian_objects(path: str) -> None:
    table = check_against_readelf(path)
    assert table.stats["overfull_pages"] == 0


def test_libc_special_rows() -> None:
    table = object_table("/lib/x86_64-linux-gnu/libc.so.6", object_info("/lib/x86_64-linux-gnu/libc.so.6"),
                         "/lib/x86_64-linux-gnu/libc.so.6", "/", [])
    # _start-like outermost frames (clone, clone3), the signal trampoline, the PLT.
    assert table.stats["rows_outermost"] >= 2
    assert table.stats["rows_signal"] == 1
    assert table.stats["rows_plt"] >= 1


def test_program_without_frame_pointers() -> None:
    binary = build(TARGET, "unwind_target", ("-O2", "-fomit-frame-pointer", "-pthread"))
    table = check_against_readelf(str(binary))
    assert table.stats["rows_rbp_based"] >= 1  # frame_vla's alloca


def test_table_round_trips_through_bytes() -> None:
    path = "/lib/x86_64-linux-gnu/libc.so.6"
    table = object_table(path, object_info(path), path, "/", [])
    again = UnwindTable.from_bytes(table.to_bytes())
    assert (again.base, again.rows, again.pages, again.stats) == (table.base, table.rows, table.pages, table.stats)
