"""The Python mirror of bpf/unwind_table.h (struct layouts and constants) and the
names of the maps bpf/unwind.h declares.

tests/unit/unwind/test_layout.py compiles the header with the C compiler and checks every size,
offset and constant against this module.
"""

from __future__ import annotations

import ctypes

HEADER = "unwind_table.h"
WALK_HEADER = "unwind.h"

MAP_ROWS = "unwind_rows"
MAP_PAGES = "unwind_pages"
MAP_PROCESSES = "unwind_processes"
MAP_MAPPINGS = "unwind_mappings"
MAP_STATS = "unwind_stats"

CFA_NONE = 0
CFA_RSP = 1
CFA_RBP = 2
CFA_PLT = 3
CFA_SIGNAL = 4
CFA_END = 5
CFA_BAD = 6

RBP_SAME = 0
RBP_OFFSET = 1

PAGE_SHIFT = 12
SEARCH_STEPS = 10
MAX_MAPPINGS_SHIFT = 8
MAX_MAPPINGS = 1 << MAX_MAPPINGS_SHIFT

END_ROOT = 0
END_FP_ZERO = 1
END_DEPTH = 2
END_FAULT = 3
END_BAD_FRAME = 4
END_NO_REGS = 5
END_MAX = 6

STAT_FRAMES_CFI = END_MAX + 0
STAT_FRAMES_FP = END_MAX + 1
STAT_FRAMES_BAD = END_MAX + 2
STAT_FRAMES_SIGNAL = END_MAX + 3
STAT_NO_PROCESS = END_MAX + 4
STAT_MAX = END_MAX + 5

END_NAMES = {END_ROOT: "root", END_FP_ZERO: "frame_pointer_end", END_DEPTH: "depth", END_FAULT: "fault",
             END_BAD_FRAME: "bad_frame", END_NO_REGS: "no_user_regs"}
STAT_NAMES = {**END_NAMES, STAT_FRAMES_CFI: "frames_cfi", STAT_FRAMES_FP: "frames_frame_pointer",
              STAT_FRAMES_BAD: "frames_unsupported_cfi", STAT_FRAMES_SIGNAL: "frames_signal",
              STAT_NO_PROCESS: "walks_without_tables"}


class UnwindRow(ctypes.Structure):
    _fields_ = (
        ("pc", ctypes.c_uint32),
        ("cfa_offset", ctypes.c_int32),
        ("rbp_offset", ctypes.c_int16),
        ("cfa_rule", ctypes.c_uint8),
        ("rbp_rule", ctypes.c_uint8),
    )


class UnwindPage(ctypes.Structure):
    _fields_ = (("first", ctypes.c_uint32), ("count", ctypes.c_uint32))


class UnwindMapping(ctypes.Structure):
    _fields_ = (
        ("start", ctypes.c_uint64),
        ("end", ctypes.c_uint64),
        ("bias", ctypes.c_uint64),
        ("page_first", ctypes.c_uint32),
        ("page_count", ctypes.c_uint32),
    )


class UnwindProcess(ctypes.Structure):
    _fields_ = (("first", ctypes.c_uint32), ("count", ctypes.c_uint32))


STRUCTS: dict[str, type[ctypes.Structure]] = {
    "unwind_row": UnwindRow,
    "unwind_page": UnwindPage,
    "unwind_mapping": UnwindMapping,
    "unwind_process": UnwindProcess,
}
