"""The one entry point the pipeline uses: kernel and user addresses -> frames, thread-safe, never
raising (see :mod:`offcpu_exporter.symbols`)."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence

from offcpu_exporter.ratelimit import RateLimitedLog
from offcpu_exporter.snapshot import Frame, FrameKind
from offcpu_exporter.symbols.debuginfo import DEFAULT_DEBUG_DIRS
from offcpu_exporter.symbols.frames import UNKNOWN
from offcpu_exporter.symbols.kernel import KernelSymbols
from offcpu_exporter.symbols.user import UserSymbols

__all__ = ["Symbolizer"]

log = logging.getLogger(__name__)

_ERROR_LOG_INTERVAL = 60.0


class Symbolizer:
    """Kernel and user address -> Frame, cached; see the package docstring."""

    def __init__(
        self,
        proc_root: str = "/proc",
        *,
        max_cached_files: int = 512,
        kallsyms_path: str = "/proc/kallsyms",
        debug_dirs: Sequence[str] = DEFAULT_DEBUG_DIRS,
        maps_refresh_interval: float = 1.0,
    ) -> None:
        modules_path = os.path.join(os.path.dirname(kallsyms_path) or ".", "modules")
        self._kernel = KernelSymbols(kallsyms_path, modules_path)
        self._user = UserSymbols(
            proc_root.rstrip("/") or "/",
            max_cached_files=max_cached_files,
            debug_dirs=debug_dirs,
            maps_refresh_interval=maps_refresh_interval,
        )
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
                proc = self._user.process(pid)
            except Exception as exc:
                self._log_error(f"process {pid}", exc)
                self._failures += len(addresses)
                return (UNKNOWN,) * len(addresses)
            out = []
            frames = proc.frames  # the hot path (stacks seen before) stays a dict lookup, no call
            for address in addresses:
                frame = frames.get(address)
                if frame is None:
                    try:
                        frame = self._user.resolve(proc, int(address))
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
                self._user.prepare(self._user.process(pid))
            except Exception as exc:
                self._log_error(f"process {pid}", exc)

    def generation(self, pid: int) -> int:
        """A number that changes whenever the maps or the perf map of `pid` changed (see refresh)."""
        proc = self._user.known(pid)
        return proc.generation if proc is not None else 0

    def refresh(self, pid: int) -> int:
        """Re-read the maps and the perf map of a known process now, unthrottled, and return its
        generation: a number that changes whenever either changed. A caller holding stacks with
        unnamed addresses re-symbolizes them when it changed, without waiting for a lookup miss to
        trigger the (throttled) re-read."""
        with self._lock:
            proc = self._user.known(pid)
            if proc is None:
                return 0
            try:
                self._user.refresh(proc)
            except Exception as exc:
                self._log_error(f"process {pid}", exc)
            return proc.generation

    def forget(self, pid: int) -> None:
        """The process exited (or exec'd, or its pid was reused: the target table says which): drop
        its maps, and the files no other process maps."""
        with self._lock:
            self._user.forget(pid)

    # -- introspection for tests and self-metrics -------------------------------------------

    @property
    def unexpected_errors(self) -> int:
        """Exceptions caught by the last-resort guard (a bug to fix, not a bad input)."""
        return self._unexpected_errors

    @property
    def cached_files(self) -> int:
        return self._user.cached_files

    def kernel_address(self, name: str, module: str = "", size: int = 0) -> int | None:
        """Where kernel function ``name`` starts (KernelSymbols.address_of), or None."""
        with self._lock:
            try:
                return self._kernel.address_of(name, module, size)
            except Exception as exc:
                self._log_error("kernel symbol", exc)
                return None

    def kernel_symbol_count(self) -> int:
        with self._lock:
            return len(self._kernel)

    # -- errors ----------------------------------------------------------------------------------

    def _log_error(self, what: str, exc: Exception) -> None:
        self._unexpected_errors += 1
        self._errors.warning("symbolization error (%s): %s: %s", what, type(exc).__name__, exc)
