"""Every read and write of the loaded probe's maps: the targets filter, the counters, the stacks,
the blocks going on now and their marks, the window's cutoff, the histograms and the statistics.
`Probe` (probe/loader.py) is this over the program it compiled and attached."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import itertools
import os
import struct
from array import array
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from offcpu_exporter.probe import layout
from offcpu_exporter.probe.config import ProbeConfig, pid_max
from offcpu_exporter.probe.map_calls import Convert, Entry, WordsLookup, delete_batch, lookup_and_delete, lookup_batch
from offcpu_exporter.probe.maps import CounterKey, CounterValue, StartEntry, WakerIds, with_waker
from offcpu_exporter.probe.stack_ids import stack_id

__all__ = ["MapAccess"]

_BPF_NOEXIST = 1
_T = TypeVar("_T")

_U32 = struct.Struct("<I")
_U32_U32 = Entry(_U32, _U32)
_COUNTS = Entry(struct.Struct("<III4xQQ"), struct.Struct("<QQQQ"))  # offcpu_key (pad skipped), offcpu_value
# With wakers on: offcpu_waker_key (offcpu_key, then offcpu_waker: tgid, tid, context, stacks, comm).
_WAKER_COUNTS = Entry(struct.Struct("<III4xQQIII4xQQ16s"), _COUNTS.value)
_WAKES = Entry(_U32, struct.Struct("<QIII4xQQ16s"))  # offcpu_wake: block start, then its offcpu_waker
_STARTS = Entry(_U32, struct.Struct("<QQQIII4x"))  # offcpu_start: ts, stacks, tgid, reason, weight (flags)
_MARKS = Entry(_U32, struct.Struct("<QQ"))  # offcpu_mark
_HIST = Entry(_U32, struct.Struct(f"<{layout.HIST_ROOM}Q"))  # offcpu_hist

_AS_COUNTER_KEY = functools.partial(tuple.__new__, CounterKey)  # _make() without its Python frame
_AS_COUNTER_VALUE = functools.partial(tuple.__new__, CounterValue)
_AS_START_ENTRY = functools.partial(tuple.__new__, StartEntry)
_NO_WAKER = WakerIds(0, 0, layout.WAKER_NONE, 0, 0, b"")


def _waker_counter_key(raw: tuple[Any, ...]) -> CounterKey:
    """A key of the counts map built with wakers, from its unpacked fields: the five of CounterKey
    and its WakerIds as a sixth element (CounterKey.waker)."""
    return with_waker(_AS_COUNTER_KEY(raw[:5]), WakerIds(*raw[5:]))


class MapAccess:
    """The maps of a loaded program (`_bpf`, bcc's BPF object, and `_lib`, its libbpf; None until
    the subclass loads one). Not thread-safe: one owner (the pipeline) calls it."""

    def __init__(self, config: ProbeConfig) -> None:
        self.config = config
        self._bpf: Any = None
        self._lib: Any = None
        self._cutoff_ns = 0
        self._marks_active = False
        self._targets: dict[int, int] = {}  # what this probe put in the filter array
        self._stack_lookup: tuple[Any, WordsLookup] | None = None  # (the program it reads, the reader)

    def _table(self, name: str):  # type: ignore[no-untyped-def]
        assert self._bpf is not None, "probe not started"
        return self._bpf[name.encode()]

    def _read(self, name: str, entry: Entry, convert: Convert[_T], *, delete: bool = False) -> list[_T]:
        return lookup_batch(self._lib, self._table(name), name, entry, convert, delete=delete)

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
        return dict(self._read(layout.MAP_PROC_EVENTS, _U32_U32, lambda keys, values: (
            (k, v) for (k,), (v,) in zip(keys, values, strict=True)), delete=True))

    def forget_child(self, tgid: int) -> None:
        table = self._table(layout.MAP_CHILDREN)
        with contextlib.suppress(KeyError):
            del table[table.Key(tgid)]

    # -- counters --------------------------------------------------------------------------

    def read_counts(self) -> list[tuple[CounterKey, CounterValue]]:
        if self.config.wakers:
            return self._read(layout.MAP_COUNTS, _WAKER_COUNTS, lambda keys, values: zip(
                map(_waker_counter_key, keys), map(_AS_COUNTER_VALUE, values), strict=True))
        return self._read(layout.MAP_COUNTS, _COUNTS, lambda keys, values: zip(
            map(_AS_COUNTER_KEY, keys), map(_AS_COUNTER_VALUE, values), strict=True))

    def take_counts(self, keys: Iterable[CounterKey]) -> dict[CounterKey, CounterValue]:
        """Delete these counters and return their values at the moment of deletion, so that an
        increment between the last read and the delete is not lost."""
        table = self._table(layout.MAP_COUNTS)
        out: dict[CounterKey, CounterValue] = {}
        value = layout.OffcpuValue()
        wakers = self.config.wakers
        key: ctypes.Structure
        for raw in keys:
            key = layout.OffcpuKey(raw.tgid, raw.tid, raw.reason, 0, raw.user_stack, raw.kernel_stack)
            if wakers:
                w = raw.waker or _NO_WAKER
                key = layout.OffcpuWakerKey(key, layout.OffcpuWaker(w.tgid, w.tid, w.context, 0, w.user_stack,
                                                                    w.kernel_stack, w.comm))
            if lookup_and_delete(self._lib, table.map_fd, key, value):
                out[raw] = CounterValue(value.count, value.ns, value.wcount, value.wns)
        return out

    # -- stacks ----------------------------------------------------------------------------

    def stack(self, stack_id: int) -> tuple[int, ...] | None:
        """The addresses of a stack id, leaf first; None if the id is not in the map."""
        cached = self._stack_lookup
        if cached is None or cached[0] is not self._bpf:
            cached = self._stack_lookup = (self._bpf, WordsLookup(self._lib, self._table(layout.MAP_STACKS)))
        words = cached[1](stack_id)
        if words is None:
            return None
        try:
            return tuple(words[: words.index(0)])  # the first 0 word ends the addresses
        except ValueError:
            return tuple(words)

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

    def waker_stack_ids(self) -> set[int]:
        """The stack ids of the wakers of blocks in progress: the stack map must keep them until
        the blocks end and a counter names them."""
        if not self.config.wakers:
            return set()
        return {sid for w in self._read(layout.MAP_WAKERS, _WAKES, lambda keys, values: values)
                for sid in (w[4], w[5])}

    def delete_stacks(self, stack_ids: Iterable[int]) -> None:
        """In BPF_MAP_DELETE_BATCH calls (ids not in the map skipped): every flush frees the stacks
        nothing references any more, thousands on a busy node."""
        table = self._table(layout.MAP_STACKS)
        assert ctypes.sizeof(table.Key) == ctypes.sizeof(ctypes.c_uint64)
        delete_batch(self._lib, table.map_fd, layout.MAP_STACKS, list(stack_ids), ctypes.c_uint64)

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
        return dict(self._read(layout.MAP_START, _STARTS, lambda keys, values: zip(
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
        return dict(self._read(layout.MAP_MARKS, _MARKS, lambda keys, values: (
            (tid, mark) for (tid,), mark in zip(keys, values, strict=True))))

    def delete_marks(self, tids: Iterable[int]) -> None:
        delete_batch(self._lib, self._table(layout.MAP_MARKS).map_fd, layout.MAP_MARKS, list(tids))

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
        return dict(self._read(layout.MAP_HIST, _HIST, lambda keys, values: (
            (tgid, list(slots[: layout.HIST_SLOTS])) for (tgid,), slots in zip(keys, values, strict=True))))

    def take_hist(self, tgid: int) -> list[int]:
        """Delete a tgid's histogram and return it as it was at the moment of deletion."""
        value = layout.OffcpuHist()
        if lookup_and_delete(self._lib, self._table(layout.MAP_HIST).map_fd, ctypes.c_uint32(tgid), value):
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
