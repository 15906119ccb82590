"""The Python mirror of bpf/offcpu.h: map names, struct layouts and constants.

tests/unit/probe/test_layout.py compiles the header with the C compiler and checks every size and offset
against these ctypes structures.
"""

from __future__ import annotations

import ctypes

from offcpu_exporter.bpf import SOURCE_DIR

BPF_DIR = SOURCE_DIR
SOURCE = "offcpu.bpf.c"
HEADER = "offcpu.h"

# Map names as declared in bpf/offcpu.bpf.c.
MAP_TARGETS = "targets"
MAP_CHILDREN = "children"
MAP_START = "start"
MAP_OFF_CPU = "off_cpu"  # per tid: 1 while `start` has its entry
MAP_MARKS = "marks"
MAP_COUNTS = "counts"
MAP_HIST = "hist"
MAP_STACKS = "stacks"
MAP_CONTROL = "control"
MAP_STATS = "stats"
MAP_SAMPLER = "sampler"
MAP_PROC_EVENTS = "proc_events"
MAP_WAKERS = "wakers"  # with wakers on: tid -> the waker of its block in progress

STAT_COUNTS_DROPPED = 0
STAT_COUNTS_DROPPED_NS = 1
STAT_START_DROPPED = 2
STAT_HIST_DROPPED = 3
STAT_FILTERED = 4
STAT_FILTERED_NS = 5
STAT_STACKS_DROPPED = 6
STAT_STACK_KEYS_FOLDED = 7
STAT_BLOCKS = 8
STAT_CAPTURES = 9
STAT_MISSED_SWITCH_INS = 10
STAT_PROC_EVENTS_DROPPED = 11
STAT_WAKERS_DROPPED = 12
STAT_MAX = 13

HIST_SLOTS = 27
HIST_ROOM = 32

STACK_NOT_CAPTURED = 0
STACK_EMPTY = 1
STACK_SEEDED = 2
STACK_STOLEN = 3
STACK_ERRNO_BASE = 1024
STACK_RESERVED = 4096
MAX_DEPTH = 127

START_SEEDED = 1  # struct offcpu_start.flags
# A run's time the scheduler did not account to the thread, up to which it is the switch's own cost
# rather than time taken from it (charge_stolen() in offcpu.bpf.c): picking the next task and
# switching take a few us, a hypervisor's steal is ticks long.
STOLEN_MIN_NS = 20_000

PROC_FORK = 1
PROC_EXEC = 2
PROC_EXIT = 4
PROC_RENAME = 8

WAKER_NONE = 0  # struct offcpu_waker.context
WAKER_TASK = 1
WAKER_INTERRUPT = 2

TARGET_WATCH = 1
TARGET_EXCLUDE = 2


class OffcpuKey(ctypes.Structure):
    _fields_ = (
        ("tgid", ctypes.c_uint32),
        ("tid", ctypes.c_uint32),
        ("reason", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
        ("user_stack", ctypes.c_uint64),
        ("kernel_stack", ctypes.c_uint64),
    )


class OffcpuWaker(ctypes.Structure):
    _fields_ = (
        ("tgid", ctypes.c_uint32),
        ("tid", ctypes.c_uint32),
        ("context", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
        ("user_stack", ctypes.c_uint64),
        ("kernel_stack", ctypes.c_uint64),
        ("comm", ctypes.c_char * 16),
    )


class OffcpuWakerKey(ctypes.Structure):
    _fields_ = (("block", OffcpuKey), ("waker", OffcpuWaker))


class OffcpuWake(ctypes.Structure):
    _fields_ = (("block_ts_ns", ctypes.c_uint64), ("waker", OffcpuWaker))


class OffcpuValue(ctypes.Structure):
    _fields_ = (
        ("count", ctypes.c_uint64),
        ("ns", ctypes.c_uint64),
        ("wcount", ctypes.c_uint64),
        ("wns", ctypes.c_uint64),
    )


class OffcpuStart(ctypes.Structure):
    _fields_ = (
        ("ts_ns", ctypes.c_uint64),
        ("user_stack", ctypes.c_uint64),
        ("kernel_stack", ctypes.c_uint64),
        ("tgid", ctypes.c_uint32),
        ("reason", ctypes.c_uint32),
        ("weight", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
    )


class OffcpuRun(ctypes.Structure):
    _fields_ = (("tid", ctypes.c_uint32), ("pad", ctypes.c_uint32), ("ts_ns", ctypes.c_uint64),
                ("runtime_ns", ctypes.c_uint64), ("switches", ctypes.c_uint64))


class OffcpuCpuRuns(ctypes.Structure):
    _fields_ = (("latest", OffcpuRun), ("earlier", OffcpuRun))


class OffcpuMark(ctypes.Structure):
    _fields_ = (("start_ns", ctypes.c_uint64), ("until_ns", ctypes.c_uint64))


class OffcpuControl(ctypes.Structure):
    _fields_ = (("cutoff_ns", ctypes.c_uint64), ("marks_active", ctypes.c_uint32), ("pad", ctypes.c_uint32))


class OffcpuStack(ctypes.Structure):
    _fields_ = (("ips", ctypes.c_uint64 * MAX_DEPTH),)


class OffcpuSampler(ctypes.Structure):
    _fields_ = (("window_start_ns", ctypes.c_uint64), ("switches", ctypes.c_uint32), ("shift", ctypes.c_uint32))


class OffcpuCpuSampler(ctypes.Structure):
    _fields_ = (("window_start_ns", ctypes.c_uint64), ("captures", ctypes.c_uint32), ("shift", ctypes.c_uint32))


class OffcpuHist(ctypes.Structure):
    _fields_ = (("slots", ctypes.c_uint64 * HIST_ROOM),)  # the first HIST_SLOTS are used


class OffcpuChild(ctypes.Structure):
    _fields_ = (
        ("fork_boot_ns", ctypes.c_uint64),
        ("parent_tgid", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
        ("comm", ctypes.c_char * 16),
    )


STRUCTS: dict[str, type[ctypes.Structure]] = {
    "offcpu_child": OffcpuChild,
    "offcpu_key": OffcpuKey,
    "offcpu_waker": OffcpuWaker,
    "offcpu_waker_key": OffcpuWakerKey,
    "offcpu_wake": OffcpuWake,
    "offcpu_value": OffcpuValue,
    "offcpu_start": OffcpuStart,
    "offcpu_mark": OffcpuMark,
    "offcpu_run": OffcpuRun,
    "offcpu_cpu_runs": OffcpuCpuRuns,
    "offcpu_control": OffcpuControl,
    "offcpu_stack": OffcpuStack,
    "offcpu_sampler": OffcpuSampler,
    "offcpu_cpu_sampler": OffcpuCpuSampler,
    "offcpu_hist": OffcpuHist,
}
