"""The user-stack walk of bpf/unwind.h, in user space, for a thread that is blocked
now: its stack is read through /proc/PID/mem instead of bpf_probe_read_user().

Frame for frame the same rules as the BPF walk (CFA from rsp or rbp, the return address at CFA - 8,
rbp reloaded where the row says it was saved, the kernel's rt_sigframe for a signal trampoline, a
frame-pointer step where there is no usable row, the same ends), so that a stack captured here is
the one the probe would have captured at the block's switch-out. One difference: the walk starts
from the pc and sp that /proc/PID/task/TID/syscall shows, without rbp (the kernel prints only those
two of the saved user registers), so rbp is unknown until a frame's CFI reloads it from the stack;
a frame that needs it before that ends the walk (``END_RBP_UNKNOWN``): a shorter stack, still with
its leaf frames.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from offcpu_exporter.unwind import layout

__all__ = ["END_RBP_UNKNOWN", "Row", "RowLookup", "Walk", "walk_user_stack"]

# A row as the walk uses it: (cfa rule, cfa offset, rbp rule, rbp offset).
Row = tuple[int, int, int, int]
# How the walk ended when it needed rbp before any frame had restored it.
END_RBP_UNKNOWN = layout.END_MAX
MAX_FRAMES = 127  # UNWIND_MAX_FRAMES: the probe's depth

# struct rt_sigframe on x86-64 (see UNWIND_SIGFRAME_* in unwind.h): rbp, rsp, rip of the
# interrupted code at these offsets from the trampoline's rsp.
_SIGFRAME_RBP = 120
_SIGFRAME_RSP = 160
_SIGFRAME_RIP = 168
_U64 = struct.Struct("<Q")
_NO_ROW: Row = (layout.CFA_NONE, 0, layout.RBP_SAME, 0)


class RowLookup(Protocol):
    def __call__(self, address: int) -> Row | None:
        """The row in effect at process address ``address``, or None where the BPF walk finds no
        mapping, no table or no row (it then takes a frame-pointer step)."""


ReadMemory = Callable[[int, int], bytes | None]  # (address, size) -> the bytes, or None if unreadable


@dataclass(frozen=True, slots=True)
class Walk:
    frames: tuple[int, ...]  # leaf first: the pc, then return addresses (as the probe stores them)
    end: int  # layout.END_* or END_RBP_UNKNOWN

    @property
    def complete(self) -> bool:
        """Down to the thread's outermost frame."""
        return self.end == layout.END_ROOT


def walk_user_stack(pc: int, sp: int, rows: RowLookup, read: ReadMemory, *, bp: int | None = None,
                    max_frames: int = MAX_FRAMES) -> Walk:
    """The stack of a thread stopped at ``pc`` with stack pointer ``sp`` (and ``bp`` if known)."""
    frames: list[int] = []
    after_call = 0  # 1 when pc is a return address: its row is the call instruction's (pc - 1)
    end = layout.END_DEPTH
    for _ in range(max_frames):
        frames.append(pc)
        row = rows(pc - after_call) or _NO_ROW
        rule, cfa_offset, rbp_rule, rbp_offset = row
        if rule == layout.CFA_END:
            end = layout.END_ROOT
            break
        if rule == layout.CFA_SIGNAL:
            saved_bp, saved_sp, saved_pc = _u64(read, sp + _SIGFRAME_RBP), _u64(read, sp + _SIGFRAME_RSP), \
                _u64(read, sp + _SIGFRAME_RIP)
            if saved_bp is None or saved_sp is None or saved_pc is None:
                end = layout.END_FAULT
                break
            bp, sp, pc = saved_bp, saved_sp, saved_pc
            after_call = 0  # the interrupted instruction itself
            if pc == 0:
                end = layout.END_FP_ZERO
                break
            continue
        if rule == layout.CFA_RSP:
            cfa = sp + cfa_offset
        elif rule == layout.CFA_RBP:
            if bp is None:
                end = END_RBP_UNKNOWN
                break
            cfa = bp + cfa_offset
        elif rule == layout.CFA_PLT:
            cfa = sp + 8 + (8 if (pc & 15) >= cfa_offset else 0)
        else:
            # No usable row: a frame-pointer step, as bpf_get_stack would take.
            if bp is None:
                end = END_RBP_UNKNOWN
                break
            if bp == 0:
                end = layout.END_FP_ZERO
                break
            cfa = bp + 16
            rbp_rule, rbp_offset = layout.RBP_OFFSET, -16
        cfa &= (1 << 64) - 1
        if cfa <= sp:
            end = layout.END_BAD_FRAME
            break
        ra = _u64(read, cfa - 8)
        if ra is None:
            end = layout.END_FAULT
            break
        if rbp_rule == layout.RBP_OFFSET:
            bp = _u64(read, cfa + rbp_offset)
            if bp is None:
                end = layout.END_FAULT
                break
        if ra == 0:
            end = layout.END_FP_ZERO
            break
        sp, pc, after_call = cfa, ra, 1
    return Walk(tuple(frames), end)


def _u64(read: ReadMemory, address: int) -> int | None:
    data = read(address, 8)
    if data is None or len(data) != 8:
        return None
    value: int = _U64.unpack(data)[0]
    return value
