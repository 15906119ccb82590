"""The BTF reader against a hand-built blob (the running kernel's task_struct against bpftool:
test_task_layout.py)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from offcpu_exporter.probe.btf import BtfError, read_btf


def _btf(types: list[bytes], strings: bytes) -> bytes:
    body = b"".join(types)
    header = struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(body), len(body), len(strings))
    return header + body + strings


def _type(name_off: int, kind: int, vlen: int, size: int, kind_flag: int = 0) -> bytes:
    return struct.pack("<III", name_off, (kind_flag << 31) | (kind << 24) | vlen, size)


def test_members_through_anonymous_unions_and_bitfield_offsets(tmp_path: Path) -> None:
    strings = b"\0int\0task\0pid\0state\0flags\0other\0"
    off = {name: strings.index(b"\0" + name.encode() + b"\0") + 1 for name in ("int", "task", "pid", "state", "flags")}
    types = [
        _type(off["int"], 1, 0, 4) + struct.pack("<I", 32),  # [1] INT
        # [2] anonymous union { int state; }, with kind_flag: bit offsets in the low 24 bits
        _type(0, 5, 1, 4, kind_flag=1) + struct.pack("<III", off["state"], 1, (3 << 24) | 0),
        # [3] anonymous struct { union [2] at bit 32; }
        _type(0, 4, 1, 8) + struct.pack("<III", 0, 2, 32),
        # [4] struct task { int flags; struct [3] at bit 64; int pid at bit 192; }
        _type(off["task"], 4, 3, 32)
        + struct.pack("<III", off["flags"], 1, 0)
        + struct.pack("<III", 0, 3, 64)
        + struct.pack("<III", off["pid"], 1, 192),
    ]
    path = tmp_path / "btf"
    path.write_bytes(_btf(types, strings))
    found = read_btf(str(path)).struct_members("task", ["pid", "state", "flags", "missing"])
    assert {name: member.bit_offset // 8 for name, member in found.items()} == {
        "pid": 24,
        "state": 12,
        "flags": 0,
    }
    with pytest.raises(BtfError, match="struct other not in"):
        read_btf(str(path)).struct_members("other", ["pid"])
    path.write_bytes(b"\0" * 32)
    with pytest.raises(BtfError, match="bad magic"):
        read_btf(str(path))
