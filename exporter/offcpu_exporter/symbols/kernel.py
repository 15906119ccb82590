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
import re
import time
from array import array
from bisect import bisect_right

from offcpu_exporter.snapshot import Frame, FrameKind

__all__ = ["KernelSymbols"]

log = logging.getLogger(__name__)

KERNEL_MODULE = "[kernel]"
UNKNOWN_KERNEL = Frame("[unknown]", FrameKind.PLACEHOLDER, KERNEL_MODULE)
_MODULES_CHECK_INTERVAL = 1.0  # s between /proc/modules checks
_MISS_RELOAD_INTERVAL = 30.0  # s between reloads caused by unknown addresses (e.g. new BPF programs)
_CACHE_LIMIT = 1 << 16
_UNBOUNDED_EXTENT = 1 << 16  # bytes a symbol without a known module extent may cover
# A text symbol line: "ffffffff81000000 T _text", "ffffffffc0a01000 t nft_do_chain\t[nf_tables]".
_TEXT_SYMBOL = re.compile(rb"^([0-9a-fA-F]+) [tT] ([^\s]+)(?:\t\[([^\]\s]+)\])?", re.M)


class KernelSymbols:
    def __init__(self, kallsyms_path: str = "/proc/kallsyms", modules_path: str = "/proc/modules") -> None:
        self._kallsyms_path = kallsyms_path
        self._modules_path = modules_path
        # ~100,000 text symbols, kept compact (machine-word arrays into the kallsyms text itself)
        # rather than as ~300,000 Python objects: ~2 MB plus the text instead of ~15 MB.
        self._text = b""
        self._starts = array("Q")
        self._name_at = array("I")  # offset of the name in _text (the text symbols' names, joined)
        self._name_end = array("I")
        self._module_of = array("H")  # index into _module_names; 0 is the core kernel
        self._module_names: list[str] = [""]
        self._text_start = 0
        self._text_end = 0
        self._module_ranges: dict[str, tuple[int, int]] = {}
        self._modules_text: bytes | None = None
        self._checked_at = 0.0
        self._missed_reload_at = 0.0
        self._hidden_reported = False
        self._loaded = False
        self._cache: dict[int, Frame] = {}
        # address_of(): text symbols in the order of their names in _text, made on first use.
        self._name_starts = array("I")
        self._name_index = array("I")
        self._address_cache: dict[tuple[str, str, int], int | None] = {}

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

    def address_of(self, name: str, module: str = "", size: int = 0) -> int | None:
        """The start of text symbol ``name`` (of ``module``, "" for the core kernel): the way back
        from the ``name+offset/size`` lines of /proc/PID/stack. Static functions of one name
        in several files have several starts: the one whose extent fits ``size`` best wins."""
        self._ensure_current()
        key = (name, module, size)
        cached = self._address_cache.get(key)
        if cached is not None or key in self._address_cache:
            return cached
        if not self._name_starts and self._starts:
            order = sorted(range(len(self._starts)), key=self._name_at.__getitem__)
            self._name_index = array("I", order)
            self._name_starts = array("I", (self._name_at[i] for i in order))
        wanted = name.encode("utf-8", "surrogateescape")
        module_index = self._module_names.index(module) if module in self._module_names else -1
        best: tuple[int, int] | None = None  # (misfit, address)
        at = self._text.find(wanted)
        while at >= 0 and module_index >= 0:
            j = bisect_right(self._name_starts, at) - 1
            if j >= 0 and self._name_starts[j] == at:
                i = self._name_index[j]
                if self._name_end[i] == at + len(wanted) and self._module_of[i] == module_index:
                    extent = self._starts[i + 1] - self._starts[i] if i + 1 < len(self._starts) else size
                    misfit = extent - size if extent >= size else 1 << 62
                    if best is None or misfit < best[0]:
                        best = (misfit, self._starts[i])
            at = self._text.find(wanted, at + 1)
        address = best[1] if best is not None else None
        if len(self._address_cache) >= _CACHE_LIMIT:
            self._address_cache.clear()
        self._address_cache[key] = address
        return address

    def _resolve(self, address: int) -> Frame | None:
        i = bisect_right(self._starts, address) - 1
        if i < 0 or address == 0:
            return None
        module = self._module_names[self._module_of[i]]
        name = self._text[self._name_at[i] : self._name_end[i]].decode("utf-8", "replace")
        if module:
            bounds = self._module_ranges.get(module)
            if bounds is None:
                # [bpf], [__builtin__ftrace], ...: no extent is published; do not let the last
                # one claim everything above it.
                bounds = (self._starts[i], self._starts[i] + _UNBOUNDED_EXTENT)
            if not bounds[0] <= address < bounds[1]:
                return None
            base = bounds[0]
            return Frame(f"{name} [{module}]", FrameKind.KERNEL, module, address - base)
        if self._text_end and address >= self._text_end and i + 1 == len(self._starts):
            return None
        return Frame(name, FrameKind.KERNEL, KERNEL_MODULE, address - self._text_start)

    def _ensure_current(self) -> None:
        now = time.monotonic()
        if self._loaded and now - self._checked_at < _MODULES_CHECK_INTERVAL:
            return
        self._checked_at = now
        modules = self._read_modules_text()
        if not self._loaded or _modules_layout(modules) != _modules_layout(self._modules_text):
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
        self._address_cache.clear()
        self._name_starts, self._name_index = array("I"), array("I")
        text_start = text_end = 0
        try:
            with open(self._kallsyms_path, "rb") as f:
                data = f.read()
        except OSError as exc:
            log.warning("cannot read %s (%s): kernel frames will be [unknown]", self._kallsyms_path, exc)
            data = b""
        starts, name_at, name_end, module_of = array("Q"), array("I"), array("I"), array("H")
        names = bytearray()  # kept instead of `data`: a third of its size (no data symbols, no addresses)
        module_index: dict[bytes, int] = {b"": 0}
        module_names = [""]
        for m in _TEXT_SYMBOL.finditer(data):
            address = int(m.group(1), 16)
            if address == 0:
                continue
            if data.startswith(b"__pfx_", m.start(2)):
                # Kernels since 6.2 (CONFIG_FUNCTION_PADDING_ALIGNMENT) name the 16 padding bytes
                # before each function: half the table, and never the address of a return.
                continue
            module = m.group(3) or b""
            index = module_index.get(module)
            if index is None:
                index = module_index[module] = len(module_names)
                module_names.append(module.decode("utf-8", "replace"))
            if not index:
                name = m.group(2)
                if name == b"_stext" or (name == b"_text" and not text_start):
                    text_start = address
                elif name == b"_etext":
                    text_end = address
            starts.append(address)
            name_at.append(len(names))
            names += m.group(2)
            name_end.append(len(names))
            module_of.append(index)
        if any(starts[i] > starts[i + 1] for i in range(len(starts) - 1)):
            order = sorted(range(len(starts)), key=starts.__getitem__)
            starts = array("Q", (starts[i] for i in order))
            name_at = array("I", (name_at[i] for i in order))
            name_end = array("I", (name_end[i] for i in order))
            module_of = array("H", (module_of[i] for i in order))
        self._text = bytes(names)
        self._starts, self._name_at, self._name_end, self._module_of = starts, name_at, name_end, module_of
        self._module_names = module_names
        self._text_start = text_start
        self._text_end = text_end
        self._module_ranges = self._parse_modules(self._modules_text)
        if data.strip() and not starts and not self._hidden_reported:
            self._hidden_reported = True
            log.warning(
                "%s lists only zero addresses: kernel pointers are hidden (sysctl kernel.kptr_restrict=%s; "
                "reading them needs CAP_SYSLOG and kptr_restrict<2). Kernel frames will be [unknown]; "
                "run as root or set kernel.kptr_restrict=0.",
                self._kallsyms_path,
                _read_sysctl("/proc/sys/kernel/kptr_restrict"),
            )
        log.debug("loaded %d kernel text symbols", len(starts))

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


def _modules_layout(text: bytes | None) -> list[tuple[bytes, ...]] | None:
    """What of /proc/modules places symbols: each module's name, size and load address. Not its
    reference count or users, which change whenever a module's device or filesystem is opened
    (fops_get() takes a reference per open): compared whole, every check reloaded kallsyms, a
    second or more per call on a slow machine, once per frame of a seeded stack."""
    if text is None:
        return None
    out: list[tuple[bytes, ...]] = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 6:
            out.append((fields[0], fields[1], fields[5]))
        elif fields:
            out.append((fields[0],))
    return out
