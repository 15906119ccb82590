"""Compiles bpf/offcpu.bpf.c with bcc, attaches it, and is the only reader and writer of its maps."""

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
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from offcpu_exporter.clock import ktime_ns, wall_ns_at
from offcpu_exporter.probe import layout
from offcpu_exporter.probe.btf import BtfError, struct_member_bit_offsets, struct_member_offsets
from offcpu_exporter.probe.compiler_memory import release_compiler_memory
from offcpu_exporter.probe.facts import KernelFacts, probe_kernel
from offcpu_exporter.probe.maps import CounterKey, CounterValue, StartEntry
from offcpu_exporter.probe.stack_ids import stack_id
from offcpu_exporter.unwind import TableCache, UnwindConfig, Unwinder, UnwindMaps, bpf_text
from offcpu_exporter.unwind.build import build_in_child

__all__ = ["Probe", "ProbeConfig", "ProbeError"]

log = logging.getLogger(__name__)

ATTACH_MODES = ("auto", "kprobe", "tracepoint")
_U64_MAX = (1 << 64) - 1
_BPF_NOEXIST = 1
_SYS_BPF = 321  # x86-64
_BPF_ENABLE_STATS = 32
_BPF_STATS_RUN_TIME = 0
_TABLE_MEMORY = 0  # unwind tables are not kept in memory once in the BPF maps (the disk cache has them)
_ENOTSUPP = 524  # the kernel-internal "operation not supported" some map types return
_PID_MAX_LIMIT = 1 << 22  # PID_MAX_LIMIT on 64-bit kernels
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


class ProbeError(Exception):
    """The probe cannot run on this kernel; the message says why and what to do."""


@dataclass(frozen=True)
class ProbeConfig:
    attach: str = "auto"
    per_thread: bool = False
    watch_all: bool = False
    follow_children: bool = False
    min_block_ns: int = 0
    max_block_ns: int = _U64_MAX
    max_targets: int = 16384
    max_proc_events: int = 16384  # processes with news between two refreshes of the targets
    max_threads: int = 65536
    max_counts: int = 65536
    stack_storage: int = 16384
    max_hist: int = 16384  # processes with a histogram
    raw_tracepoint: bool | None = None  # tracepoint mode: raw when BTF allows (None), always, never
    # Stack captures: all of them (False), or a sample bounded per thread and per CPU (True).
    stack_sampling: bool = True
    stack_budget_thread: int = 1000  # captures per second per thread: threads that block less often have all
    stack_budget_cpu: int = 5000  # captures per second per CPU
    long_block_ns: int = 1_000_000  # kprobe mode: blocks at least this long always have their stacks
    sample_window_ns: int = 100_000_000
    run_time_stats: bool = False  # have the kernel time the programs (BPF_ENABLE_STATS)
    # User stacks from DWARF CFI tables for the processes user space describes (else frame pointers).
    unwind: bool = True
    unwind_cache_dir: str | None = None  # tables kept on disk by build id (None: not kept)

    @property
    def in_progress_credit(self) -> bool:
        """Whether blocks still going on at a flush are counted up to it. Not with --max-block: a
        block's length, and so whether it counts at all, is known only when it ends."""
        return self.max_block_ns == _U64_MAX

    def cflags(self, mode: str, extra: Sequence[str] = ()) -> list[str]:
        windows_per_second = 1e9 / self.sample_window_ns
        return [
            f"-I{layout.BPF_DIR}",
            f"-DOFFCPU_ATTACH_{mode.upper()}",
            *extra,
            f"-DPER_THREAD={int(self.per_thread)}",
            f"-DWATCH_ALL={int(self.watch_all)}",
            f"-DFOLLOW_CHILDREN={int(self.follow_children)}",
            f"-DMIN_BLOCK_NS={self.min_block_ns}ULL",
            f"-DMAX_BLOCK_NS={self.max_block_ns}ULL",
            f"-DMAX_TARGETS={self.max_targets}",
            f"-DMAX_PROC_EVENTS={self.max_proc_events}",
            f"-DMAX_PIDS={pid_max()}",
            f"-DMAX_THREADS={self.max_threads}",
            f"-DMAX_COUNTS={self.max_counts}",
            f"-DSTACK_STORAGE={self.stack_storage}",
            f"-DMAX_HIST={self.max_hist}",
            f"-DSTACK_SAMPLING={int(self.stack_sampling)}",
            f"-DSAMPLE_WINDOW_NS={self.sample_window_ns}ULL",
            f"-DTHREAD_BUDGET={max(1, round(self.stack_budget_thread / windows_per_second))}",
            f"-DCPU_BUDGET={max(1, round(self.stack_budget_cpu / windows_per_second))}",
            f"-DLONG_BLOCK_NS={self.long_block_ns}ULL",
            f"-DSTOLEN_MIN_NS={layout.STOLEN_MIN_NS}ULL",
            # bcc's Debian build warns about these in kernel headers it does not own.
            "-Wno-macro-redefined",
            "-Wno-unknown-warning-option",
        ]


def _import_bcc():  # type: ignore[no-untyped-def]
    try:
        import bcc
    except ImportError as e:
        raise ProbeError(
            "the bcc Python module is missing: install Debian's python3-bpfcc (scripts/setup does) and run "
            "from a virtualenv made with --system-site-packages; PyPI's 'bcc' is an unrelated package"
        ) from e
    return bcc


def pid_max(path: str = "/proc/sys/kernel/pid_max") -> int:
    """The kernel's highest pid + 1: the size of the probe's per-pid arrays."""
    try:
        with open(path, encoding="ascii") as f:
            return max(1, min(int(f.read()), _PID_MAX_LIMIT))
    except (OSError, ValueError):
        return _PID_MAX_LIMIT


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
        bcc = _import_bcc()
        facts = self.facts
        mode = self.config.attach
        if mode == "auto":
            mode, self.why = facts.auto_attach()
        else:
            self.why = "asked for with --attach"
        if facts.tracefs is None:
            raise ProbeError("tracefs is not mounted: mount -t tracefs tracefs /sys/kernel/tracing")
        if mode == "tracepoint" and not facts.sched_switch_tracepoint:
            raise ProbeError(f"no sched:sched_switch tracepoint under {facts.tracefs}/events (CONFIG_TRACEPOINTS?)")
        if mode == "kprobe" and not facts.kprobes:
            raise ProbeError("this kernel has no kprobes (CONFIG_KPROBES): use --attach tracepoint or auto")
        if facts.headers_dir is None:
            raise ProbeError(
                f"no kernel headers for {facts.release} under /lib/modules/{facts.release}/build: "
                "run scripts/setup (installs linux-headers or links Debian's generic ones)"
            )
        if mode == "kprobe" and not facts.headers_match:
            log.warning(
                "kernel headers are %s but the kernel is %s: task_struct offsets may be wrong in kprobe mode",
                facts.headers_release, facts.release,
            )
        variant, extra = mode, []
        if mode == "tracepoint" and self.config.raw_tracepoint is not False:
            pid_offset = self._task_pid_offset()
            if pid_offset is not None:
                variant, extra = "raw_tracepoint", [f"-DTASK_PID_OFFSET={pid_offset}"]
            elif self.config.raw_tracepoint:
                raise ProbeError("raw tracepoint asked for, but task_struct.pid is not in /sys/kernel/btf/vmlinux")
        if mode == "kprobe":
            extra = self._task_load_bit()
        extra = [*extra, *self._task_runtime_offsets()]
        source = (layout.BPF_DIR / layout.SOURCE).read_text()
        unwind = self._unwind_config(mode)
        if unwind is not None:
            source = bpf_text(source)
            extra = [*extra, "-DOFFCPU_UNWIND=1", *unwind.cflags()]
        else:
            extra = [*extra, "-DOFFCPU_UNWIND=0"]
        try:
            self._bpf = bcc.BPF(text=source.encode(), cflags=self.config.cflags(variant, extra))
        except Exception as e:  # bcc raises a bare Exception with the compiler's message
            raise ProbeError(f"the BPF program failed to compile or load: {e}") from e
        released = release_compiler_memory()
        log.debug("compiler memory released: %d MB of code advised out", released >> 20)
        self._lib = bcc.libbcc.lib
        if unwind is not None:
            # Tables missing from the cache are parsed in a child process: its memory is not ours to keep.
            self.unwinder = Unwinder(UnwindMaps(self._bpf), build_table=build_in_child,
                                     cache=TableCache(self.config.unwind_cache_dir, memory_bytes=_TABLE_MEMORY))
        self.mode = mode
        if mode == "kprobe":
            self._attach_kprobes()
        elif variant == "raw_tracepoint":
            self.hooked = ("raw_tp:sched_switch",)
        else:
            self.hooked = ("sched:sched_switch",)
        # Counting begins now (tracepoint programs are attached when bcc loads them, kprobes just above).
        self.attached_ktime_ns = ktime_ns()
        self.attached_wall_ns = wall_ns_at(self.attached_ktime_ns)
        if self.config.run_time_stats:
            self.enable_run_time_stats()
        log.info("probe attached: mode=%s (%s), hooked=%s", self.mode, self.why, ",".join(self.hooked))

    def _task_pid_offset(self) -> int | None:
        if not self.facts.raw_sched_switch:
            return None
        try:
            bits = struct_member_bit_offsets("task_struct", ["pid"]).get("pid")
        except BtfError as e:
            log.warning("BTF unreadable (%s): using the perf-event tracepoint", e)
            return None
        return None if bits is None else bits // 8

    def _unwind_config(self, mode: str) -> UnwindConfig | None:
        """The unwinder's build settings, or None when user stacks stay with frame pointers. The
        walk reads the task's saved user registers: through BTF (5.15+), or else at the kernel
        headers' offsets, which only matching headers give."""
        if not self.config.unwind:
            return None
        if self.facts.task_regs_btf:
            return UnwindConfig(regs_btf=True)
        if self.facts.headers_match:
            return UnwindConfig(regs_btf=False)
        log.warning("user stacks with frame pointers only: no BTF (5.15+) and no headers matching the kernel "
                    "to find a task's user registers for the DWARF unwinder")
        return None

    def _task_runtime_offsets(self) -> list[str]:
        """Where a task's run time and its switches are (task_struct::se.sum_exec_runtime,
        se.prev_sum_exec_runtime, nvcsw and nivcsw): the end of a block whose switch-in the kernel
        did not report (end_unseen_block() in the BPF program), and the time a running thread lost
        without a switch (charge_stolen()). Without BTF neither is counted."""
        if not self.facts.btf:
            return []
        try:
            task = struct_member_offsets("task_struct", ["se", "nvcsw", "nivcsw"])
            runtime = struct_member_offsets("sched_entity", ["sum_exec_runtime", "prev_sum_exec_runtime"])
        except BtfError as e:
            log.warning("BTF unreadable (%s): blocks whose switch-in goes unreported, and time stolen from running "
                        "threads, are not counted", e)
            return []
        se = task.get("se")
        if se is None or len(runtime) != 2:
            return []
        flags = [f"-DTASK_SE_RUNTIME_OFFSET={se + runtime['sum_exec_runtime']}",
                 f"-DTASK_SE_PREV_RUNTIME_OFFSET={se + runtime['prev_sum_exec_runtime']}"]
        if "nvcsw" in task and task.get("nivcsw") == task["nvcsw"] + 8:  # read as one pair
            flags.append(f"-DTASK_SWITCHES_OFFSET={task['nvcsw']}")
        return flags

    def _task_load_bit(self) -> list[str]:
        """Where task_struct::sched_contributes_to_load is: the reason of a task that is being woken
        while it switches out (see reason_of_task_state() in the BPF program)."""
        if not self.facts.btf:
            return []
        try:
            bit = struct_member_bit_offsets("task_struct", ["sched_contributes_to_load"]).get(
                "sched_contributes_to_load")
        except BtfError as e:
            log.warning("BTF unreadable (%s): blocks woken during their switch count as sleeping", e)
            return []
        return [] if bit is None else [f"-DTASK_LOAD_BIT={bit}"]

    def _attach_kprobes(self) -> None:
        symbols = self.facts.finish_task_switch
        if not symbols:
            log.warning("no finish_task_switch symbol found in /proc/kallsyms; trying finish_task_switch")
            symbols = ("finish_task_switch",)
        hooked: list[str] = []
        assert self._bpf is not None
        for symbol in symbols:
            try:
                self._bpf.attach_kprobe(event=symbol.encode(), fn_name=b"offcpu_finish_task_switch")
                hooked.append(symbol)
            except Exception as e:
                log.warning("kprobe on %s failed: %s", symbol, e)
        if not hooked:
            self.close()
            raise ProbeError(f"no kprobe could be attached to any of {', '.join(symbols)}")
        self.hooked = tuple(hooked)

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
