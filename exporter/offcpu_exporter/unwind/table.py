"""One object's unwind table as the BPF walk reads it: sorted compact rows plus a page index, and
its serialized form (the disk cache's).

Addresses in a table are relative to its ``base`` (the object address of its first page), so a row
needs 32 bits and the walk computes ``page = (pc - bias) >> UNWIND_PAGE_SHIFT``. Each page entry
points at the row in effect at the page's first byte and counts the rows up to the next page: the
walk's fixed-step binary search then never leaves the page.
"""

from __future__ import annotations

import json
import struct
from array import array
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from offcpu_exporter.unwind import layout
from offcpu_exporter.unwind.cfi import CfiRow, Fde

__all__ = ["TableError", "UnwindTable", "build_table"]

_ROW = struct.Struct("<IihBB")
_PAGE = struct.Struct("<II")
assert _ROW.size == 12 and _PAGE.size == 8
_MAX_PAGE_ROWS = 1 << layout.SEARCH_STEPS
_PAGE_SIZE = 1 << layout.PAGE_SHIFT
_MAGIC = b"OXUW"
_VERSION = 1
_HEADER = struct.Struct("<4sIQIII")  # magic, version, base, rows, pages, stats JSON bytes
_RULE_NAMES = {layout.CFA_PLT: "plt", layout.CFA_SIGNAL: "signal", layout.CFA_END: "outermost",
               layout.CFA_BAD: "unsupported", layout.CFA_RBP: "rbp_based"}


class TableError(Exception):
    """An object whose CFI cannot become a table (none at all, or code spread over 4 GiB)."""


@dataclass
class UnwindTable:
    base: int  # object address of relative address 0 (page-aligned)
    rows: bytes  # packed struct unwind_row, sorted by pc
    pages: bytes  # packed struct unwind_page, `first` relative to this table's row 0
    stats: dict[str, Any] = field(default_factory=dict)  # what the rows are made of, for doctor

    @property
    def row_count(self) -> int:
        return len(self.rows) // _ROW.size

    @property
    def page_count(self) -> int:
        return len(self.pages) // _PAGE.size

    def row_at(self, address: int) -> tuple[int, int, int, int, int] | None:
        """The row in effect at object address ``address`` as the BPF walk finds it (pc, cfa rule,
        cfa offset, rbp offset, rbp rule), or None where the walk would use the frame pointer."""
        rel = address - self.base
        page = rel >> layout.PAGE_SHIFT
        if rel < 0 or page >= self.page_count:
            return None
        first, count = _PAGE.unpack_from(self.pages, page * _PAGE.size)
        if count == 0:
            return None
        pcs = [_ROW.unpack_from(self.rows, (first + i) * _ROW.size)[0] for i in range(count)]
        index = first + bisect_right(pcs, rel) - 1
        pc, cfa_offset, rbp_offset, cfa_rule, rbp_rule = _ROW.unpack_from(self.rows, index * _ROW.size)
        return pc, cfa_rule, cfa_offset, rbp_offset, rbp_rule

    def to_bytes(self) -> bytes:
        meta = json.dumps(self.stats, sort_keys=True).encode()
        header = _HEADER.pack(_MAGIC, _VERSION, self.base, self.row_count, self.page_count, len(meta))
        return header + meta + self.rows + self.pages

    @classmethod
    def from_bytes(cls, data: bytes) -> UnwindTable:
        if len(data) < _HEADER.size:
            raise TableError("truncated table")
        magic, version, base, rows, pages, meta_len = _HEADER.unpack_from(data)
        if magic != _MAGIC or version != _VERSION:
            raise TableError("not a table of this version")
        at = _HEADER.size
        end = at + meta_len + rows * _ROW.size + pages * _PAGE.size
        if len(data) != end:
            raise TableError("table size does not match its header")
        stats = json.loads(data[at : at + meta_len])
        at += meta_len
        row_bytes = data[at : at + rows * _ROW.size]
        at += rows * _ROW.size
        return cls(base, row_bytes, data[at:end], stats)


def build_table(primary: Sequence[Fde], secondary: Sequence[Fde] = ()) -> UnwindTable:
    """The table of an object from its .eh_frame FDEs (``primary``) and, for code they do not
    cover, those of a .debug_frame (``secondary``)."""
    fdes = sorted(primary, key=lambda f: f[0])
    if secondary:
        starts = [f[0] for f in fdes]
        ends = [f[1] for f in fdes]
        extra = [f for f in secondary if not _overlaps(starts, ends, f[0], f[1])]
        fdes = sorted([*fdes, *extra], key=lambda f: f[0])
    if not fdes:
        raise TableError("no FDE")
    rows = _flatten(fdes)
    base = rows[0][0] & ~(_PAGE_SIZE - 1)
    if rows[-1][0] - base >= 1 << 32:
        raise TableError("code spans more than 4 GiB")
    pcs = array("Q", (r[0] - base for r in rows))
    packed = bytearray()
    if pcs[0] != 0:  # every page needs a row in effect at its first byte
        packed += _ROW.pack(0, 0, 0, layout.CFA_NONE, layout.RBP_SAME)
        pcs.insert(0, 0)
    for pc, cfa_rule, cfa_offset, rbp_rule, rbp_offset in rows:
        packed += _ROW.pack(pc - base, cfa_offset, rbp_offset, cfa_rule, rbp_rule)
    page_count = (pcs[-1] >> layout.PAGE_SHIFT) + 1
    pages = bytearray()
    overfull = 0
    for page in range(page_count):
        start = page << layout.PAGE_SHIFT
        first = bisect_right(pcs, start) - 1
        count = bisect_left(pcs, start + _PAGE_SIZE) - first
        if count > _MAX_PAGE_ROWS:
            overfull += 1
            count = 0  # the walk uses the frame pointer in this page
        pages += _PAGE.pack(first, count)
    rules = Counter(r[1] for r in rows)
    stats: dict[str, Any] = {"rows": len(pcs), "pages": page_count, "overfull_pages": overfull, "fdes": len(fdes),
             **{f"rows_{name}": rules[rule] for rule, name in _RULE_NAMES.items()}}
    return UnwindTable(base, bytes(packed), bytes(pages), stats)


def _overlaps(starts: list[int], ends: list[int], start: int, end: int) -> bool:
    i = bisect_right(starts, start) - 1
    if i >= 0 and ends[i] > start:
        return True
    j = i + 1
    return j < len(starts) and starts[j] < end


def _flatten(fdes: list[Fde]) -> list[CfiRow]:
    """One sorted row list: each FDE's rows cut at the next FDE's start, a NONE row where an FDE
    ends before the next begins, the last of several rows at one pc, and runs of equal rules
    merged into their first row."""
    out: list[CfiRow] = []
    none_rule = (layout.CFA_NONE, 0, layout.RBP_SAME, 0)
    for i, (start, end, rows) in enumerate(fdes):
        next_start = fdes[i + 1][0] if i + 1 < len(fdes) else None
        if next_start is not None and next_start < end:
            end = next_start
        for row in rows:
            if start <= row[0] < end:
                _append(out, row)
        if next_start != end:
            _append(out, (end, *none_rule))
    return out


def _append(out: list[CfiRow], row: CfiRow) -> None:
    if out and out[-1][0] == row[0]:
        out.pop()
    if out and out[-1][1:] == row[1:]:
        return
    out.append(row)
