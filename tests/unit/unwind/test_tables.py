"""Page index, range allocation, the build-id cache and the per-process description, without the
kernel."""

from __future__ import annotations

import ctypes
import io
import logging
import os
import re
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from offcpu_exporter.doctor import describe_stacks
from offcpu_exporter.symbols.proc_maps import Mapping
from offcpu_exporter.unwind import TableCache, Unwinder, build, layout
from offcpu_exporter.unwind.allocator import RangeAllocator
from offcpu_exporter.unwind.describer import Describer
from offcpu_exporter.unwind.objects import object_info, object_table
from offcpu_exporter.unwind.table import UnwindTable, build_table
from offcpu_exporter.unwind.unwinder import CFI, FRAME_POINTER

LIBC = "/lib/x86_64-linux-gnu/libc.so.6"


def libc_table() -> UnwindTable:
    return object_table(LIBC, object_info(LIBC), LIBC, "/", [])


def test_every_page_starts_with_the_row_in_effect_there() -> None:
    table = libc_table()
    pcs = [pc for pc, *_ in struct.iter_unpack("<IihBB", table.rows)]
    assert pcs == sorted(pcs) and len(set(pcs)) == len(pcs)
    for page, (first, count) in enumerate(struct.iter_unpack("<II", table.pages)):
        start = page << layout.PAGE_SHIFT
        assert 0 < count <= 1 << layout.SEARCH_STEPS
        assert pcs[first] <= start
        assert first + count == len(pcs) or pcs[first + count] >= start + (1 << layout.PAGE_SHIFT)


def test_gaps_between_fdes_fall_back_to_the_frame_pointer() -> None:
    rsp8 = (layout.CFA_RSP, 8, layout.RBP_SAME, 0)
    table = build_table([(0x1000, 0x1010, [(0x1000, *rsp8)]), (0x1020, 0x1030, [(0x1020, *rsp8)])])
    assert table.row_at(0x1008)[1] == layout.CFA_RSP  # type: ignore[index]
    assert table.row_at(0x1018)[1] == layout.CFA_NONE  # type: ignore[index]
    assert table.row_at(0x1030)[1] == layout.CFA_NONE  # type: ignore[index]
    # .debug_frame fills what .eh_frame leaves, never what it covers.
    rbp16 = (layout.CFA_RBP, 16, layout.RBP_OFFSET, -16)
    both = build_table([(0x1000, 0x1010, [(0x1000, *rsp8)])],
                       [(0x1000, 0x1010, [(0x1000, *rbp16)]), (0x1010, 0x1020, [(0x1010, *rbp16)])])
    assert both.row_at(0x1004)[1] == layout.CFA_RSP  # type: ignore[index]
    assert both.row_at(0x1014)[1] == layout.CFA_RBP  # type: ignore[index]


def test_allocator_reuses_released_ranges() -> None:
    a = RangeAllocator(100)
    assert (a.allocate(60), a.allocate(30), a.allocate(20)) == (0, 60, None)
    a.release(0, 60)
    assert a.allocate(70) is None  # 60 free at 0, 10 at 90: not contiguous
    a.release(60, 30)
    assert a.allocate(100) == 0 and a.used == 100


def test_cache_by_build_id_on_disk_bounded(tmp_path: Path) -> None:
    table = libc_table()
    size = len(table.to_bytes())
    cache = TableCache(str(tmp_path), memory_bytes=1, disk_bytes=int(size * 2.5))
    for build_id in ("aa", "bb", "cc"):
        cache.put(build_id, table)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bb.unwind", "cc.unwind"]  # oldest removed
    fresh = TableCache(str(tmp_path))
    again = fresh.get("cc")
    assert again is not None and again.rows == table.rows
    (tmp_path / "bb.unwind").write_bytes(b"garbage")
    assert fresh.get("bb") is None and not (tmp_path / "bb.unwind").exists()


def test_describes_what_each_mapping_relies_on() -> None:
    """Without maps (doctor's use): the interpreter and libc by CFI, the vDSO by frame pointers."""
    p = subprocess.Popen([sys.executable, "-c", "import sys; print('ready', flush=True); sys.stdin.read()"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert p.stdout is not None and p.stdout.readline() == b"ready\n"
        described = Unwinder(None).update(p.pid) or []
        report = io.StringIO()
        assert describe_stacks(p.pid, report)
    finally:
        p.kill()
        p.wait()
    by_path = {d.path.rsplit("/", 1)[-1]: d for d in described}
    assert by_path["libc.so.6"].method == CFI and "eh_frame" in by_path["libc.so.6"].why
    assert any(name.startswith("python3") and d.method == CFI for name, d in by_path.items())
    assert by_path["[vdso]"].method == FRAME_POINTER
    assert re.search(r" cfi +/\S+/libc\.so\.6 +\(eh_frame, [\d,]+ rows\)", report.getvalue()), report.getvalue()


class _SmallMaps:
    """Unwind maps with room for `max_rows` rows: what a full map looks like to the Unwinder."""

    def __init__(self, max_rows: int, max_processes: int = 64, max_mappings: int = 1 << 18) -> None:
        self.max_rows, self.max_pages, self.max_processes = max_rows, 1 << 16, max_processes
        self.max_mappings = max_mappings
        self.rows: dict[int, bytes] = {}
        self.mappings: dict[int, layout.UnwindMapping] = {}
        self.processes: dict[int, tuple[int, int]] = {}

    def write_rows(self, first: int, data: bytes) -> None:
        self.rows[first] = data

    def write_pages(self, first: int, data: bytes) -> None:
        pass

    def write_mappings(self, first: int, data: bytes) -> None:
        size = ctypes.sizeof(layout.UnwindMapping)
        for i in range(len(data) // size):
            assert 0 <= first + i < self.max_mappings
            self.mappings[first + i] = layout.UnwindMapping.from_buffer_copy(data, i * size)

    def set_process(self, tgid: int, first: int, count: int) -> None:
        if tgid not in self.processes and len(self.processes) >= self.max_processes:
            raise Exception("Could not update table: [Errno 7] Argument list too long")  # as bcc's
        self.processes[tgid] = (first, count)

    def read_process(self, tgid: int) -> list[layout.UnwindMapping] | None:
        if tgid not in self.processes:
            return None
        first, count = self.processes[tgid]
        return [self.mappings[i] for i in range(first, first + count)]

    def delete_process(self, tgid: int) -> None:
        self.processes.pop(tgid, None)

    def stats(self) -> dict[str, int]:
        return {}


def test_a_table_without_room_in_the_maps_is_not_kept_in_memory(tmp_path: Path) -> None:
    """Tables in the maps and tables that did not fit are both dropped from the process: a full
    map must not turn into megabytes of rows held for nothing."""
    libc_rows = libc_table().row_count
    maps = _SmallMaps(libc_rows - 1)  # not even libc fits
    p = subprocess.Popen([sys.executable, "-c", "import sys; print('ready', flush=True); sys.stdin.read()"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert p.stdout is not None and p.stdout.readline() == b"ready\n"
        unwinder = Unwinder(maps, cache=TableCache(str(tmp_path), memory_bytes=0))  # type: ignore[arg-type]
        described = unwinder.update(p.pid) or []
    finally:
        p.kill()
        p.wait()
    by_path = {d.path.rsplit("/", 1)[-1]: d for d in described}
    assert by_path["libc.so.6"].method == FRAME_POINTER
    assert by_path["libc.so.6"].why == "no room left in the unwind maps"
    assert unwinder.no_space >= 1
    assert maps.rows, "the smaller objects' tables were placed"
    assert unwinder.table_bytes_held == 0


def test_processes_beyond_the_process_map_are_counted_and_logged_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Thousands of processes past the map's room (a node of 10,000 processes) are each counted as
    walked with frame pointers, in one log line, not one per process; the gauge counts only the
    processes whose tables the BPF walk can use."""
    maps = _SmallMaps(1 << 20, max_processes=1)
    unwinder = Unwinder(maps, cache=TableCache(str(tmp_path), memory_bytes=0))  # type: ignore[arg-type]
    sleepers = [subprocess.Popen(["sleep", "60"]) for _ in range(3)]
    try:
        with caplog.at_level(logging.WARNING, logger="offcpu_exporter.unwind.unwinder"):
            for p in sleepers:
                assert unwinder.update(p.pid) is not None
        assert unwinder.processes == 1 and list(maps.processes) == [sleepers[0].pid]
        assert unwinder.no_space == 2
        assert len([r for r in caplog.records if "not written" in r.getMessage()]) == 1
        unwinder.forget(sleepers[0].pid)
        assert unwinder.processes == 0
    finally:
        for p in sleepers:
            p.kill()
            p.wait()


def _sleep() -> subprocess.Popen[bytes]:
    """A `sleep 60` whose libraries are mapped (its dynamic loader is done)."""
    p = subprocess.Popen(["sleep", "60"])
    deadline = time.monotonic() + 10
    while "libc.so" not in Path(f"/proc/{p.pid}/maps").read_text() and time.monotonic() < deadline:
        time.sleep(0.01)
    return p


def test_mapping_slots_are_shared_by_all_processes_and_given_back(tmp_path: Path) -> None:
    """The mappings of every process share one array (two levels: a process entry says where its
    mappings are), so a process with three objects takes three slots, not room for 256. Slots of a
    process that exited go to the next one; a process that does not fit is walked with frame
    pointers, counted, and its entry is not left pointing at slots it does not hold."""
    probe = _sleep()
    try:
        sizer = Unwinder(_SmallMaps(1 << 20), cache=TableCache(str(tmp_path)))  # type: ignore[arg-type]
        per_process = sum(d.method == CFI for d in sizer.update(probe.pid) or [])
    finally:
        probe.kill()
        probe.wait()
    assert per_process >= 2  # sleep, libc, ld.so

    maps = _SmallMaps(1 << 20, max_mappings=per_process + 1)
    unwinder = Unwinder(maps, cache=TableCache(str(tmp_path)))  # type: ignore[arg-type]
    sleepers = [_sleep() for _ in range(3)]
    try:
        first, second, third = (p.pid for p in sleepers)
        unwinder.update(first)
        assert maps.processes[first] == (0, per_process)
        starts = [m.start for m in maps.read_process(first) or []]
        assert starts == sorted(starts) and len(starts) == per_process
        unwinder.update(second)  # one slot left: walked with frame pointers
        assert second not in maps.processes and unwinder.no_space == 1 and unwinder.processes == 1
        unwinder.forget(first)
        unwinder.update(third)  # takes the slots the first one gave back
        assert maps.processes[third] == (0, per_process) and unwinder.processes == 1
        assert len(maps.read_process(third) or []) == per_process
    finally:
        for p in sleepers:
            p.kill()
            p.wait()


def test_building_a_table_never_holds_up_the_flush() -> None:
    """A table missing from the cache is built for seconds (a cold cache on a new node): meanwhile the
    flush reads the unwinder's statistics and the pipeline forgets exited processes. Neither may wait
    for the build: a flush held up publishes figures older than the moment it publishes them at, and
    a window read between two such publications holds more off-CPU time than wall time."""
    building, release = threading.Event(), threading.Event()

    def slow_build(path: str, *args: object) -> UnwindTable:
        building.set()
        release.wait(30)
        return object_table(path, object_info(path), path, "/", ())

    p = subprocess.Popen([sys.executable, "-c", "import sys; print('ready', flush=True); sys.stdin.read()"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    unwinder = Unwinder(_SmallMaps(1 << 20), build_table=slow_build)  # type: ignore[arg-type]
    try:
        assert p.stdout is not None and p.stdout.readline() == b"ready\n"
        worker = threading.Thread(target=unwinder.update, args=(p.pid,))
        worker.start()
        assert building.wait(30)
        t0 = time.monotonic()
        assert unwinder.processes == 0
        unwinder.maps_stats()
        unwinder.forget(os.getpid())
        assert unwinder.describe(p.pid) == []
        waited = time.monotonic() - t0
        release.set()
        worker.join(60)
        assert unwinder.processes == 1
    finally:
        release.set()
        p.kill()
        p.wait()
    assert waited < 0.5, f"the statistics waited {waited:.2f} s for a table build"


def test_stopping_does_not_wait_for_a_table_build(tmp_path: Path) -> None:
    """A SIGTERM stops the exporter while a cold table build runs in its child: the child is ended,
    not waited for (up to tens of seconds for the largest objects)."""
    p = subprocess.Popen([sys.executable, "-c", "import sys; print('ready', flush=True); sys.stdin.read()"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    unwinder = Unwinder(_SmallMaps(1 << 22), build_table=build.build_in_child,  # type: ignore[arg-type]
                        cache=TableCache(str(tmp_path), memory_bytes=0))
    describer = Describer(unwinder)
    try:
        assert p.stdout is not None and p.stdout.readline() == b"ready\n"
        describer.start()
        describer.want(p.pid)
        deadline = time.monotonic() + 30
        while not build._running and time.monotonic() < deadline:
            time.sleep(0.005)
        children = list(build._running)
        assert children, "no table builder started"
        t0 = time.monotonic()
        describer.stop()
        stopped = time.monotonic() - t0
    finally:
        p.kill()
        p.wait()
    assert stopped < 2.0, f"stopping waited {stopped:.1f} s for a table build"
    assert all(child.poll() is not None for child in children)


def test_looking_again_at_an_unchanged_process_parses_nothing(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The describer looks again at every process every few seconds (issue 27): unchanged maps
    cost one read and no parse; maps that changed are read as new, and the same executable
    mappings told another way (a grown heap) neither write nor parse again after once."""
    from offcpu_exporter.unwind import unwinder as unwinder_module

    proc = tmp_path / "proc"
    (proc / "42").mkdir(parents=True)
    maps_file = proc / "42" / "maps"
    libc_line = f"7f0000000000-7f0000100000 r-xp 00028000 08:01 {os.stat(LIBC).st_ino} {LIBC}\n"
    maps_file.write_text("00400000-00401000 rw-p 00000000 00:00 0 [heap]\n" + libc_line)
    os.symlink("/", proc / "42" / "root")
    parsed: list[int] = []
    real_parse = unwinder_module.parse_maps

    def counting_parse(text: str) -> list[Mapping]:
        parsed.append(1)
        return real_parse(text)

    monkeypatch.setattr(unwinder_module, "parse_maps", counting_parse)
    maps = _SmallMaps(1 << 20)
    unwinder = Unwinder(maps, proc_root=str(proc))  # type: ignore[arg-type]
    first = unwinder.update(42)
    assert first is not None and len(parsed) == 1
    written = dict(maps.processes)
    assert unwinder.update(42) == first and len(parsed) == 1  # the same text: not parsed again
    maps_file.write_text("00400000-00402000 rw-p 00000000 00:00 0 [heap]\n" + libc_line)
    assert unwinder.update(42) == first and len(parsed) == 2  # another text, the same mappings
    assert unwinder.update(42) == first and len(parsed) == 2
    assert maps.processes.keys() == written.keys()
    maps_file.write_text(libc_line.replace("7f0000100000", "7f0000200000"))
    changed = unwinder.update(42)
    assert changed is not None and changed[0].end == 0x7F0000200000 and len(parsed) == 3
