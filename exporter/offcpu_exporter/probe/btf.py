"""Field offsets of kernel structs, read from the kernel's own BTF (/sys/kernel/btf/vmlinux).

The raw sched_switch tracepoint hands the BPF program `struct task_struct *next`; its pid must be
read at the offset of *this* kernel, not that of whatever headers are installed (Debian's generic
6.1 headers on a 6.18 kernel give wrong offsets). BTF describes the running kernel exactly.
Format: https://docs.kernel.org/bpf/btf.html
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

__all__ = ["VMLINUX", "Btf", "BtfError", "Member", "read_btf"]

VMLINUX = "/sys/kernel/btf/vmlinux"
_MAGIC = 0xEB9F
_KIND_INT, _KIND_PTR, _KIND_STRUCT, _KIND_UNION, _KIND_ENUM = 1, 2, 4, 5, 6
# Kinds that only qualify or rename another type: typedef, volatile, const, restrict, type_tag.
_KINDS_QUALIFYING = {8, 9, 10, 11, 18}
_KIND_ENUM64 = 19
# Bytes that follow the 12-byte common header, per kind: fixed part and per-vlen entry.
_EXTRA = {1: (4, 0), 3: (12, 0), 4: (0, 12), 5: (0, 12), 6: (0, 8), 13: (0, 8), 14: (4, 0), 15: (0, 12),
          17: (4, 0), 19: (0, 12)}


class BtfError(Exception):
    pass


@dataclass(frozen=True)
class Member:
    bit_offset: int
    size: int | None  # bytes of its type; None when BTF gives it none (a bitfield's is its storage unit's)


class Btf:
    """Type headers located once (one array slot per type), decoded only when asked: vmlinux
    has ~150,000 types, and decoding them all into tuples costs ~30 MB."""

    def __init__(self, data: bytes, source: str = VMLINUX) -> None:
        self.source = source
        magic, _version, _flags, hdr_len = struct.unpack_from("<HBBI", data, 0)
        if magic != _MAGIC:
            raise BtfError("not BTF (bad magic)")
        type_off, type_len, str_off, str_len = struct.unpack_from("<IIII", data, 8)
        self.data = data
        self.strings = data[hdr_len + str_off : hdr_len + str_off + str_len]
        self.positions = array("I", [0])  # type id 0: void
        pos = hdr_len + type_off
        end = pos + type_len
        while pos < end:
            self.positions.append(pos)
            (info,) = struct.unpack_from("<I", data, pos + 4)
            fixed, per = _EXTRA.get((info >> 24) & 0x1F, (0, 0))
            pos += 12 + fixed + per * (info & 0xFFFF)

    def kind(self, type_id: int) -> int:
        if type_id == 0:
            return 0
        (info,) = struct.unpack_from("<I", self.data, self.positions[type_id] + 4)
        return (info >> 24) & 0x1F

    def name(self, off: int) -> str:
        end = self.strings.index(b"\0", off)
        return self.strings[off:end].decode()

    def find_struct(self, name: str) -> int | None:
        wanted = name.encode()
        for type_id in range(1, len(self.positions)):
            name_off, info = struct.unpack_from("<II", self.data, self.positions[type_id])
            if (info >> 24) & 0x1F == _KIND_STRUCT and name_off and self.strings.startswith(wanted + b"\0", name_off):
                return type_id
        return None

    def size(self, type_id: int) -> int | None:
        """Bytes of a type, through typedefs and qualifiers (`volatile long state` is 8)."""
        for _ in range(32):  # qualifier chains are short; a loop in corrupt BTF must not hang
            if type_id == 0:
                return None
            _name_off, info, size_or_type = struct.unpack_from("<III", self.data, self.positions[type_id])
            kind = (info >> 24) & 0x1F
            if kind in _KINDS_QUALIFYING:
                type_id = size_or_type
            elif kind in (_KIND_INT, _KIND_STRUCT, _KIND_UNION, _KIND_ENUM, _KIND_ENUM64):
                return int(size_or_type)
            elif kind == _KIND_PTR:
                return 8
            else:
                return None
        return None

    def struct_members(self, struct_name: str, members: Iterable[str]) -> dict[str, Member]:
        """`members` of `struct struct_name`, looking through anonymous structs and unions
        (task_struct keeps its randomizable fields in one). Missing members are left out."""
        wanted = set(members)
        target = self.find_struct(struct_name)
        if target is None:
            raise BtfError(f"struct {struct_name} not in {self.source}")
        found: dict[str, Member] = {}
        pending = [(target, 0)]  # (struct or union type id, bit offset of its start)
        while pending:
            type_id, base_bits = pending.pop(0)
            for m_name, m_type, bit_offset in self.members(type_id):
                if m_name:
                    name = self.name(m_name)
                    if name in wanted and name not in found:
                        found[name] = Member(base_bits + bit_offset, self.size(m_type))
                elif self.kind(m_type) in (_KIND_STRUCT, _KIND_UNION):
                    pending.append((m_type, base_bits + bit_offset))
        return found

    def members(self, type_id: int) -> Iterator[tuple[int, int, int]]:
        """(name offset, type id, bit offset) of a struct's or union's members."""
        pos = self.positions[type_id]
        _name_off, info, _size = struct.unpack_from("<III", self.data, pos)
        kind_flag = info >> 31
        for m_name, m_type, m_off in struct.iter_unpack("<III", self.data[pos + 12 : pos + 12 + 12 * (info & 0xFFFF)]):
            yield m_name, m_type, (m_off & 0xFFFFFF if kind_flag else m_off)


def read_btf(path: str = VMLINUX) -> Btf:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise BtfError(f"cannot read {path}: {e.strerror}") from None
    return Btf(data, path)
