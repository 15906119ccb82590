"""task_struct's layout from BTF: against a hand-built blob (sizes through typedefs and
qualifiers, the pre-5.14 `state`) and against bpftool on the running kernel."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from offcpu_exporter.probe.btf import BtfError
from offcpu_exporter.probe.task_layout import TaskLayout, read_task_layout

VMLINUX = Path("/sys/kernel/btf/vmlinux")
_INT, _PTR, _STRUCT, _TYPEDEF, _VOLATILE = 1, 2, 4, 8, 9


def _blob(task_members: list[tuple[str, int, int]], extra_names: tuple[str, ...] = ()) -> bytes:
    """BTF with: [1] int (4 bytes), [2] long (8), [3] volatile long, [4] typedef pid_t = int,
    [5] u64, [6] struct sched_entity, [7] struct task_struct with `task_members` (name, type, bit offset)."""
    names = ["int", "long", "pid_t", "u64", "sched_entity", "task_struct", "sum_exec_runtime",
             "prev_sum_exec_runtime", *extra_names, *(m[0] for m in task_members)]
    strings = b"\0" + b"".join(n.encode() + b"\0" for n in dict.fromkeys(names))

    def at(name: str) -> int:
        return strings.index(b"\0" + name.encode() + b"\0") + 1

    def header(name_off: int, kind: int, vlen: int, size: int) -> bytes:
        return struct.pack("<III", name_off, (kind << 24) | vlen, size)

    types = [
        header(at("int"), _INT, 0, 4) + struct.pack("<I", 32),
        header(at("long"), _INT, 0, 8) + struct.pack("<I", 64),
        header(0, _VOLATILE, 0, 2),
        header(at("pid_t"), _TYPEDEF, 0, 1),
        header(at("u64"), _INT, 0, 8) + struct.pack("<I", 64),
        header(at("sched_entity"), _STRUCT, 2, 32)
        + struct.pack("<III", at("sum_exec_runtime"), 5, 64)
        + struct.pack("<III", at("prev_sum_exec_runtime"), 5, 128),
        header(at("task_struct"), _STRUCT, len(task_members), 4096)
        + b"".join(struct.pack("<III", at(name), type_id, bits) for name, type_id, bits in task_members),
    ]
    body = b"".join(types)
    return struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(body), len(body), len(strings)) + body + strings


def test_a_5_14_and_later_layout(tmp_path: Path) -> None:
    path = tmp_path / "btf"
    path.write_bytes(_blob([("__state", 1, 192), ("sched_contributes_to_load", 1, 1000), ("se", 6, 1024),
                            ("pid", 4, 8000), ("tgid", 4, 8032), ("nvcsw", 5, 9024), ("nivcsw", 5, 9088)]))
    assert read_task_layout(str(path)) == TaskLayout(
        pid=1000, tgid=1004, state=24, state_size=4, load_bit=1000, se_runtime=136, se_prev_runtime=144,
        switches=1128)


def test_the_pre_5_14_state_is_a_volatile_long_and_missing_optional_fields_stay_out(tmp_path: Path) -> None:
    path = tmp_path / "btf"
    # nvcsw and nivcsw not adjacent: the pair is not read as one.
    path.write_bytes(_blob([("state", 3, 128), ("pid", 4, 8000), ("tgid", 4, 8032), ("nvcsw", 5, 9024),
                            ("nivcsw", 5, 9600)]))
    layout = read_task_layout(str(path))
    assert (layout.state, layout.state_size) == (16, 8)
    assert (layout.load_bit, layout.se_runtime, layout.switches) == (None, None, None)
    assert "-DTASK_STATE_SIZE=8" in layout.cflags()
    assert not any(flag.startswith(("-DTASK_SE_", "-DTASK_SWITCHES", "-DTASK_LOAD")) for flag in layout.cflags())


def test_a_task_struct_without_its_essentials_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "btf"
    path.write_bytes(_blob([("__state", 1, 192), ("pid", 4, 8000)]))
    with pytest.raises(BtfError, match="lacks tgid"):
        read_task_layout(str(path))


def test_the_running_kernels_layout_agrees_with_bpftool() -> None:
    if not VMLINUX.exists() or shutil.which("bpftool") is None:
        # In CI a missing peer is a broken setup (scripts/setup --test installs bpftool), not a skip.
        missing = pytest.fail if os.environ.get("CI") else pytest.skip
        missing("needs kernel BTF (/sys/kernel/btf/vmlinux) and bpftool (Debian bpftool)")
    raw = subprocess.run(
        ["bpftool", "btf", "dump", "file", str(VMLINUX), "format", "raw"], capture_output=True, text=True, check=True
    ).stdout
    task = raw.split("STRUCT 'task_struct' ", 1)[1].split("\n[", 1)[0]
    fields = {m[0]: (int(m[1]), int(m[2])) for m in
              re.findall(r"'(pid|tgid|__state|nvcsw)' type_id=(\d+) bits_offset=(\d+)", task)}
    layout = read_task_layout()
    assert (layout.pid, layout.tgid, layout.state, layout.switches) == (
        fields["pid"][1] // 8, fields["tgid"][1] // 8, fields["__state"][1] // 8, fields["nvcsw"][1] // 8)
    # __state is an unsigned int: bpftool names its type.
    state_type = re.search(rf"^\[{fields['__state'][0]}\] (\w+) '([^']*)'(?: size=(\d+))?", raw, re.M)
    assert state_type is not None and state_type.group(1) == "INT" and state_type.group(3) == "4"
    assert layout.state_size == 4
    assert layout.load_bit is not None and layout.se_runtime is not None
