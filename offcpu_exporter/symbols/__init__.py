"""Turning kernel and user stack addresses into frames.

``Symbolizer`` is the one entry point the pipeline uses. It never raises: an address that cannot
be named becomes a placeholder frame (``[unknown] libfoo.so+0x1a2b``, or ``[unknown]`` when no
mapping holds it) and is counted in :attr:`Symbolizer.failures`.

Where names come from:
- kernel: ``/proc/kallsyms`` (see :mod:`offcpu_exporter.symbols.kernel`);
- user: the ELF files of the executable mappings in ``/proc/PID/maps``, opened through
  ``/proc/PID/map_files/`` (the very file mapped, even when deleted or replaced) or else through
  ``/proc/PID/root`` (containers), their ``.symtab``/``.dynsym`` or those of a separate debug file
  (:mod:`offcpu_exporter.symbols.debuginfo`); the vDSO image read from the process's memory;
- JIT code: ``/tmp/perf-PID.map`` inside the process's root (:mod:`offcpu_exporter.symbols.perfmap`).

Symbol tables are cached by file identity (device, inode, size, mtime), shared by every process
mapping the file, bounded (LRU) and dropped when the last process using them is forgotten.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from offcpu_exporter.procstat import start_ticks
from offcpu_exporter.ratelimit import RateLimitedLog
from offcpu_exporter.snapshot import Frame, FrameKind
from offcpu_exporter.symbols.debuginfo import DEFAULT_DEBUG_DIRS
from offcpu_exporter.symbols.filecache import SymbolFileCache
from offcpu_exporter.symbols.frames import JIT_MODULE, UNKNOWN, VDSO, placeholder
from offcpu_exporter.symbols.kernel import KernelSymbols
from offcpu_exporter.symbols.mapped import FileKey, MappedFile, open_mapped_file
from offcpu_exporter.symbols.maps import Mapping, ProcessMaps, parse_maps
from offcpu_exporter.symbols.perfmap import PerfMap
from offcpu_exporter.symbols.rootfs import resolve_in_root
from offcpu_exporter.symbols.symbolfile import SymbolFile, load_mapped_file, load_vdso_image

__all__ = ["UNKNOWN", "Symbolizer"]

log = logging.getLogger(__name__)

_PID_CACHE_LIMIT = 1 << 16  # resolved frames kept per process (cleared when the maps change)
_VDSO_MAX = 1 << 20
_ERROR_LOG_INTERVAL = 60.0




@dataclass(slots=True)
class _Process:
    pid: int
    maps: ProcessMaps = field(default_factory=lambda: ProcessMaps([]))
    maps_read_at: float = -1e9
    files: dict[tuple[int, int], MappedFile | None] = field(default_factory=dict)
    frames: dict[int, Frame] = field(default_factory=dict)
    perf_map: PerfMap | None = None
    perf_map_checked_at: float = -1e9
    nspid: int | None = None
    generation: int = 0  # bumped whenever its maps or perf map changed: names may differ now
    start_ticks: int | None = None  # of the process first read under this pid


class Symbolizer:
    """Kernel and user address -> Frame, cached; see the module docstring."""

    def __init__(
        self,
        proc_root: str = "/proc",
        *,
        max_cached_files: int = 512,
        kallsyms_path: str = "/proc/kallsyms",
        debug_dirs: Sequence[str] = DEFAULT_DEBUG_DIRS,
        maps_refresh_interval: float = 1.0,
    ) -> None:
        self._proc_root = proc_root.rstrip("/") or "/"
        self._debug_dirs = tuple(debug_dirs)
        self._refresh_interval = maps_refresh_interval
        modules_path = os.path.join(os.path.dirname(kallsyms_path) or ".", "modules")
        self._kernel = KernelSymbols(kallsyms_path, modules_path)
        self._files = SymbolFileCache(max_cached_files)
        self._processes: dict[int, _Process] = {}
        self._failures = 0
        self._lock = threading.Lock()
        self._errors = RateLimitedLog(log, _ERROR_LOG_INTERVAL)
        self._unexpected_errors = 0

    # -- public interface -------------------------------------------------------------------

    @property
    def failures(self) -> int:
        """Frames returned as placeholders so far (cumulative)."""
        return self._failures

    def kernel(self, addresses: Sequence[int]) -> tuple[Frame, ...]:
        """Kernel frames for ``addresses``, in the same order (leaf first in, leaf first out)."""
        with self._lock:
            out = []
            for address in addresses:
                try:
                    frame = self._kernel.resolve(int(address))
                except Exception as exc:
                    self._log_error("kernel address", exc)
                    frame = UNKNOWN
                if frame.kind is FrameKind.PLACEHOLDER:
                    self._failures += 1
                out.append(frame)
            return tuple(out)

    def user(self, pid: int, addresses: Sequence[int]) -> tuple[Frame, ...]:
        """Frames for user-space ``addresses`` of process ``pid``, in the same order."""
        with self._lock:
            try:
                proc = self._process(pid)
            except Exception as exc:
                self._log_error(f"process {pid}", exc)
                self._failures += len(addresses)
                return (UNKNOWN,) * len(addresses)
            out = []
            frames = proc.frames
            for address in addresses:
                frame = frames.get(address)
                if frame is None:
                    try:
                        frame = self._resolve_user(proc, int(address))
                    except Exception as exc:
                        self._log_error(f"address in process {pid}", exc)
                        frame = UNKNOWN
                if frame.kind is FrameKind.PLACEHOLDER:
                    self._failures += 1
                out.append(frame)
            return tuple(out)

    def prepare(self, pid: int) -> None:
        """Read the maps of a new target and load every mapped ELF file now, while the process is
        alive: a short-lived process may exit before its first flush, and its files can then no
        longer be opened through /proc/PID/map_files or /proc/PID/root."""
        with self._lock:
            try:
                proc = self._process(pid)
                for mapping in proc.maps.mappings:
                    if mapping.path == VDSO:
                        self._vdso(proc, mapping)
                    elif mapping.is_file:
                        self._mapped_file(proc, mapping)
                # JIT runtimes (V8) also run code from mappings not marked executable in maps.
                self._refresh_perf_map(proc)
            except Exception as exc:
                self._log_error(f"process {pid}", exc)

    def generation(self, pid: int) -> int:
        """A number that changes whenever the maps or the perf map of `pid` changed (see refresh)."""
        proc = self._processes.get(pid)
        return proc.generation if proc is not None else 0

    def refresh(self, pid: int) -> int:
        """Re-read the maps and the perf map of a known process now, unthrottled, and return its
        generation: a number that changes whenever either changed. A caller holding stacks with
        unnamed addresses re-symbolizes them when it changed, without waiting for a lookup miss to
        trigger the (throttled) re-read."""
        with self._lock:
            proc = self._processes.get(pid)
            if proc is None:
                return 0
            try:
                if self._read_maps(proc):
                    self._refresh_perf_map(proc, owner_checked=True)
            except Exception as exc:
                self._log_error(f"process {pid}", exc)
            return proc.generation

    def forget(self, pid: int) -> None:
        """The process exited: drop its maps, and the files no other process maps."""
        with self._lock:
            if self._processes.pop(pid, None) is not None:
                self._files.release(pid)

    # -- introspection for tests and self-metrics -------------------------------------------

    @property
    def unexpected_errors(self) -> int:
        """Exceptions caught by the last-resort guard (a bug to fix, not a bad input)."""
        return self._unexpected_errors

    @property
    def cached_files(self) -> int:
        return len(self._files)

    def kernel_symbol_count(self) -> int:
        with self._lock:
            return len(self._kernel)

    # -- processes and mappings ---------------------------------------------------------------

    def _process(self, pid: int) -> _Process:
        proc = self._processes.get(pid)
        if proc is None:
            proc = _Process(pid)
            self._processes[pid] = proc
            self._read_maps(proc)
        return proc

    def _read_maps(self, proc: _Process) -> bool:
        """Re-read the maps; False if another process holds the pid now (nothing was taken)."""
        proc.maps_read_at = time.monotonic()
        try:
            with open(f"{self._proc_root}/{proc.pid}/maps", encoding="utf-8", errors="surrogateescape") as f:
                text = f.read()
        except OSError as exc:
            log.debug("cannot read maps of %d: %s", proc.pid, exc)
            text = ""
        if self._pid_reused(proc):  # checked after the read: then the maps were the process's own
            return False
        mappings = parse_maps(text)
        if not mappings and proc.maps.mappings:
            # The process exited (or its leader is a zombie, whose maps read empty): the maps read
            # while it lived still name the stacks it left in the kernel maps. A stray address from
            # a frame-pointer walk through code built without them must not wipe them.
            log.debug("maps of %d now empty: keeping the %d mappings read before", proc.pid, len(proc.maps.mappings))
            return True
        if mappings == proc.maps.mappings:
            return True  # unchanged: the cached frames still hold
        proc.maps = ProcessMaps(mappings)
        proc.frames.clear()
        proc.generation += 1
        live = {(m.start, m.inode) for m in proc.maps.mappings}
        for k in [k for k in proc.files if k not in live]:
            del proc.files[k]
        return True

    def _pid_reused(self, proc: _Process) -> bool:
        """Whether another process holds the pid now. Its maps and perf map would name the stacks of
        the one that exited with the wrong code: what was read before is kept, and whoever watches
        the new process calls forget() first."""
        started = start_ticks(proc.pid, self._proc_root)
        if proc.start_ticks is None:
            proc.start_ticks = started
        elif started is not None and started != proc.start_ticks:
            log.debug("pid %d now holds a newer process: keeping what was read for the one before", proc.pid)
            return True
        return False

    def _resolve_user(self, proc: _Process, address: int) -> Frame:
        mapping = proc.maps.find(address)
        if mapping is None and time.monotonic() - proc.maps_read_at >= self._refresh_interval:
            # Not in any known mapping: a library dlopen'ed (or code mapped) since the last read.
            self._read_maps(proc)
            mapping = proc.maps.find(address)
        if mapping is None:
            return self._jit(proc, address) or UNKNOWN  # not cached: the next re-read may find it
        frame = self._resolve_in_mapping(proc, mapping, address)
        if frame.kind is FrameKind.PLACEHOLDER and not mapping.is_file and mapping.path != VDSO:
            return frame  # anonymous memory: its perf map may name it later
        frames = proc.frames
        if len(frames) >= _PID_CACHE_LIMIT:
            frames.clear()
        frames[address] = frame
        return frame

    def _resolve_in_mapping(self, proc: _Process, mapping: Mapping, address: int) -> Frame:
        offset = address - mapping.start + mapping.offset
        if mapping.path == VDSO:
            sym = self._vdso(proc, mapping)
            module = VDSO
        elif mapping.is_file:
            sym = self._mapped_file(proc, mapping)
            module = mapping.path
        else:
            return self._jit(proc, address) or placeholder(mapping.path, offset)
        if sym is None:
            # Not ELF (or unreadable): maybe JIT code in a file-backed mapping (memfd, perf map).
            return self._jit(proc, address) or placeholder(module, offset)
        build_id = sym.info.build_id
        vaddr = sym.info.file_offset_to_vaddr(offset)
        name = sym.name(vaddr) if vaddr is not None else None
        if name is None:
            return placeholder(module, offset, build_id)
        return Frame(name, FrameKind.NATIVE, module, offset, build_id)

    # -- files ---------------------------------------------------------------------------------

    def _mapped_file(self, proc: _Process, mapping: Mapping) -> SymbolFile | None:
        slot = (mapping.start, mapping.inode)
        if slot in proc.files:
            mapped = proc.files[slot]
        else:
            mapped = open_mapped_file(self._proc_root, proc.pid, mapping)
            proc.files[slot] = mapped
        if mapped is None:
            return None
        sym = self._files.get(mapped.key, proc.pid)
        if sym is None and mapped.key not in self._files:
            sym = self._load_path(mapped, mapping.path, proc)
        return sym

    def _load_path(self, mapped: MappedFile, binary_path: str, proc: _Process) -> SymbolFile | None:
        sym = load_mapped_file(mapped, binary_path, f"{self._proc_root}/{proc.pid}/root", self._debug_dirs)
        self._files.store(mapped.key, sym, proc.pid)
        return sym

    def _vdso(self, proc: _Process, mapping: Mapping) -> SymbolFile | None:
        slot = (mapping.start, -1)
        mapped = proc.files.get(slot)
        if mapped is not None:
            sym = self._files.get(mapped.key, proc.pid)
            if sym is not None or mapped.key in self._files:
                return sym
        elif slot in proc.files:
            return None
        # The vDSO has no file: read its image from the process's memory. All processes of one
        # kernel (and ABI) share it, so it is cached by content.
        try:
            with open(f"{self._proc_root}/{proc.pid}/mem", "rb") as f:
                f.seek(mapping.start)
                image = f.read(min(mapping.end - mapping.start, _VDSO_MAX))
        except (OSError, OverflowError, ValueError) as exc:
            log.debug("cannot read the vDSO of %d: %s", proc.pid, exc)
            proc.files[slot] = None
            return None
        key: FileKey = (VDSO, hashlib.blake2b(image, digest_size=16).hexdigest())
        proc.files[slot] = MappedFile(key, "")
        sym = self._files.get(key, proc.pid)
        if sym is None and key not in self._files:
            sym = load_vdso_image(image, proc.pid)
            self._files.store(key, sym, proc.pid)
        return sym

    # -- JIT -------------------------------------------------------------------------------------

    def _jit(self, proc: _Process, address: int) -> Frame | None:
        perf_map = proc.perf_map
        name = perf_map.lookup(address) if perf_map is not None else None
        if name is None and time.monotonic() - proc.perf_map_checked_at >= self._refresh_interval:
            self._refresh_perf_map(proc)
            perf_map = proc.perf_map
            name = perf_map.lookup(address) if perf_map is not None else None
        if name is None:
            return None
        return Frame(name, FrameKind.JIT, JIT_MODULE)

    def _refresh_perf_map(self, proc: _Process, *, owner_checked: bool = False) -> None:
        proc.perf_map_checked_at = time.monotonic()
        if not owner_checked and self._pid_reused(proc):
            return
        if proc.nspid is None:
            proc.nspid = _namespace_pid(self._proc_root, proc.pid)
        # The process writes /tmp/perf-<its own pid>.map in its own mount namespace.
        path = resolve_in_root(f"{self._proc_root}/{proc.pid}/root", f"/tmp/perf-{proc.nspid}.map")
        if path is None:
            if proc.perf_map is not None:
                proc.perf_map = None
                proc.frames.clear()
                proc.generation += 1
            return
        if proc.perf_map is None or proc.perf_map.path != path:
            proc.perf_map = PerfMap(path)
        if proc.perf_map.refresh():
            # JIT code moves: frames named from the old map may be stale.
            proc.frames.clear()
            proc.generation += 1

    # -- errors ----------------------------------------------------------------------------------

    def _log_error(self, what: str, exc: Exception) -> None:
        self._unexpected_errors += 1
        self._errors.warning("symbolization error (%s): %s: %s", what, type(exc).__name__, exc)


def _namespace_pid(proc_root: str, pid: int) -> int:
    """The pid as the process itself sees it (innermost PID namespace), from NSpid."""
    try:
        with open(f"{proc_root}/{pid}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        pass
    return pid
