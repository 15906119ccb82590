"""Corrupt and truncated ELF files, garbage maps lines and perf maps: nothing escapes, frames
become placeholders (or still-correct names), failures are counted."""

from __future__ import annotations

import itertools
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from offcpu_exporter.snapshot import Frame, FrameKind
from offcpu_exporter.symbols import Symbolizer
from offcpu_exporter.symbols.elf import SymbolTable, read_elf
from offcpu_exporter.symbols.perfmap import PerfMap
from testkit.fake_proc import FakeProc

SOURCE = r"""
int fuzz_one(int x) { return x + 1; }
int fuzz_two(int x) { return x * 2; }
static int fuzz_three(int x) { return x - 3; }
int fuzz_entry(int x) { return fuzz_three(fuzz_one(x)) + fuzz_two(x); }
"""
FUZZ_SETTINGS = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)
_counter = itertools.count(1000)


@pytest.fixture(scope="module")
def sample_elf(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    d = tmp_path_factory.mktemp("fuzz")
    (d / "f.c").write_text(SOURCE)
    out = d / "libfuzz.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O0", "-o", str(out), str(d / "f.c")], check=True, timeout=60)
    return out.read_bytes()


def _text_window(data: bytes) -> tuple[int, int]:
    import io

    info = read_elf(io.BytesIO(data), len(data))
    offset, size, _vaddr = next(seg for seg in info.loads if seg[0] > 0)  # the text segment
    return offset, size


def _symbolize(tmp_path: Path, data: bytes, window: tuple[int, int], probes: list[int]) -> tuple[Frame, ...]:
    pid = next(_counter)
    proc = FakeProc(tmp_path / f"proc{pid}")
    inode = proc.install(pid, data, "/usr/lib/libfuzz.so")
    start = 0x7F0000000000
    offset, size = window
    page = offset & ~0xFFF
    end = start + max(0x1000, (offset + size - page + 0xFFF) & ~0xFFF)
    proc.maps(pid, f"{start:x}-{end:x} r-xp {page:08x} fd:01 {inode} /usr/lib/libfuzz.so\n")
    sym = Symbolizer(str(proc.base), kallsyms_path=str(tmp_path / "no-kallsyms"))
    frames = sym.user(pid, [start + p % (end - start) for p in probes])
    assert len(frames) == len(probes)
    placeholders = sum(f.kind is FrameKind.PLACEHOLDER for f in frames)
    assert sym.failures == placeholders
    assert sym.unexpected_errors == 0  # handled as bad input, not by the last-resort guard
    return frames


def test_intact_file_resolves(tmp_path: Path, sample_elf: bytes) -> None:
    window = _text_window(sample_elf)
    import io

    info = read_elf(io.BytesIO(sample_elf), len(sample_elf))
    table = SymbolTable.build([info.symtab, info.dynsym])
    names = {table.name_at(i) for i in range(len(table))}
    assert {"fuzz_one", "fuzz_two", "fuzz_three", "fuzz_entry"} <= names
    offset = window[0]
    vaddr = next(i for i in range(len(table)) if table.name_at(i) == "fuzz_two")
    fuzz_two = table.starts[vaddr]
    text_offset, _size, text_vaddr = next(seg for seg in info.loads if seg[0] > 0)
    probe = fuzz_two - text_vaddr + text_offset - (offset & ~0xFFF)
    frames = _symbolize(tmp_path, sample_elf, window, [probe])
    assert frames[0].name == "fuzz_two"


@FUZZ_SETTINGS
@given(
    cut=st.integers(min_value=0, max_value=1 << 16),
    probes=st.lists(st.integers(0, 1 << 16), min_size=1, max_size=4),
)
def test_truncated_elf(tmp_path: Path, sample_elf: bytes, cut: int, probes: list[int]) -> None:
    window = _text_window(sample_elf)
    frames = _symbolize(tmp_path, sample_elf[: cut % len(sample_elf)], window, probes)
    for frame in frames:
        assert frame.kind is FrameKind.PLACEHOLDER or frame.name.startswith("fuzz_") or frame.name


@FUZZ_SETTINGS
@given(
    flips=st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), min_size=1, max_size=24),
    header_bias=st.booleans(),
    probes=st.lists(st.integers(0, 1 << 16), min_size=1, max_size=4),
)
def test_corrupt_elf(
    tmp_path: Path, sample_elf: bytes, flips: list[tuple[int, int]], header_bias: bool, probes: list[int]
) -> None:
    window = _text_window(sample_elf)
    data = bytearray(sample_elf)
    for pos, value in flips:
        # Headers (ELF, program, section tables) are where corruption hurts parsers most.
        where = pos % 64 if header_bias and pos % 2 else pos % len(data)
        data[where] = value
    if header_bias:
        shoff = int.from_bytes(sample_elf[0x28:0x30], "little")
        for pos, value in flips:
            data[(shoff + pos % 512) % len(data)] = value
    frames = _symbolize(tmp_path, bytes(data), window, probes)
    for frame in frames:
        if frame.kind is FrameKind.PLACEHOLDER:
            assert frame.name.startswith("[unknown]")


@FUZZ_SETTINGS
@given(data=st.binary(max_size=4096), probes=st.lists(st.integers(0, 1 << 16), min_size=1, max_size=4))
def test_random_bytes_as_elf(tmp_path: Path, data: bytes, probes: list[int]) -> None:
    frames = _symbolize(tmp_path, b"\x7fELF" + data, (0, 0x1000), probes)
    assert all(f.kind is FrameKind.PLACEHOLDER for f in frames)
    assert all(f.name == f"[unknown] libfuzz.so+0x{f.offset:x}" for f in frames)


_MAPS_LINE = st.one_of(
    st.text(max_size=120),
    st.builds(
        lambda a, b, perms, off, inode, path: f"{a:x}-{b:x} {perms} {off:x} fd:01 {inode} {path}",
        st.integers(0, 1 << 64),
        st.integers(0, 1 << 64),
        st.sampled_from(["r-xp", "rwxp", "r--p", "x", "", "r-x"]),
        st.integers(-5, 1 << 40),
        st.integers(-5, 1 << 40),
        st.sampled_from(["", "[vdso]", "/usr/lib/libfuzz.so", "/missing (deleted)", "[heap]", "/../../etc/x"]),
    ),
)


@FUZZ_SETTINGS
@given(lines=st.lists(_MAPS_LINE, max_size=12), probes=st.lists(st.integers(0, 1 << 64), min_size=1, max_size=6))
def test_garbage_maps(tmp_path: Path, sample_elf: bytes, lines: list[str], probes: list[int]) -> None:
    pid = next(_counter)
    proc = FakeProc(tmp_path / f"proc{pid}")
    proc.install(pid, sample_elf, "/usr/lib/libfuzz.so")
    proc.maps(pid, "\n".join(lines))
    (proc.process(pid) / "mem").write_bytes(b"\x7fELF garbage vdso")
    sym = Symbolizer(str(proc.base), kallsyms_path=str(tmp_path / "no-kallsyms"))
    frames = sym.user(pid, probes)
    assert len(frames) == len(probes)
    assert sym.unexpected_errors == 0
    sym.forget(pid)
    assert sym.cached_files == 0


@FUZZ_SETTINGS
@given(text=st.binary(max_size=2048), probes=st.lists(st.integers(0, 1 << 20), max_size=6))
def test_garbage_perf_map(tmp_path: Path, text: bytes, probes: list[int]) -> None:
    path = tmp_path / f"perf-{next(_counter)}.map"
    path.write_bytes(text)
    pm = PerfMap(str(path))
    pm.refresh()
    for p in probes:
        name = pm.lookup(p)
        assert name is None or isinstance(name, str)


@FUZZ_SETTINGS
@given(addresses=st.lists(st.integers(-(1 << 70), 1 << 70), max_size=8))
def test_out_of_range_addresses(addresses: list[int]) -> None:
    sym = Symbolizer(kallsyms_path="/nonexistent")
    assert len(sym.kernel(addresses)) == len(addresses)
    assert len(sym.user(1, addresses)) == len(addresses)
    assert sym.unexpected_errors == 0
