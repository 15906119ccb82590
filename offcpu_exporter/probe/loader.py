"""Compiles offcpu_exporter/bpf/offcpu.bpf.c with bcc, attaches it, and is the only reader of its maps."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from offcpu_exporter.probe import layout
from offcpu_exporter.probe.btf import BtfError, struct_member_offsets
from offcpu_exporter.probe.compiler_memory import release_compiler_memory
from offcpu_exporter.probe.kernel import KernelFacts, finish_task_switch_symbols, probe_kernel

__all__ = ["Probe", "ProbeConfig", "ProbeError", "RawKey"]

log = logging.getLogger(__name__)

# (tgid, tid, user_stack_id, kernel_stack_id, reason): a kernel counter key as a hashable tuple.
RawKey = tuple[int, int, int, int, int]

ATTACH_MODES = ("auto", "kprobe", "tracepoint")
_U64_MAX = (1 << 64) - 1
_S32_MAX = (1 << 31) - 1


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
    max_threads: int = 65536
    max_counts: int = 65536
    stack_storage: int = 16384
    stack_spill: int = 0  # entries of the map collided stacks go to; 0: a quarter of stack_storage
    max_hist: int = 16384
    raw_tracepoint: bool | None = None  # tracepoint mode: raw when BTF allows (None), always, never

    @property
    def stack_spill_entries(self) -> int:
        return self.stack_spill or max(1, self.stack_storage // 4)

    @property
    def stack_spill_base(self) -> int:
        """The first id of the spill map's stacks: the main map's bucket count (the kernel rounds
        its entries up to a power of two and ids are bucket indices)."""
        return 1 << (self.stack_storage - 1).bit_length()

    def stack_slot(self, stack_id: int) -> tuple[str, int]:
        """The map that holds a stack id and its index there: the spill map's ids are offset."""
        base = self.stack_spill_base
        return (layout.MAP_STACK_SPILL, stack_id - base) if stack_id >= base else (layout.MAP_STACKS, stack_id)

    def cflags(self, mode: str, extra: Sequence[str] = ()) -> list[str]:
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
            f"-DMAX_THREADS={self.max_threads}",
            f"-DMAX_COUNTS={self.max_counts}",
            f"-DSTACK_STORAGE={self.stack_storage}",
            f"-DSTACK_SPILL={self.stack_spill_entries}",
            f"-DSTACK_SPILL_BASE={self.stack_spill_base}",
            f"-DMAX_HIST={self.max_hist}",
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


class Probe:
    """The loaded BPF program. Not thread-safe: one owner (the pipeline) calls it."""

    def __init__(self, config: ProbeConfig, facts: KernelFacts | None = None) -> None:
        if config.attach not in ATTACH_MODES:
            raise ProbeError(f"unknown attach mode {config.attach!r}; use one of {', '.join(ATTACH_MODES)}")
        if config.stack_spill_base + config.stack_spill_entries > _S32_MAX:
            raise ProbeError(f"stack storage size {config.stack_storage} is too large: stack ids are 32-bit")
        self.config = config
        self.facts = facts or probe_kernel()
        self.mode = ""
        self.why = ""
        self.hooked: tuple[str, ...] = ()
        self._bpf = None
        self._lookup_and_delete = None

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
        source = (layout.BPF_DIR / layout.SOURCE).read_text()
        try:
            self._bpf = bcc.BPF(text=source.encode(), cflags=self.config.cflags(variant, extra))
        except Exception as e:  # bcc raises a bare Exception with the compiler's message
            raise ProbeError(f"the BPF program failed to compile or load: {e}") from e
        released = release_compiler_memory()
        log.debug("compiler memory released: %d MB of code advised out", released >> 20)
        self.mode = mode
        if mode == "kprobe":
            self._attach_kprobes()
        elif variant == "raw_tracepoint":
            self.hooked = ("raw_tp:sched_switch",)
        else:
            self.hooked = ("sched:sched_switch",)
        lib = bcc.libbcc.lib
        self._lookup_and_delete = getattr(lib, "bpf_lookup_and_delete", None)
        log.info("probe attached: mode=%s (%s), hooked=%s", self.mode, self.why, ",".join(self.hooked))

    def _task_pid_offset(self) -> int | None:
        # The 4-argument raw sched_switch (with prev_state) exists since 5.18.
        major, minor = (int(x) for x in self.facts.release.split(".")[:2])
        if not self.facts.btf or (major, minor) < (5, 18):
            return None
        try:
            return struct_member_offsets("task_struct", ["pid"]).get("pid")
        except BtfError as e:
            log.warning("BTF unreadable (%s): using the perf-event tracepoint", e)
            return None

    def _attach_kprobes(self) -> None:
        symbols = finish_task_switch_symbols()
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

    @property
    def attached(self) -> bool:
        return self._bpf is not None

    def _table(self, name: str):  # type: ignore[no-untyped-def]
        assert self._bpf is not None, "probe not started"
        return self._bpf[name.encode()]

    # -- targets ---------------------------------------------------------------------------

    def kernel_targets(self) -> dict[int, int]:
        return {k.value: v.value for k, v in self._table(layout.MAP_TARGETS).items()}

    def set_target(self, tgid: int, value: int = 1) -> None:
        table = self._table(layout.MAP_TARGETS)
        table[table.Key(tgid)] = table.Leaf(value)

    def remove_target(self, tgid: int) -> None:
        table = self._table(layout.MAP_TARGETS)
        with contextlib.suppress(KeyError):
            del table[table.Key(tgid)]

    def children(self) -> dict[int, tuple[int, int, str]]:
        """Followed children: tgid -> (parent tgid, fork boot ns, comm)."""
        return {
            k.value: (v.parent_tgid, v.fork_boot_ns, bytes(v.comm).split(b"\0", 1)[0].decode(errors="replace"))
            for k, v in self._table("children").items()
        }

    def forget_child(self, tgid: int) -> None:
        table = self._table("children")
        with contextlib.suppress(KeyError):
            del table[table.Key(tgid)]

    # -- counters --------------------------------------------------------------------------

    def read_counts(self) -> Iterator[tuple[RawKey, int, int]]:
        table = self._table(layout.MAP_COUNTS)
        try:
            items: Iterable = table.items_lookup_batch()
            for k, v in items:
                yield (k.tgid, k.tid, k.user_stack_id, k.kernel_stack_id, k.reason), v.count, v.total_ns
        except Exception as e:  # kernels without BPF_MAP_LOOKUP_BATCH: one key at a time
            if "BATCH" not in str(e) and not isinstance(e, OSError):
                raise
            for k, v in table.items():
                yield (k.tgid, k.tid, k.user_stack_id, k.kernel_stack_id, k.reason), v.count, v.total_ns

    def take_counts(self, keys: Iterable[RawKey]) -> dict[RawKey, tuple[int, int]]:
        """Delete these counters and return their values at the moment of deletion, so that an
        increment between the last read and the delete is not lost."""
        table = self._table(layout.MAP_COUNTS)
        out: dict[RawKey, tuple[int, int]] = {}
        value = layout.OffcpuValue()
        for raw in keys:
            key = layout.OffcpuKey(*raw)
            if self._lookup_and_delete is not None:
                rc = self._lookup_and_delete(table.map_fd, ctypes.byref(key), ctypes.byref(value))
                if rc == 0:
                    out[raw] = (value.count, value.total_ns)
                    continue
                if ctypes.get_errno() == errno.ENOENT or rc == -errno.ENOENT:
                    continue
            try:
                leaf = table[key]
                out[raw] = (leaf.count, leaf.total_ns)
                del table[key]
            except KeyError:
                pass
        return out

    def _stack_slot(self, stack_id: int) -> tuple[Any, Any]:
        name, index = self.config.stack_slot(stack_id)
        table = self._table(name)
        return table, table.Key(index)

    def stack(self, stack_id: int) -> tuple[int, ...] | None:
        """The addresses of a stack id, leaf first; None if the id is not in the map."""
        table, key = self._stack_slot(stack_id)
        try:
            trace = table[key]
        except KeyError:
            return None
        out = []
        for addr in trace.ip:
            if addr == 0:
                break
            out.append(addr)
        return tuple(out)

    def delete_stacks(self, stack_ids: Iterable[int]) -> None:
        for sid in stack_ids:
            table, key = self._stack_slot(sid)
            with contextlib.suppress(KeyError):
                del table[key]

    def pending_stack_ids(self) -> set[int]:
        """Stack ids held by threads that are switched out now (tracepoint mode captures them
        at switch-out): these must not be reclaimed."""
        out = set()
        for _, v in self._table(layout.MAP_START).items():
            out.add(v.user_stack_id)
            out.add(v.kernel_stack_id)
        return out

    def read_hist(self) -> dict[int, list[int]]:
        """tgid -> cumulative block count per duration slot."""
        out: dict[int, list[int]] = {}
        for k, v in self._table(layout.MAP_HIST).items():
            slots = out.setdefault(k.tgid, [0] * layout.HIST_SLOTS)
            if 0 <= k.slot < layout.HIST_SLOTS:
                slots[k.slot] += v.value
        return out

    def delete_hist(self, tgid: int) -> None:
        table = self._table(layout.MAP_HIST)
        for slot in range(layout.HIST_SLOTS):
            with contextlib.suppress(KeyError):
                del table[layout.OffcpuHistKey(tgid, slot)]

    def stats(self) -> list[int]:
        table = self._table(layout.MAP_STATS)
        out = [0] * layout.STAT_MAX
        for k, per_cpu in table.items():
            if 0 <= k.value < layout.STAT_MAX:
                out[k.value] = sum(per_cpu)
        return out

    def map_sizes(self, counts_entries: int) -> dict[str, tuple[int, int]]:
        """map -> (entries now, capacity). The counts map was just read by the caller; the
        others are walked (one syscall per entry): call once per flush."""
        cfg = self.config
        sizes = {layout.MAP_COUNTS: (counts_entries, cfg.max_counts)}
        for name, cap in ((layout.MAP_START, cfg.max_threads), (layout.MAP_HIST, cfg.max_hist),
                          (layout.MAP_TARGETS, cfg.max_targets)):
            sizes[name] = (len(self._table(name)), cap)
        return sizes


def exporter_tgid() -> int:
    return os.getpid()
