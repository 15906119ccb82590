"""Writing tables and process mappings into the maps that offcpu_exporter/bpf/unwind.h declares,
through a loaded bcc program (the probe's, or the test harness's)."""

from __future__ import annotations

import contextlib
import ctypes
from array import array
from typing import Any

from offcpu_exporter.unwind import layout

__all__ = ["UnwindMaps"]

_BATCH = 65536  # entries per BPF_MAP_UPDATE_BATCH call


class UnwindMaps:
    """The unwind maps of a loaded program. Not thread-safe: one owner (the Unwinder) writes."""

    def __init__(self, bpf: Any) -> None:
        self._rows = bpf[layout.MAP_ROWS.encode()]
        self._pages = bpf[layout.MAP_PAGES.encode()]
        self._processes = bpf[layout.MAP_PROCESSES.encode()]
        self._stats = bpf[layout.MAP_STATS.encode()]
        self.max_rows = int(self._rows.max_entries)
        self.max_pages = int(self._pages.max_entries)
        self.max_processes = int(self._processes.max_entries)

    def write_rows(self, first: int, data: bytes) -> None:
        self._write(self._rows, first, data, ctypes.sizeof(layout.UnwindRow))

    def write_pages(self, first: int, data: bytes) -> None:
        self._write(self._pages, first, data, ctypes.sizeof(layout.UnwindPage))

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

    def set_process(self, tgid: int, process: layout.UnwindProcess) -> None:
        table = self._processes
        table[table.Key(tgid)] = table.Leaf.from_buffer_copy(process)

    def delete_process(self, tgid: int) -> None:
        table = self._processes
        with contextlib.suppress(KeyError):
            del table[table.Key(tgid)]

    def stats(self) -> dict[str, int]:
        """Cumulative walk counters, summed over CPUs, by name (layout.STAT_NAMES)."""
        out = dict.fromkeys(layout.STAT_NAMES.values(), 0)
        for key, per_cpu in self._stats.items():
            name = layout.STAT_NAMES.get(key.value)
            if name is not None:
                out[name] = int(sum(per_cpu))
        return out
