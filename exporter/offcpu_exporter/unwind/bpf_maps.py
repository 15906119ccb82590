"""Writing tables and process mappings into the maps that bpf/unwind.h declares,
through a loaded bcc program (the probe's, or the test harness's)."""

from __future__ import annotations

import contextlib
import ctypes
import errno
from array import array
from typing import Any

from offcpu_exporter.unwind import layout

__all__ = ["UnwindMaps"]

_BATCH = 65536  # entries per BPF_MAP_UPDATE_BATCH call


def _libbcc() -> Any:
    import bcc  # only with a loaded program, which bcc made

    return bcc.libbcc.lib


class UnwindMaps:
    """The unwind maps of a loaded program. Not thread-safe: one owner (the Unwinder) writes."""

    def __init__(self, bpf: Any) -> None:
        self._rows = bpf[layout.MAP_ROWS.encode()]
        self._pages = bpf[layout.MAP_PAGES.encode()]
        self._processes = bpf[layout.MAP_PROCESSES.encode()]
        self._mappings = bpf[layout.MAP_MAPPINGS.encode()]
        self._stats = bpf[layout.MAP_STATS.encode()]
        self.max_rows = int(self._rows.max_entries)
        self.max_pages = int(self._pages.max_entries)
        self.max_processes = int(self._processes.max_entries)
        self.max_mappings = int(self._mappings.max_entries)

    def write_rows(self, first: int, data: bytes) -> None:
        self._write(self._rows, first, data, ctypes.sizeof(layout.UnwindRow))

    def write_pages(self, first: int, data: bytes) -> None:
        self._write(self._pages, first, data, ctypes.sizeof(layout.UnwindPage))

    def write_mappings(self, first: int, data: bytes) -> None:
        """Packed struct unwind_mapping entries at [first, ...) of unwind_mappings."""
        self._write(self._mappings, first, data, ctypes.sizeof(layout.UnwindMapping))

    @staticmethod
    def _write(table: Any, first: int, data: bytes, size: int) -> None:
        count = len(data) // size
        for at in range(0, count, _BATCH):
            n = min(_BATCH, count - at)
            # The indices as one array, not n ctypes objects: libLLVM's table has 950,000 rows, and
            # that many small objects fragment the interpreter's heap for good.
            indices = array("i", range(first + at, first + at + n))
            keys = (table.Key * n).from_buffer(indices)
            values = (table.Leaf * n).from_buffer_copy(data, at * size)
            try:
                table.items_update_batch(keys, values)
            except Exception:  # kernels before 5.6: one element at a time
                for key, value in zip(keys, values, strict=True):
                    table[key] = value

    def set_process(self, tgid: int, first: int, count: int) -> None:
        """The process's mappings are entries [first, first + count) of unwind_mappings."""
        table = self._processes
        table[table.Key(tgid)] = table.Leaf.from_buffer_copy(layout.UnwindProcess(first, count))

    def delete_process(self, tgid: int) -> None:
        table = self._processes
        with contextlib.suppress(KeyError):
            del table[table.Key(tgid)]

    # -- reading back (the tables of a process as the BPF walk finds them: see unwind/rows.py) --------

    def read_process(self, tgid: int) -> list[layout.UnwindMapping] | None:
        """The mappings of `tgid` as the walk finds them, None when it has no entry."""
        table = self._processes
        try:
            value = table[table.Key(tgid)]
        except KeyError:
            return None
        process = layout.UnwindProcess.from_buffer_copy(value)
        count = process.count if process.count <= layout.MAX_MAPPINGS else 0
        data = self._read(self._mappings, process.first, count, ctypes.sizeof(layout.UnwindMapping))
        return list((layout.UnwindMapping * count).from_buffer_copy(data))

    def read_page(self, index: int) -> tuple[int, int] | None:
        """(first row, row count) of page entry `index`."""
        table = self._pages
        try:
            page = table[table.Key(index)]
        except (KeyError, IndexError):
            return None
        return int(page.first), int(page.count)

    def read_rows(self, first: int, count: int) -> bytes:
        """Rows [first, first + count) as packed struct unwind_row."""
        return self._read(self._rows, first, count, ctypes.sizeof(layout.UnwindRow))

    @staticmethod
    def _read(table: Any, first: int, count: int, size: int) -> bytes:
        """Entries [first, first + count) of an array, in one BPF_MAP_LOOKUP_BATCH where the kernel
        has it (5.6+), else one lookup each."""
        if count == 0:
            return b""
        keys = (table.Key * count)()
        values = (table.Leaf * count)()
        got = ctypes.c_uint32(count)
        # An array's batch resumes after the key in `in_batch` (generic_map_lookup_batch()).
        token_in, token_out = ctypes.c_uint32(first - 1), ctypes.c_uint32(0)
        lib = _libbcc()
        rc = lib.bpf_lookup_batch(table.map_fd, ctypes.byref(token_in) if first else None, ctypes.byref(token_out),
                                  ctypes.byref(keys), ctypes.byref(values), ctypes.byref(got))
        if (rc == 0 or ctypes.get_errno() == errno.ENOENT) and got.value == count and \
                (count == 0 or getattr(keys[0], "value", keys[0]) == first):
            return bytes(values)
        out = bytearray()
        for index in range(first, first + count):
            out += bytes(table[table.Key(index)])
        assert len(out) == count * size
        return bytes(out)

    def stats(self) -> dict[str, int]:
        """Cumulative walk counters, summed over CPUs, by name (layout.STAT_NAMES)."""
        out = dict.fromkeys(layout.STAT_NAMES.values(), 0)
        for key, per_cpu in self._stats.items():
            name = layout.STAT_NAMES.get(key.value)
            if name is not None:
                out[name] = int(sum(per_cpu))
        return out
