"""The stacks of a thread that is blocked now, read from /proc without stopping it: for the blocks
user space seeds (in_progress.py), which began before the probe watched the thread, so the probe
never captured their stacks.

- Kernel half: /proc/TGID/task/TID/stack (``[<0>] do_epoll_wait+0x56e/0x5b0`` per frame, leaf
  first; root only: proc_pid_stack() wants CAP_SYS_ADMIN, https://git.kernel.org/torvalds/c/f8a00cef1720),
  each ``name+offset`` turned back into an address with kallsyms, so the stack is stored like one
  bpf_get_stack() captured. The kernel prints it from the task's saved context and leaves out the
  scheduler's own frames (__schedule, schedule: they are in .sched.text), which a capture at
  sched_switch has.
- User half: /proc/TGID/task/TID/syscall ends with the user stack pointer and pc the thread
  entered the kernel with (proc_pid_syscall(); also for a thread not in a system call, "-1 sp pc");
  from there the stack is walked with the unwind tables as the probe walks it (unwind/walk.py),
  reading the thread's memory with pread() on /proc/TGID/mem.

Bounded: 127 frames (the probe's depth), a budget of capture time (a token bucket, so that seeding
every process of a host with --all stays cheap), tables only where they are in hand: in the unwind
maps or in the disk cache. Tables are never waited for: seeding runs on the pipeline's thread, and
a flush held back while a table is built loses the mappings of a process that exits meanwhile
(its every stack [unknown]). Without tables the user half is its leaf alone (truncated); what
cannot be had at all keeps the placeholder (STACK_SEEDED). Both are counted.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from offcpu_exporter.probe import layout
from offcpu_exporter.probe.maps import KernelMaps
from offcpu_exporter.ratelimit import RateLimitedLog
from offcpu_exporter.symbols.elf import ElfInfo
from offcpu_exporter.symbols.mapped import FileKey, open_mapped_file
from offcpu_exporter.symbols.proc_maps import parse_maps
from offcpu_exporter.unwind import layout as unwind_layout
from offcpu_exporter.unwind.cache import TableCache
from offcpu_exporter.unwind.objects import ObjectError, object_layout
from offcpu_exporter.unwind.rows import MapRows, PlacedTable, TableRows
from offcpu_exporter.unwind.table import UnwindTable
from offcpu_exporter.unwind.walk import MAX_FRAMES, RowLookup, Walk, walk_user_stack

__all__ = ["CAPTURED", "PLACEHOLDER", "TRUNCATED", "BlockedStacks", "Budget", "Capture", "parse_kernel_stack"]

log = logging.getLogger(__name__)

# Outcomes of a seeded block's stacks (Health.seeded_stacks keys).
CAPTURED = "captured"  # both halves, the user one down to the thread's root (or a kernel thread's)
TRUNCATED = "truncated"  # both halves, the user one stopping short (no table, rbp unknown, ...)
PLACEHOLDER = "placeholder"  # a half could not be had: [off CPU since before it was watched]
OUTCOMES = (CAPTURED, TRUNCATED, PLACEHOLDER)

KernelAddress = Callable[[str, str, int], "int | None"]  # (name, module, size) -> start

_PF_KTHREAD = 0x00200000  # task flags (stat field 9): a kernel thread has no user half
# "[<0>] do_epoll_wait+0x56e/0x5b0" or, in a module, "... nfs_wait_bit_killable+0x20/0x80 [nfs]"
_KERNEL_FRAME = re.compile(r"^\[<[0-9a-f]+>\] ([^\s+]+)\+0x([0-9a-f]+)/0x([0-9a-f]+)(?: \[([^\]\s]+)\])?$")
_PAGE_CACHE_SECONDS = 1.0  # rows and tables read in a pass are kept this long after its last capture
_CACHED_TABLE_BYTES = 64 << 20  # tables read from the disk cache, kept for one pass at most


@dataclass(frozen=True, slots=True)
class Capture:
    """What was captured of one blocked thread: addresses leaf first (None: that half could not
    be had), and whether the user half reaches the thread's root."""

    user: tuple[int, ...] | None
    kernel: tuple[int, ...] | None
    user_complete: bool

    @property
    def outcome(self) -> str:
        if self.user is None or self.kernel is None:
            return PLACEHOLDER
        return CAPTURED if self.user_complete else TRUNCATED


class Budget:
    """A token bucket of seconds: `burst` at most, refilled at `rate` seconds per second."""

    def __init__(self, burst: float, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.burst, self.rate, self._clock = burst, rate, clock
        self._left, self._at = burst, clock()

    def left(self) -> float:
        now = self._clock()
        self._left = min(self.burst, self._left + (now - self._at) * self.rate)
        self._at = now
        return self._left

    def spend(self, seconds: float) -> None:
        self.left()
        self._left -= seconds


def parse_kernel_stack(text: str) -> list[tuple[str, int, int, str]]:
    """(function, offset, size, module or "") per line of /proc/PID/stack, leaf first; stops at
    the first line it does not understand."""
    out = []
    for line in text.splitlines():
        m = _KERNEL_FRAME.match(line.strip())
        if m is None:
            break
        out.append((m.group(1), int(m.group(2), 16), int(m.group(3), 16), m.group(4) or ""))
    return out


def kernel_addresses(frames: list[tuple[str, int, int, str]], address_of: KernelAddress) -> tuple[int, ...] | None:
    """The frames' addresses (symbol start + offset: a return address, as bpf_get_stack gives),
    or None if a symbol is not in kallsyms (hidden pointers, or a module gone)."""
    out = []
    for name, offset, size, module in frames[:MAX_FRAMES]:
        start = address_of(name, module, size)
        if start is None:
            return None
        out.append(start + offset)
    return tuple(out)


def user_registers(text: str) -> tuple[int, int] | None:
    """(sp, pc) from /proc/PID/task/TID/syscall: its last two fields, unless the thread is
    "running" (then there is nothing saved to read)."""
    words = text.split()
    if len(words) < 3:
        return None
    try:
        return int(words[-2], 16), int(words[-1], 16)
    except ValueError:
        return None


class ProcessMemory:
    """pread() on /proc/TGID/mem: the thread is not stopped; its stack below where it blocked
    does not change while it stays blocked."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    def read(self, address: int, size: int) -> bytes | None:
        if address < 0 or address >= 1 << 63:
            return None
        try:
            return os.pread(self._fd, size, address)
        except OSError:
            return None

    def close(self) -> None:
        os.close(self._fd)


class BlockedStacks:
    """Captures, stores and counts the stacks of seeded blocks; see the module docstring. Called
    by the pipeline's thread only (InProgress.seed)."""

    def __init__(self, probe: KernelMaps, kernel_address: KernelAddress | None, *, proc_root: str = "/proc",
                 capture_budget: Budget | None = None) -> None:
        self.probe = probe
        self.kernel_address = kernel_address
        self.proc_root = proc_root
        # Capture work (reads of /proc, the walk): 2 s at once, then 0.2 s per second.
        self.capture_budget = capture_budget or Budget(2.0, 0.2)
        self.outcomes = dict.fromkeys(OUTCOMES, 0)
        self._warn = RateLimitedLog(log, interval=300.0)
        self._last = 0.0
        self._pages: dict[int, tuple[list[int], bytes]] = {}  # MapRows' page cache for this pass
        self._rows: dict[int, RowLookup | None] = {}  # tgid -> its rows, this pass
        self._tables: dict[str, UnwindTable | None] = {}  # build id -> table from the disk cache, this pass
        self._layouts: dict[FileKey, ElfInfo | None] = {}  # mapped file -> its build id and segments, this pass
        self._table_bytes = 0
        self._disk: TableCache | None = None

    # -- what InProgress calls ---------------------------------------------------------------

    def ids(self, tgid: int, tid: int) -> tuple[int, int, str]:
        """(user stack id, kernel stack id, outcome) for a block thread `tid` is in now: stacks
        stored in the probe's stack map, or layout.STACK_SEEDED for a half that could not be had."""
        capture = self.capture(tgid, tid)
        user = layout.STACK_SEEDED if capture.user is None else self.probe.store_stack(capture.user)
        kernel = layout.STACK_SEEDED if capture.kernel is None else self.probe.store_stack(capture.kernel)
        outcome = capture.outcome
        if user >= layout.STACK_ERRNO_BASE and user < layout.STACK_RESERVED:
            user, outcome = layout.STACK_SEEDED, PLACEHOLDER  # the stack map is full
        if kernel >= layout.STACK_ERRNO_BASE and kernel < layout.STACK_RESERVED:
            kernel, outcome = layout.STACK_SEEDED, PLACEHOLDER
        return user, kernel, outcome

    def count(self, outcome: str) -> None:
        """A seeded block was stored with stacks of this outcome."""
        self.outcomes[outcome] += 1
        if outcome == PLACEHOLDER:
            self._warn.warning("threads blocked since before they were watched carry the placeholder stack "
                               "[off CPU since before it was watched] (offcpu_exporter_seeded_stacks_total)")

    # -- capture -----------------------------------------------------------------------------

    def capture(self, tgid: int, tid: int) -> Capture:
        now = time.monotonic()
        if now - self._last > _PAGE_CACHE_SECONDS:
            self._new_pass()
        t0 = time.perf_counter()
        try:
            if self.capture_budget.left() <= 0:
                return Capture(None, None, False)
            return self._capture(tgid, tid)
        finally:
            self.capture_budget.spend(time.perf_counter() - t0)
            self._last = time.monotonic()

    def _new_pass(self) -> None:
        self._pages.clear()
        self._rows.clear()
        self._tables.clear()
        self._layouts.clear()
        self._table_bytes = 0

    def _capture(self, tgid: int, tid: int) -> Capture:
        base = f"{self.proc_root}/{tgid}/task/{tid}"
        kernel = self._kernel_stack(base)
        try:
            with open(f"{base}/stat", encoding="utf-8", errors="replace") as f:
                stat = f.read()
            flags = int(stat[stat.rfind(")") + 2 :].split()[6])
        except (OSError, ValueError, IndexError):
            return Capture(None, kernel, False)
        if flags & _PF_KTHREAD:
            return Capture((), kernel, True)  # stored as STACK_EMPTY, as the probe stores it
        walk = self._user_stack(tgid, base)
        if walk is None:
            return Capture(None, kernel, False)
        return Capture(walk.frames, kernel, walk.complete)

    def _kernel_stack(self, base: str) -> tuple[int, ...] | None:
        if self.kernel_address is None:
            return None
        try:
            with open(f"{base}/stack", encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            return None  # not root (CAP_SYS_ADMIN), or the thread is gone
        frames = parse_kernel_stack(text)
        return kernel_addresses(frames, self.kernel_address) if frames else None

    def _user_stack(self, tgid: int, base: str) -> Walk | None:
        try:
            with open(f"{base}/syscall", encoding="ascii", errors="replace") as f:
                registers = user_registers(f.read())
        except OSError:
            return None
        if registers is None:
            return None
        sp, pc = registers
        rows = self._rows_of(tgid)
        if rows is None:
            log.debug("process %d: no unwind tables in hand", tgid)
            return walk_user_stack(pc, sp, _no_rows, _unreadable)  # the leaf alone
        try:
            memory = ProcessMemory(f"{self.proc_root}/{tgid}/mem")
        except OSError:
            return None
        try:
            walk = walk_user_stack(pc, sp, rows, memory.read)
        finally:
            memory.close()
        log.debug("thread %s: user stack of %d frames, end %d", base, len(walk.frames), walk.end)
        return walk

    # -- where the rows come from ------------------------------------------------------------

    def _rows_of(self, tgid: int) -> RowLookup | None:
        if tgid in self._rows:
            return self._rows[tgid]
        rows = self._find_rows(tgid)
        self._rows[tgid] = rows
        return rows

    def _find_rows(self, tgid: int) -> RowLookup | None:
        unwinder = self.probe.unwinder
        maps = unwinder.maps if unwinder is not None else None
        if unwinder is None or maps is None:
            return None
        in_maps = MapRows(maps, tgid, self._pages)
        if in_maps.described:
            return in_maps
        cached = self._cached_rows(tgid)
        if cached is not None and cached.described:
            return cached
        return None

    def _cached_rows(self, tgid: int) -> TableRows | None:
        """The process's tables from the disk cache only (nothing is built: see the module
        docstring)."""
        directory = self.probe.config.unwind_cache_dir
        if not directory:
            return None
        if self._disk is None:
            self._disk = TableCache(directory, memory_bytes=0)
        try:
            with open(f"{self.proc_root}/{tgid}/maps", encoding="utf-8", errors="surrogateescape") as f:
                mappings = parse_maps(f.read())
        except OSError:
            return None
        placed = []
        for m in mappings:
            if not m.is_file:
                continue
            mapped = open_mapped_file(self.proc_root, tgid, m)
            if mapped is None:
                continue
            if mapped.key not in self._layouts:
                try:
                    self._layouts[mapped.key] = object_layout(mapped.open_path)
                except ObjectError:
                    self._layouts[mapped.key] = None
            info = self._layouts[mapped.key]
            if info is None or not info.build_id:
                continue
            if info.build_id not in self._tables:
                table = self._disk.get(info.build_id) if self._table_bytes < _CACHED_TABLE_BYTES else None
                self._tables[info.build_id] = table
                if table is not None:
                    self._table_bytes += len(table.rows) + len(table.pages)
            table = self._tables[info.build_id]
            vaddr = info.file_offset_to_vaddr(m.offset)
            if table is None or vaddr is None:
                continue
            placed.append(PlacedTable(m.start, m.end, m.start - vaddr + table.base, table))
        return TableRows(placed[: unwind_layout.MAX_MAPPINGS])


def _no_rows(address: int) -> None:
    return None


def _unreadable(address: int, size: int) -> None:
    return None
