"""kallsyms parsing from fixture files: text symbols only, modules, kptr_restrict, refresh."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from offcpu_exporter.snapshot import FrameKind
from offcpu_exporter.symbols import Symbolizer
from offcpu_exporter.symbols import kernel as kernel_module

KALLSYMS = """\
ffffffff81000000 T _text
ffffffff81000000 T _stext
ffffffff81001000 T do_nanosleep
ffffffff81001400 t hrtimer_nanosleep_restart
ffffffff81002000 D some_data
ffffffff81003000 T _etext
ffffffffc0000000 t helper_func\t[mymod]
ffffffffc0000100 T mymod_wait\t[mymod]
ffffffffc0010000 t bpf_prog_6deef7357e7b4530_x\t[bpf]
"""
MODULES = "mymod 4096 0 - Live 0xffffffffc0000000\n"


@pytest.fixture
def fixture_dir(tmp_path: Path) -> Path:
    (tmp_path / "kallsyms").write_text(KALLSYMS)
    (tmp_path / "modules").write_text(MODULES)
    return tmp_path


def test_core_and_module_symbols(fixture_dir: Path) -> None:
    sym = Symbolizer(kallsyms_path=str(fixture_dir / "kallsyms"))
    frames = sym.kernel([0xFFFFFFFF81001010, 0xFFFFFFFF81001400, 0xFFFFFFFFC0000104, 0xFFFFFFFFC0000010])
    assert [f.name for f in frames] == [
        "do_nanosleep",
        "hrtimer_nanosleep_restart",
        "mymod_wait [mymod]",
        "helper_func [mymod]",
    ]
    assert [f.module for f in frames] == ["[kernel]", "[kernel]", "mymod", "mymod"]
    assert frames[0].kind is FrameKind.KERNEL
    assert frames[0].offset == 0x1010
    assert sym.failures == 0


def test_data_symbols_are_not_functions(fixture_dir: Path) -> None:
    sym = Symbolizer(kallsyms_path=str(fixture_dir / "kallsyms"))
    # 0x...2010 is after the D symbol: it still belongs to the preceding text symbol's range,
    # because data symbols are not loaded at all.
    assert sym.kernel([0xFFFFFFFF81002010])[0].name == "hrtimer_nanosleep_restart"


def test_outside_module_and_below_text_is_unknown(fixture_dir: Path) -> None:
    sym = Symbolizer(kallsyms_path=str(fixture_dir / "kallsyms"))
    frames = sym.kernel([0xFFFFFFFFC0002000, 0x1000, 0])
    assert [f.name for f in frames] == ["[unknown]"] * 3
    assert all(f.kind is FrameKind.PLACEHOLDER for f in frames)
    assert sym.failures == 3


def test_bpf_symbols_without_module_entry(fixture_dir: Path) -> None:
    sym = Symbolizer(kallsyms_path=str(fixture_dir / "kallsyms"))
    assert sym.kernel([0xFFFFFFFFC0010008])[0].name == "bpf_prog_6deef7357e7b4530_x [bpf]"


def test_kptr_restrict_zero_addresses(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    zeroed = "".join("0000000000000000 " + line.split(" ", 1)[1] for line in KALLSYMS.splitlines(True))
    (tmp_path / "kallsyms").write_text(zeroed)
    (tmp_path / "modules").write_text(MODULES.replace("0xffffffffc0000000", "0x0000000000000000"))
    sym = Symbolizer(kallsyms_path=str(tmp_path / "kallsyms"))
    with caplog.at_level(logging.WARNING, logger="offcpu_exporter.symbols.kernel"):
        for _ in range(3):
            frames = sym.kernel([0xFFFFFFFF81001010])
            assert frames[0].name == "[unknown]"
    messages = [r.getMessage() for r in caplog.records if "kptr_restrict" in r.getMessage()]
    assert len(messages) == 1  # said once, clearly
    assert sym._kernel.hidden
    assert sym.failures == 3


def test_reload_when_modules_change(fixture_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernel_module, "_MODULES_CHECK_INTERVAL", 0.0)
    sym = Symbolizer(kallsyms_path=str(fixture_dir / "kallsyms"))
    assert sym.kernel([0xFFFFFFFFC0100010])[0].name == "[unknown]"
    with open(fixture_dir / "kallsyms", "a") as f:
        f.write("ffffffffc0100000 t newmod_func\t[newmod]\n")
    (fixture_dir / "modules").write_text(MODULES + "newmod 8192 0 - Live 0xffffffffc0100000\n")
    assert sym.kernel([0xFFFFFFFFC0100010])[0].name == "newmod_func [newmod]"


def test_no_reload_when_only_module_reference_counts_change(
        fixture_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernel_module, "_MODULES_CHECK_INTERVAL", 0.0)
    sym = Symbolizer(kallsyms_path=str(fixture_dir / "kallsyms"))
    loads = []
    original = kernel_module.KernelSymbols._load

    def counted(self: kernel_module.KernelSymbols) -> None:
        loads.append(1)
        original(self)

    monkeypatch.setattr(kernel_module.KernelSymbols, "_load", counted)
    assert sym.kernel_address("do_nanosleep", "", 0x400) == 0xFFFFFFFF81001000
    for users in range(1, 4):  # a module's file opened and closed: only its reference count moves
        (fixture_dir / "modules").write_text(MODULES.replace(" 0 - Live", f" {users} - Live"))
        assert sym.kernel_address("do_nanosleep", "", 0x400) == 0xFFFFFFFF81001000
    assert len(loads) <= 1


def test_unreadable_kallsyms(tmp_path: Path) -> None:
    sym = Symbolizer(kallsyms_path=str(tmp_path / "missing"))
    assert sym.kernel([0xFFFFFFFF81001010])[0].name == "[unknown]"


@pytest.mark.root  # real kallsyms addresses need root: without it the test fails (tests/conftest.py)
def test_real_kallsyms_loads_text_only() -> None:
    sym = Symbolizer()
    assert sym.kernel_symbol_count() > 10_000


def test_padding_symbols_and_unsorted_lines(tmp_path: Path) -> None:
    # 6.2+ kernels list a __pfx_ symbol for the padding before each function; /proc/kallsyms is
    # not sorted across the core kernel, modules and BPF programs.
    (tmp_path / "kallsyms").write_text(
        "ffffffffc0000100 T mymod_wait\t[mymod]\n"
        "ffffffff81000000 T _stext\n"
        "ffffffff81000ff0 T __pfx_schedule\n"
        "ffffffff81001000 T schedule\n"
        "ffffffff81000400 T io_schedule\n"
        "ffffffff81003000 T _etext\n"
    )
    (tmp_path / "modules").write_text(MODULES)
    sym = Symbolizer(kallsyms_path=str(tmp_path / "kallsyms"))
    frames = sym.kernel([0xFFFFFFFF81000FF8, 0xFFFFFFFF81001004, 0xFFFFFFFFC0000104])
    assert [f.name for f in frames] == ["io_schedule", "schedule", "mymod_wait [mymod]"]
    assert sym.kernel_symbol_count() == 5  # _stext, io_schedule, schedule, _etext, mymod_wait
