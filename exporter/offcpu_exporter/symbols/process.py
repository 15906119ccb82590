"""What the symbolizer knows of one process: its executable mappings, the files it maps, its perf
map and the frames already resolved, and when they changed (its generation).

The process's lifecycle is not decided here: the target table reports exec, pid reuse and expiry,
and the pipeline has the symbolizer forget the process. Until then, maps read after the pid was
taken by a newer process are refused (checked by start time), so that the stacks the old process
left in the kernel are not named from the new one's code."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from offcpu_exporter.procstat import start_ticks
from offcpu_exporter.snapshot import Frame
from offcpu_exporter.symbols.mapped import MappedFile
from offcpu_exporter.symbols.perfmap import PerfMap
from offcpu_exporter.symbols.proc_maps import ProcessMaps, parse_maps
from offcpu_exporter.symbols.rootfs import resolve_in_root

__all__ = ["ProcessState"]

log = logging.getLogger(__name__)

_FRAME_CACHE_LIMIT = 1 << 16  # resolved frames kept per process (cleared when the maps change)


@dataclass(slots=True)
class ProcessState:
    pid: int
    proc_root: str
    maps: ProcessMaps = field(default_factory=lambda: ProcessMaps([]))
    maps_read_at: float = -1e9
    # (mapping start, inode; -1 for the vDSO) -> the file it maps, None if it cannot be opened
    files: dict[tuple[int, int], MappedFile | None] = field(default_factory=dict)
    frames: dict[int, Frame] = field(default_factory=dict)
    perf_map: PerfMap | None = None
    perf_map_checked_at: float = -1e9
    nspid: int | None = None
    generation: int = 0  # bumped whenever its maps or perf map changed: names may differ now
    start_ticks: int | None = None  # of the process first read under this pid

    @property
    def path(self) -> str:
        """Its /proc directory."""
        return f"{self.proc_root}/{self.pid}"

    def cache_frame(self, address: int, frame: Frame) -> None:
        frames = self.frames
        if len(frames) >= _FRAME_CACHE_LIMIT:
            frames.clear()
        frames[address] = frame

    def read_maps(self) -> bool:
        """Re-read the maps; False if another process holds the pid now (nothing was taken)."""
        self.maps_read_at = time.monotonic()
        try:
            with open(f"{self.path}/maps", encoding="utf-8", errors="surrogateescape") as f:
                text = f.read()
        except OSError as exc:
            log.debug("cannot read maps of %d: %s", self.pid, exc)
            text = ""
        if self.pid_reused():  # checked after the read: then the maps were the process's own
            return False
        mappings = parse_maps(text)
        if not mappings and self.maps.mappings:
            # The process exited (or its leader is a zombie, whose maps read empty): the maps read
            # while it lived still name the stacks it left in the kernel maps. A stray address from
            # a frame-pointer walk through code built without them must not wipe them.
            log.debug("maps of %d now empty: keeping the %d mappings read before", self.pid, len(self.maps.mappings))
            return True
        if mappings == self.maps.mappings:
            return True  # unchanged: the cached frames still hold
        self.maps = ProcessMaps(mappings)
        self.frames.clear()
        self.generation += 1
        live = {(m.start, m.inode) for m in self.maps.mappings}
        for k in [k for k in self.files if k not in live]:
            del self.files[k]
        return True

    def pid_reused(self) -> bool:
        """Whether another process holds the pid now. Its maps and perf map would name the stacks of
        the one that exited with the wrong code: what was read before is kept, and whoever watches
        the new process calls forget() first."""
        started = start_ticks(self.pid, self.proc_root)
        if self.start_ticks is None:
            self.start_ticks = started
        elif started is not None and started != self.start_ticks:
            log.debug("pid %d now holds a newer process: keeping what was read for the one before", self.pid)
            return True
        return False

    def jit_name(self, address: int, refresh_interval: float) -> str | None:
        """The perf map's name for `address`, re-reading the perf map on a miss (throttled)."""
        perf_map = self.perf_map
        name = perf_map.lookup(address) if perf_map is not None else None
        if name is None and time.monotonic() - self.perf_map_checked_at >= refresh_interval:
            self.refresh_perf_map()
            perf_map = self.perf_map
            name = perf_map.lookup(address) if perf_map is not None else None
        return name

    def refresh_perf_map(self, *, owner_checked: bool = False) -> None:
        self.perf_map_checked_at = time.monotonic()
        if not owner_checked and self.pid_reused():
            return
        if self.nspid is None:
            self.nspid = _namespace_pid(self.path, self.pid)
        # The process writes /tmp/perf-<its own pid>.map in its own mount namespace.
        path = resolve_in_root(f"{self.path}/root", f"/tmp/perf-{self.nspid}.map")
        if path is None:
            if self.perf_map is not None:
                self.perf_map = None
                self.frames.clear()
                self.generation += 1
            return
        if self.perf_map is None or self.perf_map.path != path:
            self.perf_map = PerfMap(path)
        if self.perf_map.refresh():
            # JIT code moves: frames named from the old map may be stale.
            self.frames.clear()
            self.generation += 1


def _namespace_pid(proc_dir: str, pid: int) -> int:
    """The pid as the process itself sees it (innermost PID namespace), from NSpid."""
    try:
        with open(f"{proc_dir}/status") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError, IndexError):
        pass
    return pid
