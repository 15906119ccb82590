"""The user-space walk (unwind/walk.py) over a synthetic stack image and a table built from
synthetic CFI rows, placed at a mapping as the Unwinder places it (unwind/rows.py)."""

from __future__ import annotations

import struct

from offcpu_exporter.unwind import layout
from offcpu_exporter.unwind.rows import PlacedTable, TableRows
from offcpu_exporter.unwind.table import build_table
from offcpu_exporter.unwind.walk import END_RBP_UNKNOWN, walk_user_stack

RSP, RBP, END, SIGNAL = layout.CFA_RSP, layout.CFA_RBP, layout.CFA_END, layout.CFA_SIGNAL
SAME, SAVED = layout.RBP_SAME, layout.RBP_OFFSET
LOAD = 0x5555_0000_0000  # where the object is mapped (file offset 0 at object address 0)


class Memory:
    """A sparse image of a thread's stack: 8-byte words at addresses."""

    def __init__(self) -> None:
        self.words: dict[int, int] = {}

    def put(self, address: int, value: int) -> None:
        self.words[address] = value

    def read(self, address: int, size: int) -> bytes | None:
        assert size == 8
        value = self.words.get(address)
        return None if value is None else struct.pack("<Q", value)


def _rows(fdes: list[tuple[int, int, list[tuple[int, int, int, int, int]]]]) -> TableRows:
    table = build_table(fdes)
    return TableRows([PlacedTable(LOAD, LOAD + 0x10000, LOAD + table.base, table)])


# Four functions of one object (object addresses), each with one row after its prologue:
#   leaf   0x1000-0x1100  CFA = rsp + 16                  (pushed one word)
#   middle 0x2000-0x2100  CFA = rsp + 32, rbp at CFA - 16 (push rbp; sub)
#   framed 0x3000-0x3100  CFA = rbp + 16, rbp at CFA - 16 (a frame-pointer function: alloca)
#   entry  0x4000-0x4100  outermost (.cfi_undefined rip)
TABLE = [
    (0x1000, 0x1100, [(0x1000, RSP, 8, SAME, 0), (0x1001, RSP, 16, SAME, 0)]),
    (0x2000, 0x2100, [(0x2000, RSP, 8, SAME, 0), (0x2004, RSP, 32, SAVED, -16)]),
    (0x3000, 0x3100, [(0x3000, RSP, 8, SAME, 0), (0x3004, RBP, 16, SAVED, -16)]),
    (0x4000, 0x4100, [(0x4000, END, 0, SAME, 0)]),
]
SP = 0x7FFF_0000_1000


def _stack() -> Memory:
    """leaf (pc LOAD+0x1050) <- middle <- framed <- entry, as the calls left them."""
    mem = Memory()
    # leaf: CFA = SP + 16, its return address (into middle, after the call at 0x2050)
    mem.put(SP + 8, LOAD + 0x2055)
    # middle: CFA = SP + 16 + 32; saved rbp at CFA - 16: framed's frame pointer
    cfa_middle = SP + 48
    framed_bp = SP + 0x100
    mem.put(cfa_middle - 8, LOAD + 0x3065)
    mem.put(cfa_middle - 16, framed_bp)
    # framed: CFA = rbp + 16; return address at CFA - 8, the caller's rbp at CFA - 16
    mem.put(framed_bp + 8, LOAD + 0x4010)
    mem.put(framed_bp, 0)
    return mem


def test_the_walk_follows_rsp_and_rbp_rules_down_to_the_outermost_frame() -> None:
    walk = walk_user_stack(LOAD + 0x1050, SP, _rows(TABLE), _stack().read)
    assert walk.frames == (LOAD + 0x1050, LOAD + 0x2055, LOAD + 0x3065, LOAD + 0x4010)
    assert walk.end == layout.END_ROOT and walk.complete


def test_rbp_is_unknown_until_a_frame_restores_it() -> None:
    # Without middle's saved rbp (its row says rbp is unchanged), framed's CFA cannot be found:
    # the walk stops there with what it has.
    table = [TABLE[0], (0x2000, 0x2100, [(0x2000, RSP, 32, SAME, 0)]), *TABLE[2:]]
    walk = walk_user_stack(LOAD + 0x1050, SP, _rows(table), _stack().read)
    assert walk.frames == (LOAD + 0x1050, LOAD + 0x2055, LOAD + 0x3065)
    assert walk.end == END_RBP_UNKNOWN and not walk.complete
    # Given rbp at the start (as the probe has it), the same walk completes.
    assert walk_user_stack(LOAD + 0x1050, SP, _rows(table), _stack().read, bp=SP + 0x100).complete


def test_code_without_a_table_is_stepped_with_a_known_frame_pointer_only() -> None:
    mem = _stack()
    # A leaf outside every table (JIT code) with no rbp: the leaf alone.
    walk = walk_user_stack(0x9000_0000, SP, _rows(TABLE), mem.read)
    assert walk.frames == (0x9000_0000,) and walk.end == END_RBP_UNKNOWN
    # With rbp known: one frame-pointer step (CFA = rbp + 16), then the tables again.
    walk = walk_user_stack(0x9000_0000, SP, _rows(TABLE), mem.read, bp=SP + 0x100)
    assert walk.frames == (0x9000_0000, LOAD + 0x4010) and walk.complete


def test_return_addresses_are_looked_up_at_their_call_instruction() -> None:
    # The return address is the first byte after middle's FDE: its row is middle's (pc - 1).
    mem = Memory()
    mem.put(SP + 8, LOAD + 0x2100)
    mem.put(SP + 48 - 8, LOAD + 0x4010)
    mem.put(SP + 48 - 16, 0)
    walk = walk_user_stack(LOAD + 0x1050, SP, _rows(TABLE), mem.read)
    assert walk.frames == (LOAD + 0x1050, LOAD + 0x2100, LOAD + 0x4010) and walk.complete


def test_a_signal_frame_gives_the_interrupted_registers() -> None:
    table = [*TABLE, (0x5000, 0x5010, [(0x5000, SIGNAL, 0, SAME, 0)])]
    mem = _stack()
    trampoline_sp = SP - 0x400
    mem.put(trampoline_sp + 120, 0)  # rbp
    mem.put(trampoline_sp + 160, SP)  # rsp
    mem.put(trampoline_sp + 168, LOAD + 0x1050)  # rip: the interrupted leaf
    # The handler's frame returns into the trampoline (__restore_rt, whose FDE glibc starts a byte
    # early so that the return address minus one is in it).
    handler_sp = trampoline_sp - 16
    mem.put(handler_sp + 8, LOAD + 0x5001)
    walk = walk_user_stack(LOAD + 0x1010, handler_sp, _rows(table), mem.read)
    assert walk.frames == (LOAD + 0x1010, LOAD + 0x5001, LOAD + 0x1050, LOAD + 0x2055, LOAD + 0x3065,
                           LOAD + 0x4010)
    assert walk.complete


def test_unreadable_memory_and_a_stack_pointer_that_does_not_move_up_end_the_walk() -> None:
    walk = walk_user_stack(LOAD + 0x1050, SP, _rows(TABLE), Memory().read)
    assert walk.frames == (LOAD + 0x1050,) and walk.end == layout.END_FAULT
    bad = [(0x1000, 0x1100, [(0x1000, RSP, -8, SAME, 0)])]
    walk = walk_user_stack(LOAD + 0x1050, SP, _rows(bad), _stack().read)
    assert walk.end == layout.END_BAD_FRAME


def test_the_walk_stops_at_the_probes_depth() -> None:
    # A function that calls itself: each frame's return address is its own.
    mem = Memory()
    for i in range(200):
        mem.put(SP + 16 * i + 8, LOAD + 0x1055)
    walk = walk_user_stack(LOAD + 0x1050, SP, _rows(TABLE), mem.read)
    assert len(walk.frames) == 127 and walk.end == layout.END_DEPTH
