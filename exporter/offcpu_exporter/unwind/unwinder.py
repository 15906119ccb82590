"""Per process: its executable mappings -> (table, load bias), written into the unwind maps.

``Unwinder.update(pid)`` reads ``/proc/PID/maps``, builds (or takes from the cache) the table of
every mapped ELF object, places each table once in the shared row and page arrays (objects mapped
by many processes share one copy), and writes the process's sorted mapping list. Call it when a
process starts being watched and again whenever its mappings may have changed (dlopen, exec): it
costs one read of the maps when nothing changed. ``forget(pid)`` when it exits.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from offcpu_exporter.ratelimit import RateLimitedLog
from offcpu_exporter.symbols.debuginfo import DEFAULT_DEBUG_DIRS
from offcpu_exporter.symbols.elf import ElfInfo
from offcpu_exporter.symbols.mapped import FileKey, MappedFile, open_mapped_file
from offcpu_exporter.symbols.proc_maps import Mapping, parse_maps
from offcpu_exporter.unwind import layout
from offcpu_exporter.unwind.allocator import RangeAllocator
from offcpu_exporter.unwind.bpf_maps import UnwindMaps
from offcpu_exporter.unwind.cache import TableCache
from offcpu_exporter.unwind.objects import ObjectError, build_in_process, object_layout
from offcpu_exporter.unwind.table import UnwindTable

__all__ = ["MappingUnwind", "Unwinder"]

log = logging.getLogger(__name__)

# What a mapping's frames rely on (MappingUnwind.method).
CFI = "cfi"
FRAME_POINTER = "frame pointer"


@dataclass(frozen=True)
class MappingUnwind:
    """How the frames of one executable mapping are walked, and why."""

    path: str
    start: int
    end: int
    method: str  # CFI | FRAME_POINTER
    why: str  # e.g. "eh_frame, 28,275 rows", "no CFI", "JIT or anonymous code"


@dataclass
class _Object:
    info: ElfInfo | None
    table: UnwindTable | None
    why: str  # when there is no table: the reason
    row_first: int = -1  # placement in the maps, -1 while not placed
    page_first: int = -1
    users: set[int] = field(default_factory=set)
    row_count: int = 0  # the table's size (its rows are dropped once they are in the maps)
    page_count: int = 0

    def __post_init__(self) -> None:
        if self.table is not None:
            self.row_count, self.page_count = self.table.row_count, self.table.page_count


@dataclass
class _Process:
    mappings: list[Mapping]
    keys: set[FileKey]
    described: list[MappingUnwind]
    complete: bool = True  # False: an object's table was missing, look again even if the maps are the same
    maps_digest: bytes = b""  # of /proc/PID/maps as last read
    slots: tuple[int, int] = (0, 0)  # (first, count) of its entries in unwind_mappings


class Unwinder:
    """See the module docstring. Thread-safe; ``update`` may take seconds the first time an object
    is seen (its CFI is parsed), so call it off the flush path."""

    def __init__(
        self,
        maps: UnwindMaps | None,
        *,
        proc_root: str = "/proc",
        debug_dirs: Sequence[str] = DEFAULT_DEBUG_DIRS,
        cache: TableCache | None = None,
        build_table: Callable[[str, ElfInfo, str, str, Sequence[str]], UnwindTable] = build_in_process,
    ) -> None:
        """`build_table`: how a table missing from the cache is made (objects.build_in_process, or
        build.build_in_child to keep the parse's memory out of this process)."""
        self._maps = maps
        self._build_table = build_table
        self._proc_root = proc_root.rstrip("/") or "/"
        self._debug_dirs = tuple(debug_dirs)
        self._cache = cache or TableCache(None)
        self._rows = RangeAllocator(maps.max_rows if maps else 0)
        self._pages = RangeAllocator(maps.max_pages if maps else 0)
        self._slots = RangeAllocator(maps.max_mappings if maps else 0)
        self._objects: dict[FileKey, _Object] = {}
        self._processes: dict[int, _Process] = {}
        self._lock = threading.Lock()
        self.no_space = 0  # tables or processes that did not fit in the maps (walked with frame pointers)
        self._written: set[int] = set()  # processes whose mappings are in the maps
        self._no_room_log = RateLimitedLog(log)  # a full process map refuses every new process alike
        self.truncated = 0  # processes with more than UNWIND_MAX_MAPPINGS objects with tables
        # Updates that did more than find the maps unchanged (the describer trims the heap after those).
        self.changes = 0

    def update(self, pid: int) -> list[MappingUnwind] | None:
        """Bring the tables of ``pid`` up to date; returns what each executable mapping relies on,
        or None when the process is gone."""
        try:
            with open(f"{self._proc_root}/{pid}/maps", "rb") as f:
                raw = f.read()
        except OSError:
            return None
        # A digest, not the text: a large process's maps run to tens of kilobytes.
        digest = hashlib.blake2b(raw, digest_size=16).digest()
        with self._lock:
            known = self._processes.get(pid)
            # The maps compared before they are parsed: the describer looks again at every process
            # every few seconds, and at thousands of processes parsing what did not change was
            # most of its cost.
            if known is not None and known.maps_digest == digest and known.complete:
                return known.described
        mappings = parse_maps(raw.decode("utf-8", errors="surrogateescape"))
        with self._lock:
            known = self._processes.get(pid)
            if known is not None and known.mappings == mappings and known.complete:
                known.maps_digest = digest  # the same mappings, told another way (a [heap] that grew)
                return known.described
        # Tables missing from the cache take seconds to build (tens for the largest objects): built
        # without the lock, which the flush takes to read the statistics, and which a flush held up
        # for that long would publish figures older than the moment it publishes them at.
        opened = [open_mapped_file(self._proc_root, pid, m) if m.is_file else None for m in mappings]
        loaded: dict[FileKey, _Object] = {}
        for m, mapped in zip(mappings, opened, strict=True):
            if mapped is None or mapped.key in loaded:
                continue
            with self._lock:
                if mapped.key in self._objects:
                    continue
            loaded[mapped.key] = self._load(mapped.open_path, m.path, pid)
        with self._lock:
            self.changes += 1
            described = self._update(pid, mappings, opened, self._processes.get(pid), loaded)
            self._processes[pid].maps_digest = digest
            return described

    def forget(self, pid: int) -> None:
        with self._lock:
            known = self._processes.pop(pid, None)
            if known is None:
                return
            if self._maps is not None:
                self._maps.delete_process(pid)
            self._written.discard(pid)
            self._release_slots(known.slots)
            self._release(pid, known.keys)

    @property
    def maps(self) -> UnwindMaps | None:
        """The maps the tables are placed in (read back by unwind/rows.py's MapRows), if any."""
        return self._maps

    def maps_stats(self) -> dict[str, int]:
        """The BPF walk's counters (UnwindMaps.stats), empty without maps."""
        return self._maps.stats() if self._maps is not None else {}

    @property
    def processes(self) -> int:
        """Processes with tables in the maps now (described, without maps). Read without the lock
        (a set's length is one atomic read): the flush reads it, and must never wait for a table."""
        return len(self._written) if self._maps is not None else len(self._processes)

    def describe(self, pid: int) -> list[MappingUnwind]:
        with self._lock:
            known = self._processes.get(pid)
            return list(known.described) if known else []

    def _update(self, pid: int, mappings: list[Mapping], opened: list[MappedFile | None], known: _Process | None,
                loaded: dict[FileKey, _Object]) -> list[MappingUnwind]:
        """Under the lock. `opened`: each mapping's file (None for the others); `loaded`: objects read
        (and their tables built) without the lock."""
        complete = True
        entries: list[layout.UnwindMapping] = []
        described: list[MappingUnwind] = []
        keys: set[FileKey] = set()
        for m, mapped in zip(mappings, opened, strict=True):
            if not m.is_file:
                why = "not a file: no table read" if m.path else "JIT or anonymous code (perf map names it)"
                described.append(MappingUnwind(m.path or "[anonymous]", m.start, m.end, FRAME_POINTER, why))
                continue
            if mapped is None:
                described.append(MappingUnwind(m.path, m.start, m.end, FRAME_POINTER, "file not readable"))
                continue
            obj = self._objects.get(mapped.key) or loaded.get(mapped.key)
            if obj is None:  # released by another process's exit meanwhile: the next update loads it
                complete = False
                described.append(MappingUnwind(m.path, m.start, m.end, FRAME_POINTER, "table not built yet"))
                continue
            self._objects[mapped.key] = obj
            keys.add(mapped.key)
            obj.users.add(pid)
            entry, why = self._entry(obj, m)
            if entry is None:
                described.append(MappingUnwind(m.path, m.start, m.end, FRAME_POINTER, why))
                continue
            entries.append(entry)
            described.append(MappingUnwind(m.path, m.start, m.end, CFI, why))
        if len(entries) > layout.MAX_MAPPINGS:
            self.truncated += 1
            log.warning("process %d maps %d objects with unwind tables; the walk takes the first %d",
                        pid, len(entries), layout.MAX_MAPPINGS)
            entries = entries[: layout.MAX_MAPPINGS]
        slots = self._write_process(pid, sorted(entries, key=lambda e: e.start))
        if known is not None:
            self._release_slots(known.slots)
            self._release(pid, known.keys - keys)
        self._processes[pid] = _Process(mappings, keys, described, complete, slots=slots)
        return described

    def _write_process(self, pid: int, entries: list[layout.UnwindMapping]) -> tuple[int, int]:
        """Writes the mapping entries of `pid` into new slots, then points its process entry at them;
        returns the slots taken. The slots it had before are released by the caller after: a walk
        in progress reads either the old entries or the new ones, never a half-written list."""
        if self._maps is None:
            return (0, 0)
        first = self._slots.allocate(len(entries)) if entries else 0
        if first is None:
            return self._not_written(pid, "no room left for its mappings in unwind_mappings")
        try:
            if entries:
                self._maps.write_mappings(first, b"".join(bytes(e) for e in entries))
            self._maps.set_process(pid, first, len(entries))
        except Exception as exc:  # bcc raises a bare Exception: the map is full (E2BIG)
            self._release_slots((first, len(entries)))
            return self._not_written(pid, exc)
        self._written.add(pid)
        return (first, len(entries))

    def _not_written(self, pid: int, why: object) -> tuple[int, int]:
        """`pid` is walked with frame pointers: counted, logged, and its entry deleted, since the
        slots an old entry points at are released by the caller and another process may take them."""
        assert self._maps is not None
        self.no_space += 1
        self._written.discard(pid)
        self._maps.delete_process(pid)
        self._no_room_log.log(logging.WARNING, "unwind tables of a process not written (%s; %d processes "
                              "have them): frame pointers for it", why, len(self._written))
        return (0, 0)

    def _release_slots(self, slots: tuple[int, int]) -> None:
        first, count = slots
        if count:
            self._slots.release(first, count)

    def _load(self, open_path: str, binary_path: str, pid: int) -> _Object:
        """An object's layout and table, from the cache or built: no lock held, may take seconds."""
        try:
            info = object_layout(open_path)
        except ObjectError as exc:
            obj = _Object(None, None, f"not ELF: {exc}")
        else:
            table = self._cache.get(info.build_id) if info.build_id else None
            why = ""
            if table is None:
                try:
                    table = self._build_table(open_path, info, binary_path, f"{self._proc_root}/{pid}/root",
                                              self._debug_dirs)
                except ObjectError as exc:
                    why = f"no CFI ({exc})"
                else:
                    if info.build_id:
                        self._cache.put(info.build_id, table)
            obj = _Object(info, table, why)
        return obj

    def _entry(self, obj: _Object, m: Mapping) -> tuple[layout.UnwindMapping | None, str]:
        table = obj.table
        if table is None or obj.info is None:
            return None, obj.why
        vaddr = obj.info.file_offset_to_vaddr(m.offset)
        if vaddr is None:
            return None, "mapping outside the object's load segments"
        if obj.row_first < 0 and not self._place(obj, table):
            # Not kept for a later try: a table that does not fit is a large one (libLLVM's rows
            # are 11 MB), and the disk cache gives it back when a new process maps the object.
            obj.table, obj.why = None, "no room left in the unwind maps"
            return None, obj.why
        rows = f"{table.stats.get('source', '')}, {obj.row_count:,} rows"
        bias = m.start - vaddr + table.base
        return layout.UnwindMapping(m.start, m.end, bias, obj.page_first, obj.page_count), rows

    def _place(self, obj: _Object, table: UnwindTable) -> bool:
        if self._maps is None:
            obj.row_first = obj.page_first = 0  # describing only
            return True
        row_first = self._rows.allocate(table.row_count)
        if row_first is None:
            self.no_space += 1
            return False
        page_first = self._pages.allocate(table.page_count)
        if page_first is None:
            self._rows.release(row_first, table.row_count)
            self.no_space += 1
            return False
        pages = array("I", table.pages)
        for i in range(0, len(pages), 2):
            pages[i] += row_first  # the index's rows are relative to the table's first row
        self._maps.write_rows(row_first, table.rows)
        self._maps.write_pages(page_first, pages.tobytes())
        obj.row_first, obj.page_first = row_first, page_first
        # The maps hold the rows now (libLLVM's are 11 MB): only what describes them is kept.
        obj.table = UnwindTable(table.base, b"", b"", table.stats)
        return True

    def _release(self, pid: int, keys: set[FileKey]) -> None:
        for key in keys:
            obj = self._objects.get(key)
            if obj is None:
                continue
            obj.users.discard(pid)
            if obj.users:
                continue
            del self._objects[key]
            if obj.table is not None and obj.row_first >= 0 and self._maps is not None:
                self._rows.release(obj.row_first, obj.row_count)
                self._pages.release(obj.page_first, obj.page_count)

    @property
    def table_bytes_held(self) -> int:
        """Bytes of tables kept in this process: only those of objects described without maps."""
        with self._lock:
            return sum(len(o.table.rows) + len(o.table.pages) for o in self._objects.values() if o.table)

    @property
    def rows_used(self) -> int:
        return self._rows.used
