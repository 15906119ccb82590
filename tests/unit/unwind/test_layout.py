"""bpf/unwind_table.h and unwind/layout.py (in offcpu_exporter/) describe the same structs and
constants: checked with the C compiler, as tests/unit/probe/test_layout.py does for offcpu.h."""

from __future__ import annotations

import ctypes
import re
import subprocess
from pathlib import Path

from offcpu_exporter.unwind import layout
from offcpu_exporter.unwind.source import BPF_DIR


def _c_layout(tmp_path: Path) -> list[list[str]]:
    header = (BPF_DIR / layout.HEADER).read_text()
    lines = ["#include <stdio.h>", "#include <stddef.h>", "#include <linux/types.h>", f'#include "{layout.HEADER}"',
             "int main(void) {"]
    for name, struct in layout.STRUCTS.items():
        lines.append(f'printf("{name} size %zu\\n", sizeof(struct {name}));')
        for field, *_ in struct._fields_:
            lines.append(f'printf("{name}.{field} %zu\\n", offsetof(struct {name}, {field}));')
    # Every constant the header defines: UNWIND_FOO -> layout.FOO.
    for macro in re.findall(r"^#define (UNWIND_[A-Z0-9_]+)[ \t]+\S", header, re.MULTILINE):
        lines.append(f'printf("const {macro.removeprefix("UNWIND_")} %d\\n", (int)({macro}));')
    lines += ["return 0;", "}"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines))
    exe = tmp_path / "layout"
    subprocess.run(["gcc", f"-I{BPF_DIR}", "-o", str(exe), str(src)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return [line.split() for line in out.splitlines()]


def test_header_and_python_layouts_agree(tmp_path: Path) -> None:
    checked = 0
    for words in _c_layout(tmp_path):
        if words[0] == "const":
            assert getattr(layout, words[1]) == int(words[2]), words
        elif words[1] == "size":
            assert ctypes.sizeof(layout.STRUCTS[words[0]]) == int(words[2]), words
        else:
            struct, field = words[0].split(".")
            assert getattr(layout.STRUCTS[struct], field).offset == int(words[1]), words
        checked += 1
    assert checked >= 40


def test_walk_declares_the_maps_python_writes() -> None:
    source = (BPF_DIR / layout.WALK_HEADER).read_text()
    for name in (layout.MAP_ROWS, layout.MAP_PAGES, layout.MAP_PROCESSES, layout.MAP_STATS):
        assert re.search(rf"\b{name}\b", source), name
