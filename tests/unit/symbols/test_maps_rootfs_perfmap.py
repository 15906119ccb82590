"""maps parsing, path resolution inside a process's root, perf map reading."""

from __future__ import annotations

import os
from pathlib import Path

from offcpu_exporter.symbols.perfmap import PerfMap
from offcpu_exporter.symbols.proc_maps import ProcessMaps, parse_maps
from offcpu_exporter.symbols.rootfs import resolve_in_root

MAPS = """\
55d0c0a00000-55d0c0a01000 r--p 00000000 fd:01 1234  /usr/bin/prog
55d0c0a01000-55d0c0a05000 r-xp 00001000 fd:01 1234  /usr/bin/prog
7f0000000000-7f0000001000 rwxp 00000000 00:00 0
7f0000100000-7f0000200000 r-xp 00010000 fd:01 99 /opt/my app/lib x.so (deleted)
7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0                          [vdso]
garbage line
zz-yy r-xp 0 0 0 /x
"""


def test_parse_maps_keeps_executable_mappings() -> None:
    maps = parse_maps(MAPS)
    assert [m.path for m in maps] == ["/usr/bin/prog", "", "/opt/my app/lib x.so", "[vdso]"]
    prog, anon, deleted, vdso = maps
    assert (prog.start, prog.end, prog.offset, prog.inode) == (0x55D0C0A01000, 0x55D0C0A05000, 0x1000, 1234)
    assert prog.is_file and not anon.is_file and not vdso.is_file
    assert deleted.deleted and deleted.is_file
    lookup = ProcessMaps(maps)
    assert lookup.find(0x55D0C0A01000) is prog
    assert lookup.find(0x55D0C0A05000) is None
    assert lookup.find(0x7F0000100FFF) is deleted
    assert lookup.find(0) is None


def test_resolve_in_root_does_not_escape(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "usr/lib").mkdir(parents=True)
    (root / "usr/lib/libreal.so").write_bytes(b"x")
    (root / "lib").symlink_to("/etc")  # absolute: means <root>/etc inside the container
    (root / "usr/lib/rel.so").symlink_to("../lib/libreal.so")  # ../lib -> usr/lib? no: usr/lib/../lib
    (root / "up.so").symlink_to("../../../../../../etc/passwd")
    (root / "etc").mkdir()
    assert resolve_in_root(str(root), "/lib/passwd") is None  # host /etc/passwd is not reachable
    (root / "etc/passwd").write_text("container")
    assert resolve_in_root(str(root), "/lib/passwd") == f"{root}/etc/passwd"
    assert resolve_in_root(str(root), "/up.so") == f"{root}/etc/passwd"  # .. clamped at the root
    assert resolve_in_root(str(root), "/usr/lib/rel.so") == f"{root}/usr/lib/libreal.so"
    (root / "loop").symlink_to("/loop")
    assert resolve_in_root(str(root), "/loop") is None
    assert resolve_in_root(str(root), "/usr/lib") is None  # a directory is not a mappable file


def test_perf_map_incremental_and_replaced(tmp_path: Path) -> None:
    path = tmp_path / "perf-1.map"
    path.write_text("1000 10 first\n2000 20 LazyCompile:*hot /app/x.js:1:1\nbad line\n3000 zz bad\n30")
    pm = PerfMap(str(path))
    assert pm.refresh()
    assert pm.lookup(0x1005) == "first"
    assert pm.lookup(0x2010) == "LazyCompile:*hot /app/x.js:1:1"
    assert pm.lookup(0x1010) is None
    assert not pm.refresh()  # unchanged
    with open(path, "a") as f:
        f.write("00 8 completed_later\n1000 4 first_recompiled\n")
    assert pm.refresh()
    assert pm.lookup(0x3004) == "completed_later"
    assert pm.lookup(0x1002) == "first_recompiled"  # later lines win
    os.unlink(path)
    path.write_text("5000 10 new_process\n")  # new inode: start over
    assert pm.refresh()
    assert pm.lookup(0x1002) is None
    assert pm.lookup(0x5001) == "new_process"
