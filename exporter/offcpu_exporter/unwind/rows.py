"""Where a user-space walk (walk.py) finds the row in effect at an address of a process.

- ``MapRows``: read back from the unwind maps, for a process the Unwinder has described: the exact
  rows, mappings and lookups of the BPF walk (unwind_find_mapping(), unwind_find_row()). The
  Unwinder drops a table's rows from memory once they are in the maps, so the maps are where they are.
- ``TableRows``: from tables in hand (the disk cache's, for a process not described), placed at
  the process's mappings the way Unwinder._entry() places them.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

from offcpu_exporter.unwind import layout
from offcpu_exporter.unwind.bpf_maps import UnwindMaps
from offcpu_exporter.unwind.table import UnwindTable
from offcpu_exporter.unwind.walk import Row

__all__ = ["MapRows", "PlacedTable", "TableRows"]

_ROW = struct.Struct("<IihBB")  # struct unwind_row
_MAX_PAGE_ROWS = 1 << layout.SEARCH_STEPS


class MapRows:
    """The rows of process `tgid` as the BPF walk reads them, read back from its maps. Pages read
    are kept for the life of the object: make one per seeding pass (threads of a process and
    processes sharing libc look up the same pages)."""

    def __init__(self, maps: UnwindMaps, tgid: int, pages: dict[int, tuple[list[int], bytes]] | None = None) -> None:
        self._maps = maps
        self._mappings = maps.read_process(tgid) or []
        self._starts = [m.start for m in self._mappings]
        self._pages = pages if pages is not None else {}  # page index -> (row pcs, packed rows)

    @property
    def described(self) -> bool:
        """Whether the process has tables in the maps."""
        return bool(self._mappings)

    def __call__(self, address: int) -> Row | None:
        i = bisect_right(self._starts, address) - 1
        if i < 0:
            return None
        m = self._mappings[i]
        if not m.start <= address < m.end:
            return None
        rel = address - m.bias
        page = rel >> layout.PAGE_SHIFT
        if rel < 0 or page >= m.page_count:
            return None
        rows = self._page_rows(m.page_first + page)
        if rows is None:
            return None
        pcs, packed = rows
        index = max(0, bisect_right(pcs, rel & 0xFFFFFFFF) - 1)
        _, cfa_offset, rbp_offset, cfa_rule, rbp_rule = _ROW.unpack_from(packed, index * _ROW.size)
        return cfa_rule, cfa_offset, rbp_rule, rbp_offset

    def _page_rows(self, index: int) -> tuple[list[int], bytes] | None:
        rows = self._pages.get(index)
        if rows is None:
            page = self._maps.read_page(index)
            if page is None or not 0 < page[1] <= _MAX_PAGE_ROWS:
                return None
            packed = self._maps.read_rows(*page)
            rows = ([_ROW.unpack_from(packed, i * _ROW.size)[0] for i in range(page[1])], packed)
            self._pages[index] = rows
        return rows


@dataclass(frozen=True, slots=True)
class PlacedTable:
    """A table at one executable mapping: table address = process address - bias."""

    start: int
    end: int
    bias: int
    table: UnwindTable


class TableRows:
    def __init__(self, placed: Sequence[PlacedTable]) -> None:
        self._placed = sorted(placed, key=lambda p: p.start)
        self._starts = [p.start for p in self._placed]

    @property
    def described(self) -> bool:
        return bool(self._placed)

    def __call__(self, address: int) -> Row | None:
        i = bisect_right(self._starts, address) - 1
        if i < 0:
            return None
        p = self._placed[i]
        if not p.start <= address < p.end:
            return None
        row = p.table.row_at(address - p.bias + p.table.base)
        if row is None:
            return None
        _, cfa_rule, cfa_offset, rbp_offset, rbp_rule = row
        return cfa_rule, cfa_offset, rbp_rule, rbp_offset
