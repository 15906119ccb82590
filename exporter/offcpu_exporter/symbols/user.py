"""User-space address -> Frame for the processes seen so far: through the process's mappings to
the symbols of the ELF file (or vDSO) mapped there, else through its perf map (JIT code)."""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Sequence

from offcpu_exporter.interned import Interned
from offcpu_exporter.snapshot import Frame, FrameKind
from offcpu_exporter.symbols.filecache import SymbolFileCache
from offcpu_exporter.symbols.frames import JIT_MODULE, UNKNOWN, VDSO, placeholder
from offcpu_exporter.symbols.mapped import FileKey, MappedFile, open_mapped_file
from offcpu_exporter.symbols.proc_maps import Mapping
from offcpu_exporter.symbols.process import ProcessState
from offcpu_exporter.symbols.symbolfile import SymbolFile, load_mapped_file, load_vdso_image

__all__ = ["UserSymbols"]

log = logging.getLogger(__name__)

_VDSO_MAX = 1 << 20


class UserSymbols:
    """Not thread-safe and not guarded against errors: :class:`Symbolizer` does both."""

    def __init__(
        self, proc_root: str, *, max_cached_files: int, debug_dirs: Sequence[str], maps_refresh_interval: float
    ) -> None:
        self._proc_root = proc_root
        self._debug_dirs = tuple(debug_dirs)
        self._refresh_interval = maps_refresh_interval
        self._files = SymbolFileCache(max_cached_files)
        self._processes: dict[int, ProcessState] = {}
        self._frames: Interned[Frame] = Interned()

    @property
    def cached_files(self) -> int:
        return len(self._files)

    # -- processes -------------------------------------------------------------------------------

    def process(self, pid: int) -> ProcessState:
        """The state of `pid`, its maps read when first seen."""
        proc = self._processes.get(pid)
        if proc is None:
            proc = ProcessState(pid, self._proc_root)
            self._processes[pid] = proc
            proc.read_maps()
        return proc

    def known(self, pid: int) -> ProcessState | None:
        return self._processes.get(pid)

    def prepare(self, proc: ProcessState) -> None:
        """Load every file `proc` maps, its vDSO and its perf map now."""
        for mapping in proc.maps.mappings:
            if mapping.path == VDSO:
                self._vdso(proc, mapping)
            elif mapping.is_file:
                self._mapped_file(proc, mapping)
        # JIT runtimes (V8) also run code from mappings not marked executable in maps.
        proc.refresh_perf_map()

    @staticmethod
    def refresh(proc: ProcessState) -> None:
        """Re-read the maps and the perf map of `proc` now, unthrottled."""
        if proc.read_maps():
            proc.refresh_perf_map(owner_checked=True)

    def forget(self, pid: int) -> None:
        """Drop the state of `pid`, and the files no other process maps."""
        if self._processes.pop(pid, None) is not None:
            self._files.release(pid)

    # -- addresses -------------------------------------------------------------------------------

    def resolve(self, proc: ProcessState, address: int) -> Frame:
        """The frame of `address`, not found in `proc.frames` (cached there if it will hold)."""
        mapping = proc.maps.find(address)
        if mapping is None and time.monotonic() - proc.maps_read_at >= self._refresh_interval:
            # Not in any known mapping: a library dlopen'ed (or code mapped) since the last read.
            proc.read_maps()
            mapping = proc.maps.find(address)
        if mapping is None:
            return self._jit(proc, address) or UNKNOWN  # not cached: the next re-read may find it
        frame = self._resolve_in_mapping(proc, mapping, address)
        if frame.kind is FrameKind.PLACEHOLDER and not mapping.is_file and mapping.path != VDSO:
            return frame  # anonymous memory: its perf map may name it later
        # Processes running the same program name the same frames: each is kept once.
        frame = self._frames.one(frame)
        proc.cache_frame(address, frame)
        return frame

    def _resolve_in_mapping(self, proc: ProcessState, mapping: Mapping, address: int) -> Frame:
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

    def _jit(self, proc: ProcessState, address: int) -> Frame | None:
        name = proc.jit_name(address, self._refresh_interval)
        return Frame(name, FrameKind.JIT, JIT_MODULE) if name is not None else None

    # -- files -----------------------------------------------------------------------------------

    def _mapped_file(self, proc: ProcessState, mapping: Mapping) -> SymbolFile | None:
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
            sym = load_mapped_file(mapped, mapping.path, f"{proc.path}/root", self._debug_dirs)
            self._files.store(mapped.key, sym, proc.pid)
        return sym

    def _vdso(self, proc: ProcessState, mapping: Mapping) -> SymbolFile | None:
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
            with open(f"{proc.path}/mem", "rb") as f:
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
