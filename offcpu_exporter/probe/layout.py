"""The Python mirror of offcpu_exporter/bpf/offcpu.h: map names, struct layouts and constants.

tests/unit/test_layout.py compiles the header with the C compiler and checks every size and offset
against these ctypes structures.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

BPF_DIR = Path(__file__).resolve().parents[1] / "bpf"
SOURCE = "offcpu.bpf.c"
HEADER = "offcpu.h"

# Map names as declared in offcpu_exporter/bpf/offcpu.bpf.c.
MAP_TARGETS = "targets"
MAP_START = "start"
MAP_COUNTS = "counts"
MAP_HIST = "hist"
MAP_STACKS = "stack_traces"
MAP_STACK_SPILL = "stack_spill"  # stacks that collided in MAP_STACKS
MAP_STATS = "stats"

STAT_COUNTS_DROPPED = 0
STAT_COUNTS_DROPPED_NS = 1
STAT_START_DROPPED = 2
STAT_HIST_DROPPED = 3
STAT_FILTERED = 4
STAT_STACKS_SPILLED = 5
STAT_MAX = 6

HIST_SLOTS = 27

TARGET_WATCH = 1
TARGET_EXCLUDE = 2


class OffcpuKey(ctypes.Structure):
    _fields_ = (
        ("tgid", ctypes.c_uint32),
        ("tid", ctypes.c_uint32),
        ("user_stack_id", ctypes.c_int32),
        ("kernel_stack_id", ctypes.c_int32),
        ("reason", ctypes.c_uint32),
    )


class OffcpuValue(ctypes.Structure):
    _fields_ = (("count", ctypes.c_uint64), ("total_ns", ctypes.c_uint64))


class OffcpuStart(ctypes.Structure):
    _fields_ = (
        ("ts_ns", ctypes.c_uint64),
        ("tgid", ctypes.c_uint32),
        ("reason", ctypes.c_uint32),
        ("user_stack_id", ctypes.c_int32),
        ("kernel_stack_id", ctypes.c_int32),
    )


class OffcpuHistKey(ctypes.Structure):
    _fields_ = (("tgid", ctypes.c_uint32), ("slot", ctypes.c_uint32))


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
    "offcpu_value": OffcpuValue,
    "offcpu_start": OffcpuStart,
    "offcpu_hist_key": OffcpuHistKey,
}
