"""DWARF call frame information (``.eh_frame``, ``.debug_frame``) of one x86-64 ELF object, reduced
to the compact rows of ``bpf/unwind_table.h``.

pyelftools parses the CIEs and FDEs and their instructions. The instructions are interpreted here
rather than with pyelftools' ``get_decoded()``: that one stops at ``DW_CFA_GNU_args_size`` (glibc
has it), factors ``DW_CFA_def_cfa_sf`` by the code alignment instead of the data alignment, and
deep-copies its state at every row; and only three registers matter here (the CFA's, rbp's and the
return address's).

What the compact form holds per row, and what becomes of the rest (each counted in
:class:`CfiStats`):
- CFA = rsp or rbp + offset; rbp saved at CFA + offset or unchanged; return address at CFA - 8
  (the x86-64 psABI: CIEs here all say so);
- ``DW_CFA_undefined rip`` (glibc's ``_start``, ``clone``, ``clone3``): the outermost frame;
- the two CFA expressions of PLT sections (``.plt`` with lit11, ``.plt.sec``/IBT with lit10), the
  ones Parca and the OpenTelemetry profiler recognize too;
- signal trampolines (augmentation ``S``: glibc's ``__restore_rt``): the registers come from the
  kernel's signal frame, whose layout is fixed by the ABI, so the expressions are not evaluated;
- anything else (another CFA expression or register, an rbp rule other than an offset) is a row
  that says "use the frame pointer here" (UNWIND_CFA_BAD), which is what an unwinder without this
  row would do anyway.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from elftools.dwarf.callframe import CIE, FDE

from offcpu_exporter.unwind import layout

__all__ = ["CfiRow", "CfiStats", "Fde", "fde_rows"]

# x86-64 DWARF register numbers (psABI figure 3.36).
_RBP, _RSP, _RIP = 6, 7, 16

# (cfa_rule, cfa_offset, rbp_rule, rbp_offset); a row is (pc, *Rule).
Rule = tuple[int, int, int, int]
CfiRow = tuple[int, int, int, int, int]
# One FDE's address range [start, end) and its rows, in order.
Fde = tuple[int, int, list[CfiRow]]

_END: Rule = (layout.CFA_END, 0, layout.RBP_SAME, 0)
_SIGNAL: Rule = (layout.CFA_SIGNAL, 0, layout.RBP_SAME, 0)
_BAD: Rule = (layout.CFA_BAD, 0, layout.RBP_SAME, 0)

# DW_OP_breg7 8; DW_OP_breg16 0; DW_OP_lit15; DW_OP_and; DW_OP_lit<N>; DW_OP_ge; DW_OP_lit3;
# DW_OP_shl; DW_OP_plus: CFA = rsp + 8 + ((rip & 15) >= N) << 3, what binutils emits for PLTs.
_PLT_HEAD = bytes([0x77, 0x08, 0x80, 0x00, 0x3F, 0x1A])
_PLT_TAIL = bytes([0x2A, 0x33, 0x24, 0x22])
_DW_OP_LIT0 = 0x30

_S16 = (-(1 << 15), (1 << 15) - 1)
_S32 = (-(1 << 31), (1 << 31) - 1)

# Call frame instruction opcodes (DWARF 5, section 7.24); the first three are "primary" opcodes
# whose low 6 bits pyelftools has already moved into the arguments.
_ADVANCE = {0x40, 0x02, 0x03, 0x04}  # advance_loc, advance_loc1, 2, 4
_SET_LOC = 0x01
_DEF_CFA = {0x0C}
_DEF_CFA_SF = 0x12
_DEF_CFA_REGISTER = 0x0D
_DEF_CFA_OFFSET = 0x0E
_DEF_CFA_OFFSET_SF = 0x13
_DEF_CFA_EXPRESSION = 0x0F
_OFFSET = {0x80, 0x05, 0x11}  # offset, offset_extended, offset_extended_sf
_UNDEFINED = 0x07
_SAME_VALUE = 0x08
_RESTORE = {0xC0, 0x06}  # restore, restore_extended
_REMEMBER = 0x0A
_RESTORE_STATE = 0x0B
_OTHER_REGISTER_RULES = {0x14, 0x15, 0x09, 0x10, 0x16}  # val_offset(_sf), register, (val_)expression


@dataclass
class CfiStats:
    """FDEs read, and why rows could not be expressed (each such row is stepped with the frame
    pointer)."""

    fdes: int = 0
    bad_kinds: dict[str, int] = field(default_factory=dict)

    def bad(self, why: str) -> None:
        self.bad_kinds[why] = self.bad_kinds.get(why, 0) + 1


@dataclass
class _State:
    cfa_reg: int = _RSP
    cfa_offset: int = 8
    cfa_expr: bytes | None = None
    rbp: tuple[str, int] = ("same", 0)  # ("same"|"offset"|"other", offset)
    rip_undefined: bool = False

    def copy(self) -> _State:
        return _State(self.cfa_reg, self.cfa_offset, self.cfa_expr, self.rbp, self.rip_undefined)


def fde_rows(entries: Iterable[Any], stats: CfiStats) -> list[Fde]:
    """The rows of every FDE among ``entries`` (CIEs and terminators are skipped), in object
    addresses; each FDE's rows start at its first address."""
    out: list[Fde] = []
    cie_states: dict[int, _State] = {}
    for entry in entries:
        if not isinstance(entry, FDE):
            continue
        stats.fdes += 1
        cie = entry.cie
        if cie is None:
            continue
        header = cie.header
        start = int(entry.header["initial_location"])
        end = start + int(entry.header["address_range"])
        if start >= end:
            continue
        if b"S" in bytes(header.get("augmentation", b"") or b""):
            out.append((start, end, [(start, *_SIGNAL)]))
            continue
        key = id(cie)
        initial = cie_states.get(key)
        if initial is None:
            initial = _run(cie, _State(), None, start, header, rows=None, stats=stats)
            cie_states[key] = initial
        rows: list[CfiRow] = []
        _run(entry, initial.copy(), initial, start, header, rows=rows, stats=stats)
        out.append((start, end, rows))
    return out


def _run(entry: CIE | FDE, state: _State, initial: _State | None, pc: int, header: Any,
         rows: list[CfiRow] | None, stats: CfiStats) -> _State:
    code_align = int(header["code_alignment_factor"])
    data_align = int(header["data_alignment_factor"])
    stack: list[_State] = []
    for instr in entry.instructions:
        op = int(instr.opcode)
        args = instr.args
        if op in _ADVANCE or op == _SET_LOC:
            if rows is not None:
                rows.append((pc, *_rule(state, stats)))
            pc = pc + int(args[0]) * code_align if op != _SET_LOC else int(args[0])
        elif op in _DEF_CFA:
            state.cfa_reg, state.cfa_offset, state.cfa_expr = int(args[0]), int(args[1]), None
        elif op == _DEF_CFA_SF:
            state.cfa_reg, state.cfa_offset, state.cfa_expr = int(args[0]), int(args[1]) * data_align, None
        elif op == _DEF_CFA_REGISTER:
            state.cfa_reg, state.cfa_expr = int(args[0]), None
        elif op == _DEF_CFA_OFFSET:
            state.cfa_offset = int(args[0])
        elif op == _DEF_CFA_OFFSET_SF:
            state.cfa_offset = int(args[0]) * data_align
        elif op == _DEF_CFA_EXPRESSION:
            state.cfa_expr = bytes(args[0])
        elif op in _OFFSET:
            _set_register(state, int(args[0]), ("offset", int(args[1]) * data_align))
        elif op == _UNDEFINED:
            _set_register(state, int(args[0]), ("undefined", 0))
        elif op == _SAME_VALUE:
            _set_register(state, int(args[0]), ("same", 0))
        elif op in _OTHER_REGISTER_RULES:
            _set_register(state, int(args[0]), ("other", 0))
        elif op in _RESTORE:
            reg = int(args[0])
            base = initial or _State()
            if reg == _RBP:
                state.rbp = base.rbp
            elif reg == _RIP:
                state.rip_undefined = base.rip_undefined
        elif op == _REMEMBER:
            stack.append(state.copy())
        elif op == _RESTORE_STATE and stack:
            state = stack.pop()
        # nop, GNU_args_size, GNU_window_save...: nothing this form keeps
    if rows is not None:
        rows.append((pc, *_rule(state, stats)))
    return state


def _set_register(state: _State, reg: int, rule: tuple[str, int]) -> None:
    if reg == _RBP:
        state.rbp = ("same", 0) if rule[0] in ("same", "undefined") else rule
    elif reg == _RIP:
        state.rip_undefined = rule[0] == "undefined"


def _rule(state: _State, stats: CfiStats) -> Rule:
    if state.rip_undefined:
        return _END
    if state.cfa_expr is not None:
        threshold = _plt_threshold(state.cfa_expr)
        if threshold is None:
            stats.bad("CFA expression")
            return _BAD
        return (layout.CFA_PLT, threshold, layout.RBP_SAME, 0)
    if state.cfa_reg == _RSP:
        cfa_rule = layout.CFA_RSP
    elif state.cfa_reg == _RBP:
        cfa_rule = layout.CFA_RBP
    else:
        stats.bad("CFA in another register")
        return _BAD
    if not _S32[0] <= state.cfa_offset <= _S32[1]:
        stats.bad("CFA offset out of range")
        return _BAD
    kind, offset = state.rbp
    if kind == "offset":
        if not _S16[0] <= offset <= _S16[1]:
            stats.bad("rbp offset out of range")
            return _BAD
        return (cfa_rule, state.cfa_offset, layout.RBP_OFFSET, offset)
    if kind == "other":
        stats.bad("rbp rule")
        return _BAD
    return (cfa_rule, state.cfa_offset, layout.RBP_SAME, 0)


def _plt_threshold(expr: bytes) -> int | None:
    if len(expr) == 11 and expr.startswith(_PLT_HEAD) and expr.endswith(_PLT_TAIL):
        lit = expr[6] - _DW_OP_LIT0
        if 0 <= lit < 16:
            return lit
    return None
