"""Field offsets of kernel structs, read from the kernel's own BTF (/sys/kernel/btf/vmlinux).

The raw sched_switch tracepoint hands the BPF program `struct task_struct *next`; its pid must be
read at the offset of *this* kernel, not that of whatever headers are installed (Debian's generic
6.1 headers on a 6.18 kernel give wrong offsets). BTF describes the running kernel exactly.
Format: https://docs.kernel.org/bpf/btf.html
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

__all__ = ["BtfError", "struct_member_offsets"]

_MAGIC = 0xEB9F
_KIND_STRUCT, _KIND_UNION = 4, 5
# Bytes that follow the 12-byte common header, per kind: fixed part and per-vlen entry.
_EXTRA = {1: (4, 0), 3: (12, 0), 4: (0, 12), 5: (0, 12), 6: (0, 8), 13: (0, 8), 14: (4, 0), 15: (0, 12),
          17: (4, 0), 19: (0, 12)}


class BtfError(Exception):
    pass


def _types(data: bytes) -> tuple[list[tuple[int, int, int, int, list[tuple[int, int, int]]]], bytes]:
    magic, _version, _flags, hdr_len = struct.unpack_from("<HBBI", data, 0)
    if magic != _MAGIC:
        raise BtfError("not BTF (bad magic)")
    type_off, type_len, str_off, str_len = struct.unpack_from("<IIII", data, 8)
    types_start = hdr_len + type_off
    strings = data[hdr_len + str_off: hdr_len + str_off + str_len]
    out: list[tuple[int, int, int, int, list[tuple[int, int, int]]]] = [(0, 0, 0, 0, [])]  # type id 0: void
    pos, end = types_start, types_start + type_len
    while pos < end:
        name_off, info, size_or_type = struct.unpack_from("<III", data, pos)
        pos += 12
        kind, vlen, kind_flag = (info >> 24) & 0x1F, info & 0xFFFF, info >> 31
        fixed, per = _EXTRA.get(kind, (0, 0))
        members: list[tuple[int, int, int]] = []
        if kind in (_KIND_STRUCT, _KIND_UNION):
            for i in range(vlen):
                m_name, m_type, m_off = struct.unpack_from("<III", data, pos + i * 12)
                bit_offset = m_off & 0xFFFFFF if kind_flag else m_off
                members.append((m_name, m_type, bit_offset))
        pos += fixed + per * vlen
        out.append((name_off, kind, size_or_type, kind_flag, members))
    return out, strings


def _name(strings: bytes, off: int) -> str:
    end = strings.index(b"\0", off)
    return strings[off:end].decode()


def struct_member_offsets(struct_name: str, members: Iterable[str],
                          path: str = "/sys/kernel/btf/vmlinux") -> dict[str, int]:
    """Byte offsets of `members` of `struct struct_name`, looking through anonymous structs and
    unions (task_struct keeps its randomizable fields in one). Missing members are left out."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise BtfError(f"cannot read {path}: {e.strerror}") from None
    types, strings = _types(data)
    wanted = set(members)
    target = next((t for t in types if t[1] == _KIND_STRUCT and t[0] and _name(strings, t[0]) == struct_name), None)
    if target is None:
        raise BtfError(f"struct {struct_name} not in {path}")
    found: dict[str, int] = {}

    def walk(entry: tuple[int, int, int, int, list[tuple[int, int, int]]], base_bits: int) -> None:
        for m_name, m_type, bit_offset in entry[4]:
            if m_name:
                name = _name(strings, m_name)
                if name in wanted and name not in found:
                    found[name] = (base_bits + bit_offset) // 8
            else:
                inner = types[m_type]
                if inner[1] in (_KIND_STRUCT, _KIND_UNION):
                    walk(inner, base_bits + bit_offset)

    walk(target, 0)
    return found
