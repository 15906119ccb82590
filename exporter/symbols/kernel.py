"""Kernel symbols from ``/proc/kallsyms``.

Only text symbols (types t/T) are kept, sorted once. kallsyms has no sizes, so a symbol reaches
to the next one; module symbols are additionally bounded by the module's core section from
``/proc/modules`` and core kernel symbols by ``_etext`` when present. The table is reloaded when
``/proc/modules`` changes (a module was loaded or removed). With ``kernel.kptr_restrict`` (or a
reader without CAP_SYSLOG) every address reads as zero: that is reported once and kernel frames
become ``[unknown]``.
"""

from __future__ import annotations

import logging
import time
from bisect import bisect_right

from exporter.snapshot import Frame, FrameKind

__all__ = ["KernelSymbols"]

log = logging.getLogger(__name__)

KERNEL_MODULE = "[kernel]"
UNKNOWN_KERNEL = Frame("[unknown]", FrameKind.PLACEHOLDER, KERNEL_MODULE)
_MODULES_CHECK_INTERVAL = 1.0  # s between /proc/modules checks
_MISS_RELOAD_INTERVAL = 30.0  # s between reloads caused by unknown addresses (e.g. new BPF programs)
_CACHE_LIMIT = 1 << 16
_UNBOUNDED_EXTENT = 1 << 16  # bytes a symbol without a known module extent may cover


class KernelSymbols:
    def __init__(self, kallsyms_path: str = "/proc/kallsyms", modules_path: str = "/proc/modules") -> None:
        self._kallsyms_path = kallsyms_path
        self._modules_path = modules_path
        self._starts: list[int] = []
        self._names: list[str] = []
        self._modules: list[str] = []  # "" for the core kernel
        self._text_start = 0
        self._text_end = 0
        self._module_ranges: dict[str, tuple[int, int]] = {}
        self._modules_text: bytes | None = None
        self._checked_at = 0.0
        self._missed_reload_at = 0.0
        self._hidden_reported = False
        self._loaded = False
        self._cache: dict[int, Frame] = {}

    @property
    def hidden(self) -> bool:
        """True when kallsyms showed only zero addresses (kptr_restrict)."""
        return self._hidden_reported and not self._starts

    def __len__(self) -> int:
        self._ensure_current()
        return len(self._starts)

    def resolve(self, address: int) -> Frame:
        cache = self._cache
        frame = cache.get(address)
        if frame is not None:
            return frame
        self._ensure_current()
        frame = self._resolve(address)
        if frame is None and time.monotonic() - self._missed_reload_at > _MISS_RELOAD_INTERVAL:
            self._missed_reload_at = time.monotonic()
            self._load()
            frame = self._resolve(address)
        if frame is None:
            return UNKNOWN_KERNEL
        if len(cache) >= _CACHE_LIMIT:
            cache.clear()
        cache[address] = frame
        return frame

    def _resolve(self, address: int) -> Frame | None:
        i = bisect_right(self._starts, address) - 1
        if i < 0 or address == 0:
            return None
        module = self._modules[i]
        if module:
            bounds = self._module_ranges.get(module)
            if bounds is None:
                # [bpf], [__builtin__ftrace], ...: no extent is published; do not let the last
                # one claim everything above it.
                bounds = (self._starts[i], self._starts[i] + _UNBOUNDED_EXTENT)
            if not bounds[0] <= address < bounds[1]:
                return None
            base = bounds[0]
            return Frame(f"{self._names[i]} [{module}]", FrameKind.KERNEL, module, address - base)
        if self._text_end and address >= self._text_end and i + 1 == len(self._starts):
            return None
        return Frame(self._names[i], FrameKind.KERNEL, KERNEL_MODULE, address - self._text_start)

    def _ensure_current(self) -> None:
        now = time.monotonic()
        if self._loaded and now - self._checked_at < _MODULES_CHECK_INTERVAL:
            return
        self._checked_at = now
        modules = self._read_modules_text()
        if not self._loaded or modules != self._modules_text:
            self._modules_text = modules
            self._load()

    def _read_modules_text(self) -> bytes | None:
        try:
            with open(self._modules_path, "rb") as f:
                return f.read()
        except OSError:
            return None

    def _load(self) -> None:
        self._loaded = True
        self._cache.clear()
        rows: list[tuple[int, str, str]] = []
        saw_symbols = False
        text_start = text_end = 0
        try:
            with open(self._kallsyms_path, "rb") as f:
                data = f.read()
        except OSError as exc:
            log.warning("cannot read %s (%s): kernel frames will be [unknown]", self._kallsyms_path, exc)
            data = b""
        for line in data.split(b"\n"):
            parts = line.split()
            if len(parts) < 3:
                continue
            saw_symbols = True
            kind = parts[1]
            if kind not in (b"t", b"T"):
                continue
            try:
                address = int(parts[0], 16)
            except ValueError:
                continue
            if address == 0:
                continue
            name = parts[2].decode("utf-8", "replace")
            module = ""
            if len(parts) > 3 and parts[3].startswith(b"["):
                module = parts[3].strip(b"[]").decode("utf-8", "replace")
            elif name == "_stext" or (name == "_text" and not text_start):
                text_start = address
            elif name == "_etext":
                text_end = address
            rows.append((address, name, module))
        rows.sort(key=lambda r: r[0])
        self._starts = [r[0] for r in rows]
        self._names = [r[1] for r in rows]
        self._modules = [r[2] for r in rows]
        self._text_start = text_start
        self._text_end = text_end
        self._module_ranges = self._parse_modules(self._modules_text)
        if saw_symbols and not rows and not self._hidden_reported:
            self._hidden_reported = True
            log.warning(
                "%s lists only zero addresses: kernel pointers are hidden (sysctl kernel.kptr_restrict=%s; "
                "reading them needs CAP_SYSLOG and kptr_restrict<2). Kernel frames will be [unknown]; "
                "run as root or set kernel.kptr_restrict=0.",
                self._kallsyms_path,
                _read_sysctl("/proc/sys/kernel/kptr_restrict"),
            )
        log.debug("loaded %d kernel text symbols", len(rows))

    @staticmethod
    def _parse_modules(text: bytes | None) -> dict[str, tuple[int, int]]:
        ranges: dict[str, tuple[int, int]] = {}
        for line in (text or b"").split(b"\n"):
            parts = line.split()
            if len(parts) < 6:
                continue
            try:
                size, base = int(parts[1]), int(parts[5], 16)
            except ValueError:
                continue
            if base:
                ranges[parts[0].decode("utf-8", "replace")] = (base, base + size)
        return ranges


def _read_sysctl(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return "?"
