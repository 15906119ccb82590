"""The probe: bpf/offcpu.bpf.c compiled with bcc (probe/compile.py), attached to the scheduler
(probe/attach.py), and the only reader and writer of its maps."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import itertools
import logging
import os
import struct
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple, TypeVar

from offcpu_exporter.clock import ktime_ns, wall_ns_at
from offcpu_exporter.probe import layout
from offcpu_exporter.probe.attach import ATTACH_MODES, attach, check_mode, choose_mode
from offcpu_exporter.probe.compile import build_program, import_bcc, load
from offcpu_exporter.probe.config import ProbeConfig, ProbeError, pid_max
from offcpu_exporter.probe.facts import KernelFacts, probe_kernel
from offcpu_exporter.probe.maps import CounterKey, CounterValue, StartEntry
from offcpu_exporter.probe.stack_ids import stack_id
from offcpu_exporter.unwind import TableCache, Unwinder, UnwindMaps
from offcpu_exporter.unwind.build import build_in_child

__all__ = ["Probe", "ProbeConfig", "ProbeError"]

log = logging.getLogger(__name__)

_BPF_NOEXIST = 1
_SYS_BPF = 321  # x86-64
_BPF_ENABLE_STATS = 32
_BPF_STATS_RUN_TIME = 0
_TABLE_MEMORY = 0  # unwind tables are not kept in memory once in the BPF maps (the disk cache has them)
_ENOTSUPP = 524  # the kernel-internal "operation not supported" some map types return
_T = TypeVar("_T")
_Convert = Callable[[Iterator[tuple[Any, ...]], Iterator[tuple[Any, ...]]], Iterable[_T]]


class _Entry(NamedTuple):
    """How a map's keys and values unpack (bpf/offcpu.h's structs, little-endian x86-64 layout:
    the sizes are checked against the compiled program's at each read)."""

    key: struct.Struct
    value: struct.Struct


_U32 = struct.Struct("<I")
_U32_U32 = _Entry(_U32, _U32)
_COUNTS = _Entry(struct.Struct("<III4xQQ"), struct.Struct("<QQQQ"))  # offcpu_key (pad skipped), offcpu_value
_STARTS = _Entry(_U32, struct.Struct("<QQQIII4x"))  # offcpu_start: ts, stacks, tgid, reason, weight (flags)
_MARKS = _Entry(_U32, struct.Struct("<QQ"))  # offcpu_mark
_HIST = _Entry(_U32, struct.Struct(f"<{layout.HIST_ROOM}Q"))  # offcpu_hist

_AS_COUNTER_KEY = functools.partial(tuple.__new__, CounterKey)  # _make() without its Python frame
_AS_COUNTER_VALUE = functools.partial(tuple.__new__, CounterValue)
_AS_START_ENTRY = functools.partial(tuple.__new__, StartEntry)


class Probe:
    """The loaded BPF program. Not thread-safe: one owner (the pipeline) calls it."""

    def __init__(self, config: ProbeConfig, facts: KernelFacts | None = None) -> None:
        if config.attach not in ATTACH_MODES:
            raise ProbeError(f"unknown attach mode {config.attach!r}; use one of {', '.join(ATTACH_MODES)}")
        self.config = config
        self.facts = facts or probe_kernel()
        self.mode = ""
        self.why = ""
        self.hooked: tuple[str, ...] = ()
        # When counting began, on the wall clock and on the probe's clock (CLOCK_MONOTONIC).
        self.attached_wall_ns = 0
        self.attached_ktime_ns = 0
        self._bpf = None
        self._lib: Any = None
        self._stats_fd = -1
        self._cutoff_ns = 0
        self._marks_active = False
        self.unwinder: Unwinder | None = None  # set when user stacks are walked from CFI tables
        self._targets: dict[int, int] = {}  # what this probe put in the filter array

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        bcc = import_bcc()
        mode, self.why = choose_mode(self.config.attach, self.facts)
        check_mode(mode, self.facts)
        program = build_program(self.config, self.facts, mode)
        self._bpf = load(bcc, program)
        self._lib = bcc.libbcc.lib
        if program.unwind is not None:
            # Tables missing from the cache are parsed in a child process: its memory is not ours to keep.
            self.unwinder = Unwinder(UnwindMaps(self._bpf), build_table=build_in_child,
                                     cache=TableCache(self.config.unwind_cache_dir, memory_bytes=_TABLE_MEMORY))
        self.mode = mode
        try:
            self.hooked = attach(self._bpf, program.variant, self.facts)
        except ProbeError:
            self.close()
            raise
        # Counting begins now (tracepoint programs are attached when bcc loads them, kprobes just above).
        self.attached_ktime_ns = ktime_ns()
        self.attached_wall_ns = wall_ns_at(self.attached_ktime_ns)
        if self.config.run_time_stats:
            self.enable_run_time_stats()
        log.info("probe attached: mode=%s (%s), hooked=%s", self.mode, self.why, ",".join(self.hooked))

    def close(self) -> None:
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None
        if self._stats_fd >= 0:
            os.close(self._stats_fd)
            self._stats_fd = -1

    @property
    def attached(self) -> bool:
        return self._bpf is not None

    def _table(self, name: str):  # type: ignore[no-untyped-def]
        assert self._bpf is not None, "probe not started"
        return self._bpf[name.encode()]

    def _lookup_batch(self, name: str, entry: _Entry, convert: _Convert[_T], *, delete: bool = False) -> list[_T]:
        """Every entry of a hash map, in a few BPF_MAP_LOOKUP_BATCH calls (BPF_MAP_LOOKUP_AND_DELETE_BATCH
        with `delete`), unpacked by `entry` (its keys' and values' struct formats) a batch at a time
        and `convert`ed from the two iterators of tuples. Walking a hash map with get_next_key while
        the kernel deletes entries restarts from the first bucket when the current key is gone
        (htab_map_get_next_key()): entries are skipped or read twice. The batch walk resumes from a
        bucket index instead. (bcc's items_lookup_batch passes one variable as both the resume token
        and the count.) Unpacking raw bytes with `struct` rather than reading ctypes fields one entry
        at a time is what keeps a read of 50,000 entries in milliseconds."""
        table = self._table(name)
        key_size, value_size = ctypes.sizeof(table.Key), ctypes.sizeof(table.Leaf)
        if (entry.key.size, entry.value.size) != (key_size, value_size):
            raise ProbeError(f"map {name}: entries of {key_size} + {value_size} bytes, "
                             f"read as {entry.key.size} + {entry.value.size}")
        lib = self._lib
        call = lib.bpf_lookup_and_delete_batch if delete else lib.bpf_lookup_batch
        size = max(64, min(table.max_entries, 4096))
        keys, values = ctypes.create_string_buffer(size * key_size), ctypes.create_string_buffer(size * value_size)
        out: list[_T] = []
        token_in, token_out, count = ctypes.c_uint32(0), ctypes.c_uint32(0), ctypes.c_uint32(0)
        first = True
        while True:
            count.value = size
            rc = call(table.map_fd, None if first else ctypes.byref(token_in), ctypes.byref(token_out),
                      keys, values, ctypes.byref(count))
            err = ctypes.get_errno()
            n = count.value
            if n:
                # Read before the buffers are reused by the next call.
                out.extend(convert(entry.key.iter_unpack(memoryview(keys)[: n * key_size]),
                                   entry.value.iter_unpack(memoryview(values)[: n * value_size])))
            if rc != 0:
                if err == errno.ENOENT:
                    return out  # the end of the map
                if err == errno.ENOSPC and n == 0:
                    # One bucket holds more entries than the buffer: a bigger one.
                    size *= 4
                    keys = ctypes.create_string_buffer(size * key_size)
                    values = ctypes.create_string_buffer(size * value_size)
                    continue
                raise OSError(err, f"BPF_MAP_LOOKUP{'_AND_DELETE' if delete else ''}_BATCH on {name}: "
                                   f"{os.strerror(err)}")
            token_in.value = token_out.value
            first = False

    # -- targets ---------------------------------------------------------------------------

    def kernel_targets(self) -> dict[int, int]:
        """tgid -> layout.TARGET_* of the filter's non-zero entries: those this probe set (the
        kernel clears a group leader's at its exit) and the children the kernel added at fork."""
        table = self._table(layout.MAP_TARGETS)
        out = {}
        for tgid in set(self._targets) | set(self.children() if self.config.follow_children else ()):
            try:
                value = table[table.Key(tgid)].value
            except (KeyError, IndexError):
                continue
            if value:
                out[tgid] = value
        self._targets = {tgid: v for tgid, v in self._targets.items() if tgid in out}
        return out

    def set_target(self, tgid: int, value: int = 1) -> None:
        table = self._table(layout.MAP_TARGETS)
        with contextlib.suppress(KeyError, IndexError):  # a pid beyond the array (pid_max raised)
            table[table.Key(tgid)] = table.Leaf(value)
            self._targets[tgid] = value

    def remove_target(self, tgid: int) -> None:
        table = self._table(layout.MAP_TARGETS)
        with contextlib.suppress(KeyError, IndexError):
            table[table.Key(tgid)] = table.Leaf(0)
        self._targets.pop(tgid, None)

    def children(self) -> dict[int, tuple[int, int, str]]:
        """Followed children: tgid -> (parent tgid, fork boot ns, comm)."""
        return {
            k.value: (v.parent_tgid, v.fork_boot_ns, bytes(v.comm).split(b"\0", 1)[0].decode(errors="replace"))
            for k, v in self._table(layout.MAP_CHILDREN).items()
        }

    def take_process_events(self) -> dict[int, int]:
        """tgid -> layout.PROC_* bits of the processes that forked, exec'd, exited or were renamed
        since the last call, deleted as they are read (BPF_MAP_LOOKUP_AND_DELETE_BATCH: an event
        after an entry was taken makes a new entry, for the next call)."""
        return dict(self._lookup_batch(layout.MAP_PROC_EVENTS, _U32_U32, lambda keys, values: (
            (k, v) for (k,), (v,) in zip(keys, values, strict=True)), delete=True))

    def forget_child(self, tgid: int) -> None:
        table = self._table(layout.MAP_CHILDREN)
        with contextlib.suppress(KeyError):
            del table[table.Key(tgid)]

    # -- counters --------------------------------------------------------------------------

    def read_counts(self) -> list[tuple[CounterKey, CounterValue]]:
        return self._lookup_batch(layout.MAP_COUNTS, _COUNTS, lambda keys, values: zip(
            map(_AS_COUNTER_KEY, keys), map(_AS_COUNTER_VALUE, values), strict=True))

    def take_counts(self, keys: Iterable[CounterKey]) -> dict[CounterKey, CounterValue]:
        """Delete these counters and return their values at the moment of deletion, so that an
        increment between the last read and the delete is not lost."""
        table = self._table(layout.MAP_COUNTS)
        out: dict[CounterKey, CounterValue] = {}
        value = layout.OffcpuValue()
        for raw in keys:
            key = layout.OffcpuKey(raw.tgid, raw.tid, raw.reason, 0, raw.user_stack, raw.kernel_stack)
            if self._lookup_and_delete(table.map_fd, key, value):
                out[raw] = CounterValue(value.count, value.ns, value.wcount, value.wns)
        return out

    def _lookup_and_delete(self, fd: int, key: ctypes.Structure | ctypes.c_uint32,
                           value: ctypes.Structure | ctypes.c_uint64) -> bool:
        lib = self._lib
        rc = lib.bpf_lookup_and_delete(fd, ctypes.byref(key), ctypes.byref(value))
        if rc == 0:
            return True
        err = ctypes.get_errno()
        if err == errno.ENOENT or rc == -errno.ENOENT:
            return False
        if err not in (errno.EINVAL, errno.EOPNOTSUPP, _ENOTSUPP):
            raise OSError(err, f"BPF_MAP_LOOKUP_AND_DELETE_ELEM: {os.strerror(err)}")
        # Hash maps take it since 5.14; before, an increment between the two calls is lost.
        if lib.bpf_lookup_elem(fd, ctypes.byref(key), ctypes.byref(value)) != 0:
            return False
        lib.bpf_delete_elem(fd, ctypes.byref(key))
        return True

    # -- stacks ----------------------------------------------------------------------------

    def stack(self, stack_id: int) -> tuple[int, ...] | None:
        """The addresses of a stack id, leaf first; None if the id is not in the map."""
        table = self._table(layout.MAP_STACKS)
        try:
            trace = table[table.Key(stack_id)]
        except KeyError:
            return None
        out = []
        for addr in trace.ips:
            if addr == 0:
                break
            out.append(addr)
        return tuple(out)

    def stack_ids(self) -> set[int]:
        """The ids the stack map holds (keys only: the values are ~1 KiB each). The kernel only
        adds stacks, user space deletes them: get_next_key sees every key that stays. The walk calls
        libbpf directly with two reused keys: bcc's iterator makes ctypes objects and Python frames
        for every key, a few milliseconds per thousand stacks at every flush."""
        table = self._table(layout.MAP_STACKS)
        get_next_key, fd = self._lib.bpf_get_next_key, table.map_fd
        key, after = table.Key(), table.Key()
        out: set[int] = set()
        previous = None
        while get_next_key(fd, previous, ctypes.byref(after)) == 0:
            out.add(after.value)
            key.value = after.value
            previous = ctypes.byref(key)
        return out

    def delete_stacks(self, stack_ids: Iterable[int]) -> None:
        table = self._table(layout.MAP_STACKS)
        for sid in stack_ids:
            with contextlib.suppress(KeyError):
                del table[table.Key(sid)]

    def store_stack(self, frames: Sequence[int]) -> int:
        """Store a stack read by user space (leaf first) under the id the kernel gives the same
        frames (store_stack() in the BPF program): an id already there holds these very frames.
        Returns the id, or STACK_ERRNO_BASE + ENOMEM when the map is full."""
        sid = stack_id(frames)
        if sid < layout.STACK_RESERVED:
            return sid  # STACK_EMPTY
        table = self._table(layout.MAP_STACKS)
        key = ctypes.c_uint64(sid)
        value = layout.OffcpuStack()
        for i, ip in enumerate(frames[: layout.MAX_DEPTH]):
            value.ips[i] = ip
        if self._lib.bpf_update_elem(table.map_fd, ctypes.byref(key), ctypes.byref(value), _BPF_NOEXIST) != 0:
            err = ctypes.get_errno()
            if err != errno.EEXIST:
                return layout.STACK_ERRNO_BASE + errno.ENOMEM
        return sid

    # -- threads off CPU now ---------------------------------------------------------------

    def read_starts(self) -> dict[int, StartEntry]:
        """tid -> the block it is in now."""
        return dict(self._lookup_batch(layout.MAP_START, _STARTS, lambda keys, values: zip(
            itertools.chain.from_iterable(keys), map(_AS_START_ENTRY, values), strict=True)))

    def seed_start(self, tid: int, entry: StartEntry) -> bool:
        """Store a block the probe did not see begin (the thread was off CPU before it was
        watched), unless the kernel has one for the thread already."""
        table = self._table(layout.MAP_START)
        key = ctypes.c_uint32(tid)
        value = layout.OffcpuStart(entry.ts_ns, entry.user_stack, entry.kernel_stack, entry.tgid, entry.reason,
                                   entry.weight, layout.START_SEEDED)
        if self._lib.bpf_update_elem(table.map_fd, ctypes.byref(key), ctypes.byref(value), _BPF_NOEXIST) != 0:
            return False
        self._mark_off_cpu(tid, 1)
        return True

    def _mark_off_cpu(self, tid: int, value: int) -> None:
        table = self._table(layout.MAP_OFF_CPU)
        with contextlib.suppress(KeyError, IndexError):
            table[table.Key(tid)] = table.Leaf(value)

    def unseed_start(self, tid: int, ts_ns: int) -> None:
        """Delete a seeded block if it is still the thread's current one (the thread ran since)."""
        entry = self.read_start(tid)
        if entry is not None and entry.ts_ns == ts_ns:
            table = self._table(layout.MAP_START)
            with contextlib.suppress(KeyError):
                del table[table.Key(tid)]
            self._mark_off_cpu(tid, 0)

    def read_start(self, tid: int) -> StartEntry | None:
        table = self._table(layout.MAP_START)
        try:
            v = table[table.Key(tid)]
        except KeyError:
            return None
        return StartEntry(v.ts_ns, v.user_stack, v.kernel_stack, v.tgid, v.reason, v.weight)

    def write_marks(self, marks: dict[int, tuple[int, int]]) -> None:
        """tid -> (start of its block, counted up to): see struct offcpu_mark."""
        if marks and not self._marks_active:
            self._marks_active = True
            self._write_control()
        if not marks:
            return
        # One BPF_MAP_UPDATE_BATCH: a mark for every blocked thread at every flush, its buffers
        # filled in C (array) rather than a ctypes object per mark.
        keys = array("I", marks)
        values = array("Q", itertools.chain.from_iterable(marks.values()))  # struct offcpu_mark: start, until
        assert values.itemsize * 2 == ctypes.sizeof(layout.OffcpuMark) and keys.itemsize == 4
        count = ctypes.c_uint32(len(marks))
        if self._lib.bpf_update_batch(self._table(layout.MAP_MARKS).map_fd, keys.buffer_info()[0],
                                      values.buffer_info()[0], ctypes.byref(count)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"BPF_MAP_UPDATE_BATCH on {layout.MAP_MARKS}: {os.strerror(err)}")

    def read_marks(self) -> dict[int, tuple[int, int]]:
        return dict(self._lookup_batch(layout.MAP_MARKS, _MARKS, lambda keys, values: (
            (tid, mark) for (tid,), mark in zip(keys, values, strict=True))))

    def delete_marks(self, tids: Iterable[int]) -> None:
        self._delete_batch(layout.MAP_MARKS, list(tids))

    def _delete_batch(self, name: str, keys: Sequence[int]) -> None:
        """Delete u32 `keys` from a hash map in BPF_MAP_DELETE_BATCH calls. The kernel stops at a
        key that is not there (-ENOENT, `count` saying how many went before it): skip it, go on."""
        fd = self._table(name).map_fd
        raw = (ctypes.c_uint32 * len(keys))(*keys)
        done = 0
        while done < len(keys):
            count = ctypes.c_uint32(len(keys) - done)
            if self._lib.bpf_delete_batch(fd, ctypes.byref(raw, done * ctypes.sizeof(ctypes.c_uint32)),
                                          ctypes.byref(count)) == 0:
                return
            err = ctypes.get_errno()
            if err != errno.ENOENT:
                raise OSError(err, f"BPF_MAP_DELETE_BATCH on {name}: {os.strerror(err)}")
            done += count.value + 1

    def set_marks_active(self, active: bool) -> None:
        if active != self._marks_active:
            self._marks_active = active
            self._write_control()

    @property
    def cutoff_ns(self) -> int:
        """The end of the window being measured (CLOCK_MONOTONIC), 0 when there is none."""
        return self._cutoff_ns

    def set_cutoff(self, ktime_ns: int) -> None:
        """Count nothing after this time (CLOCK_MONOTONIC): the end of a measured window."""
        self._cutoff_ns = ktime_ns
        self._write_control()

    def _write_control(self) -> None:
        table = self._table(layout.MAP_CONTROL)
        table[table.Key(0)] = layout.OffcpuControl(self._cutoff_ns, int(self._marks_active), 0)

    # -- histogram, statistics, sizes ------------------------------------------------------

    def read_hist(self) -> dict[int, list[int]]:
        """tgid -> cumulative block count per duration slot."""
        return dict(self._lookup_batch(layout.MAP_HIST, _HIST, lambda keys, values: (
            (tgid, list(slots[: layout.HIST_SLOTS])) for (tgid,), slots in zip(keys, values, strict=True))))

    def take_hist(self, tgid: int) -> list[int]:
        """Delete a tgid's histogram and return it as it was at the moment of deletion."""
        value = layout.OffcpuHist()
        if self._lookup_and_delete(self._table(layout.MAP_HIST).map_fd, ctypes.c_uint32(tgid), value):
            return value.slots[: layout.HIST_SLOTS]
        return [0] * layout.HIST_SLOTS

    def stats(self) -> list[int]:
        table = self._table(layout.MAP_STATS)
        out = [0] * layout.STAT_MAX
        for k, per_cpu in table.items():
            if 0 <= k.value < layout.STAT_MAX:
                out[k.value] = sum(per_cpu)
        return out

    def map_sizes(self, **known: int) -> dict[str, tuple[int, int]]:
        """map -> (entries now, capacity). Maps the caller has just read pass their sizes in
        (`counts=`, `start=`, `stacks=`); the others are walked (one system call per entry)."""
        cfg = self.config
        capacity = {layout.MAP_COUNTS: cfg.max_counts, layout.MAP_START: cfg.max_threads,
                    layout.MAP_HIST: cfg.max_hist, layout.MAP_STACKS: cfg.stack_storage}
        sizes = {name: (known[name] if name in known else len(self._table(name)), cap)
                 for name, cap in capacity.items()}
        sizes[layout.MAP_TARGETS] = (len(self._targets), pid_max())  # an array indexed by pid
        return sizes

    # -- the probe's own cost --------------------------------------------------------------

    def enable_run_time_stats(self) -> bool:
        """Ask the kernel to time every run of BPF programs while this probe lives
        (BPF_ENABLE_STATS, 5.8+; the same as sysctl kernel.bpf_stats_enabled=1, undone when the
        exporter exits). Costs two clock reads per run."""
        if self._stats_fd >= 0:
            return True
        libc = ctypes.CDLL(None, use_errno=True)
        attr = (ctypes.c_uint32 * 4)(_BPF_STATS_RUN_TIME, 0, 0, 0)
        fd = libc.syscall(_SYS_BPF, _BPF_ENABLE_STATS, ctypes.byref(attr), ctypes.sizeof(attr))
        if fd < 0:
            log.warning("BPF run-time statistics unavailable: %s", os.strerror(ctypes.get_errno()))
            return False
        self._stats_fd = fd
        return True

    def run_time(self) -> tuple[int, int]:
        """(ns spent in the probe's programs, their runs) since they were loaded; zeros while the
        kernel does not time BPF programs (kernel.bpf_stats_enabled off)."""
        total_ns = runs = 0
        assert self._bpf is not None
        for fn in self._bpf.funcs.values():
            try:
                with open(f"/proc/self/fdinfo/{fn.fd}", encoding="ascii") as f:
                    for line in f:
                        name, _, value = line.partition(":")
                        if name == "run_time_ns":
                            total_ns += int(value)
                        elif name == "run_cnt":
                            runs += int(value)
            except (OSError, ValueError):
                continue
        return total_ns, runs


def exporter_tgid() -> int:
    return os.getpid()
