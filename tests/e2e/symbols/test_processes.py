"""The symbolizer against real processes built here: names of their own functions, as they print
them, resolved through /proc/PID/maps."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from offcpu_exporter.snapshot import FrameKind
from offcpu_exporter.symbols import Symbolizer
from testkit.elf_lookup import gnu_build_id, symbol_table
from testkit.elf_lookup import symbol as elf_symbol
from testkit.symbol_programs import Program, compile_c, need

RunProgram = Callable[..., Program]


def elf_type(path: Path) -> str:
    with open(path, "rb") as f:
        return str(ELFFile(f)["e_type"])


@pytest.fixture(scope="module")
def binaries(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("symbols-bin")
    out = {
        "pie": compile_c(d / "target-pie", "symbols_target.c", "-fPIE", "-pie"),
        "nopie": compile_c(d / "target-nopie", "symbols_target.c", "-fno-pie", "-no-pie"),
        "cxx": compile_c(d / "target-cxx", "symbols_cxx.cpp", cxx=True),
    }
    plugin = d / "libsymbols_plugin.so"
    subprocess.run(
        [
            need("gcc"),
            "-shared",
            "-fPIC",
            "-O0",
            "-o",
            str(plugin),
            str(Path(__file__).parent / "symbols_plugin.c"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    out["plugin"] = plugin
    return out


def names(frames: tuple) -> list[str]:
    return [f.name for f in frames]


@pytest.mark.parametrize(("variant", "etype"), [("pie", "ET_DYN"), ("nopie", "ET_EXEC")])
def test_own_functions_by_address(binaries: dict[str, Path], run: RunProgram, variant: str, etype: str) -> None:
    binary = binaries[variant]
    assert elf_type(binary) == etype  # both load-bias cases are really exercised
    program = run(binary)
    sym = Symbolizer()
    wanted = ["symbols_alpha", "symbols_static_beta", "main", "symbols_blocking_sleep", "symbols_after_gap"]
    frames = sym.user(program.pid, [program.addresses[n] for n in wanted])
    assert names(frames) == wanted
    for frame in frames:
        assert frame.kind is FrameKind.NATIVE
        assert frame.module == str(binary)
        assert frame.build_id == gnu_build_id(binary)
    # Inside a function (not at its start) still names it; the file offset is consistent.
    inside = sym.user(program.pid, [program.addresses["symbols_blocking_sleep"] + 5])[0]
    assert inside.name == "symbols_blocking_sleep"
    assert inside.offset == frames[3].offset + 5
    with open(binary, "rb") as f:
        elf = ELFFile(f)
        symbol = elf_symbol(elf, ".symtab", "symbols_alpha")
        text = next(s for s in elf.iter_segments() if s["p_type"] == "PT_LOAD" and s["p_flags"] & 1)
        expected_offset = symbol["st_value"] - text["p_vaddr"] + text["p_offset"]
    assert frames[0].offset == expected_offset
    assert sym.failures == 0


def test_address_past_a_sized_function_is_unknown(binaries: dict[str, Path], run: RunProgram) -> None:
    program = run(binaries["pie"])
    sym = Symbolizer()
    (frame,) = sym.user(program.pid, [program.addresses["gap"]])
    assert frame.kind is FrameKind.PLACEHOLDER
    assert frame.name.startswith("[unknown] target-pie+0x")
    assert frame.name == f"[unknown] target-pie+0x{frame.offset:x}"
    assert sym.failures == 1


def test_library_loaded_after_first_read(binaries: dict[str, Path], run: RunProgram) -> None:
    program = run(binaries["pie"])
    sym = Symbolizer(maps_refresh_interval=0.0)
    assert names(sym.user(program.pid, [program.addresses["main"]])) == ["main"]  # maps read now
    program.command(f"dlopen {binaries['plugin']}", "symbols_plugin_func")
    address = program.addresses["symbols_plugin_func"]
    assert address != 0
    (frame,) = sym.user(program.pid, [address])
    assert frame.name == "symbols_plugin_func"
    assert frame.module == str(binaries["plugin"])


def test_maps_rereads_are_rate_limited(binaries: dict[str, Path], run: RunProgram) -> None:
    program = run(binaries["pie"])
    sym = Symbolizer(maps_refresh_interval=3600.0)
    sym.user(program.pid, [program.addresses["main"]])
    program.command(f"dlopen {binaries['plugin']}", "symbols_plugin_func")
    # Within the interval the new mapping is not looked for again: a placeholder, not an error.
    assert names(sym.user(program.pid, [program.addresses["symbols_plugin_func"]])) == ["[unknown]"]


def test_cxx_names_are_demangled(binaries: dict[str, Path], run: RunProgram) -> None:
    program = run(binaries["cxx"])
    frames = Symbolizer().user(program.pid, [program.addresses["drain"], program.addresses["wait_for"]])
    assert names(frames) == [
        "offcpu::Queue<long>::drain(std::vector<long, std::allocator<long> > const&, int)",
        "offcpu::wait_for(std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> > "
        "const&, double)",
    ]


def _stripped_with_debug(binary: Path, workdir: Path) -> tuple[Path, Path]:
    need("objcopy")
    stripped = workdir / "target-stripped"
    debug = workdir / "target-stripped.debug"
    subprocess.run(["objcopy", "--only-keep-debug", str(binary), str(debug)], check=True, timeout=60)
    subprocess.run(["objcopy", "--strip-all", str(binary), str(stripped)], check=True, timeout=60)
    return stripped, debug


def test_stripped_binary_debuglink(binaries: dict[str, Path], run: RunProgram, tmp_path: Path) -> None:
    stripped, debug = _stripped_with_debug(binaries["pie"], tmp_path)
    subprocess.run(["objcopy", f"--add-gnu-debuglink={debug}", str(stripped)], check=True, cwd=tmp_path, timeout=60)
    with open(stripped, "rb") as f:
        assert ELFFile(f).get_section_by_name(".symtab") is None
    program = run(stripped)
    # No build-id directory has it: only the debuglink next to the binary can name the static function.
    sym = Symbolizer(debug_dirs=[str(tmp_path / "nothing-here")])
    frames = sym.user(program.pid, [program.addresses["symbols_static_beta"], program.addresses["main"]])
    assert names(frames) == ["symbols_static_beta", "main"]


def test_stripped_binary_debuglink_crc_mismatch_is_ignored(
    binaries: dict[str, Path], run: RunProgram, tmp_path: Path
) -> None:
    stripped, debug = _stripped_with_debug(binaries["pie"], tmp_path)
    subprocess.run(["objcopy", f"--add-gnu-debuglink={debug}", str(stripped)], check=True, cwd=tmp_path, timeout=60)
    with open(debug, "ab") as f:
        f.write(b"changed")  # now the CRC recorded in the binary does not match
    program = run(stripped)
    sym = Symbolizer(debug_dirs=[str(tmp_path / "nothing-here")])
    (frame,) = sym.user(program.pid, [program.addresses["symbols_static_beta"]])
    assert frame.kind is FrameKind.PLACEHOLDER


def test_stripped_binary_build_id(binaries: dict[str, Path], run: RunProgram, tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    stripped, debug = _stripped_with_debug(binaries["pie"], tmp_path / "bin")
    bid = gnu_build_id(stripped)
    debug_root = tmp_path / "debug"
    target = debug_root / ".build-id" / bid[:2] / f"{bid[2:]}.debug"
    target.parent.mkdir(parents=True)
    shutil.move(str(debug), target)
    program = run(stripped)
    assert (
        Symbolizer(debug_dirs=["/nonexistent"]).user(program.pid, [program.addresses["symbols_static_beta"]])[0].kind
        is FrameKind.PLACEHOLDER
    )
    sym = Symbolizer(debug_dirs=[str(debug_root)])
    frames = sym.user(program.pid, [program.addresses["symbols_static_beta"], program.addresses["symbols_alpha"]])
    assert names(frames) == ["symbols_static_beta", "symbols_alpha"]
    assert frames[0].build_id == bid


def test_binary_deleted_while_running(binaries: dict[str, Path], run: RunProgram, tmp_path: Path) -> None:
    copy = tmp_path / "target-deleted"
    shutil.copy(binaries["pie"], copy)
    program = run(copy)
    copy.unlink()
    with open(f"/proc/{program.pid}/maps") as f:
        assert f"{copy} (deleted)" in f.read()
    frames = Symbolizer().user(program.pid, [program.addresses["symbols_alpha"]])
    assert names(frames) == ["symbols_alpha"]
    assert frames[0].module == str(copy)


def test_binary_replaced_on_disk_uses_the_mapped_file(
    binaries: dict[str, Path], run: RunProgram, tmp_path: Path
) -> None:
    copy = tmp_path / "target-replaced"
    shutil.copy(binaries["pie"], copy)
    program = run(copy)
    replacement = tmp_path / "other"
    shutil.copy(binaries["cxx"], replacement)
    os.replace(replacement, copy)  # same path, new inode, different code
    frames = Symbolizer().user(program.pid, [program.addresses["symbols_alpha"]])
    assert names(frames) == ["symbols_alpha"]


def test_jit_code_named_by_perf_map(binaries: dict[str, Path], run: RunProgram) -> None:
    program = run(binaries["pie"])
    start = program.addresses["jit_nanosleep_stub"]
    sym = Symbolizer()
    frames = sym.user(program.pid, [start, start + 13, start + 15])
    assert names(frames) == ["jit_nanosleep_stub", "jit_nanosleep_stub", "[unknown]"]
    assert frames[0].kind is FrameKind.JIT


def test_perf_map_reread_when_it_changes(binaries: dict[str, Path], run: RunProgram) -> None:
    program = run(binaries["pie"])
    start = program.addresses["jit_nanosleep_stub"]
    sym = Symbolizer(maps_refresh_interval=0.0)
    assert names(sym.user(program.pid, [start + 100])) == ["[unknown]"]
    with open(f"/tmp/perf-{program.pid}.map", "a") as f:
        f.write(f"{start + 64:x} 40 added_later\n")
    assert names(sym.user(program.pid, [start + 100, start])) == ["added_later", "jit_nanosleep_stub"]


def test_refresh_rereads_now_and_the_generation_says_what_changed(
    binaries: dict[str, Path], run: RunProgram
) -> None:
    program = run(binaries["pie"])
    start = program.addresses["jit_nanosleep_stub"]
    sym = Symbolizer(maps_refresh_interval=3600.0)  # a lookup miss alone would not re-read
    assert names(sym.user(program.pid, [start + 100])) == ["[unknown]"]
    before = sym.generation(program.pid)
    assert sym.refresh(program.pid) == before  # nothing changed
    with open(f"/tmp/perf-{program.pid}.map", "a") as f:
        f.write(f"{start + 64:x} 40 added_later\n")
    after = sym.refresh(program.pid)
    assert after != before
    assert sym.generation(program.pid) == after == sym.refresh(program.pid)
    assert names(sym.user(program.pid, [start + 100])) == ["added_later"]
    assert sym.refresh(12345678) == 0  # not a process it knows


def test_vdso_function(binaries: dict[str, Path], run: RunProgram) -> None:
    program = run(binaries["pie"])
    address = program.addresses["vdso_clock_gettime"]
    assert address != 0
    (frame,) = Symbolizer().user(program.pid, [address])
    assert frame.name in ("__vdso_clock_gettime", "clock_gettime")
    assert frame.module == "[vdso]"
    assert frame.kind is FrameKind.NATIVE


def test_files_are_shared_and_dropped_with_the_last_user(binaries: dict[str, Path], run: RunProgram) -> None:
    first, second = run(binaries["pie"]), run(binaries["pie"])
    sym = Symbolizer()
    assert names(sym.user(first.pid, [first.addresses["symbols_alpha"]])) == ["symbols_alpha"]
    cached = sym.cached_files
    assert names(sym.user(second.pid, [second.addresses["symbols_alpha"]])) == ["symbols_alpha"]
    assert sym.cached_files == cached  # same file identity: loaded once
    sym.forget(first.pid)
    assert sym.cached_files == cached
    sym.forget(second.pid)
    assert sym.cached_files == 0


def test_lru_bound(binaries: dict[str, Path], run: RunProgram) -> None:
    program = run(binaries["pie"])
    sym = Symbolizer(max_cached_files=1)
    libc_address = _libc_function_address(program.pid)
    for _ in range(3):
        frames = sym.user(program.pid, [program.addresses["symbols_alpha"], libc_address])
        assert frames[0].name == "symbols_alpha"
        assert frames[1].kind is FrameKind.NATIVE
        assert sym.cached_files == 1
        sym.user(program.pid, [program.addresses["symbols_alpha"] + 1])


def _libc_function_address(pid: int) -> int:
    """The address in `pid` of libc's nanosleep: its .dynsym value plus the library's load bias."""
    with open(f"/proc/{pid}/maps") as f:
        rows = [line.split() for line in f if "libc.so" in line]
    first = rows[0]
    base = int(first[0].split("-")[0], 16) - int(first[2], 16)
    with open(first[5], "rb") as f:
        value = elf_symbol(ELFFile(f), ".dynsym", "nanosleep")["st_value"]
    return base + value


def test_unknown_pid_gives_placeholders() -> None:
    sym = Symbolizer()
    frames = sym.user(2**22 + 12345, [0x401000, 0x7F0000001000])
    assert names(frames) == ["[unknown]", "[unknown]"]
    assert sym.failures == 2


@pytest.fixture
def kernel_pointers_shown() -> Iterator[None]:
    """kallsyms shows root the real addresses unless kptr_restrict is 2 (hidden from everyone):
    lowered to 1 for the test, as the exporter's documentation asks of a host (docs/symbols.md)."""
    setting = Path("/proc/sys/kernel/kptr_restrict")
    before = setting.read_text().strip()
    if before == "2":
        setting.write_text("1")
    try:
        yield
    finally:
        if before == "2":
            setting.write_text(before)


@pytest.mark.root
def test_kernel_address_from_kallsyms(kernel_pointers_shown: None) -> None:
    with open("/proc/kallsyms") as f:
        rows = [line.split() for line in f]
    wanted = [r for r in rows if r[2] == "do_nanosleep" and r[1] in "tT"]
    address = int(wanted[0][0], 16)
    assert address != 0, "kallsyms hides kernel addresses from this process (kptr_restrict, not root?)"
    sym = Symbolizer()
    frames = sym.kernel([address, address + 4])
    assert names(frames) == ["do_nanosleep", "do_nanosleep"]
    assert frames[0].kind is FrameKind.KERNEL and frames[0].module == "[kernel]"
    module_rows = [r for r in rows if len(r) > 3 and r[1] in "tT" and r[3] not in ("[bpf]", "[__builtin__ftrace]")]
    if module_rows:
        row = module_rows[0]
        (frame,) = sym.kernel([int(row[0], 16)])
        module = row[3].strip("[]")
        assert frame.name == f"{row[2]} [{module}]"
        assert frame.module == module
    assert sym.failures == 0


def test_prepared_process_symbolized_after_exit(binaries: dict[str, Path], run: RunProgram, tmp_path: Path) -> None:
    copy = tmp_path / "target-short"
    shutil.copy(binaries["pie"], copy)
    program = run(copy)
    sym = Symbolizer()
    sym.prepare(program.pid)
    addresses = [program.addresses[n] for n in ("symbols_alpha", "vdso_clock_gettime", "jit_nanosleep_stub")]
    pid = program.pid
    program.stop()  # exited and reaped: /proc/PID is gone
    copy.unlink()
    assert not os.path.exists(f"/proc/{pid}")
    frames = sym.user(pid, addresses)
    assert names(frames)[0] == "symbols_alpha"
    assert frames[1].module == "[vdso]" and frames[1].kind is FrameKind.NATIVE
    assert names(frames)[2] == "jit_nanosleep_stub"


def test_exited_process_keeps_its_maps_when_a_stray_address_forces_a_reread(
    binaries: dict[str, Path], run: RunProgram
) -> None:
    # Frame-pointer walks through code built without them end in garbage addresses. Such an
    # address makes the symbolizer re-read the maps; once the process is gone, that read fails
    # and must not replace the maps that still name every other frame.
    program = run(binaries["pie"])
    sym = Symbolizer(maps_refresh_interval=0.0)
    sym.prepare(program.pid)
    pid, alpha = program.pid, program.addresses["symbols_alpha"]
    program.stop()
    assert not os.path.exists(f"/proc/{pid}")
    stray, frame = sym.user(pid, [0x10, alpha])
    assert stray.name == "[unknown]"
    assert frame.name == "symbols_alpha"
    assert names(sym.user(pid, [alpha])) == ["symbols_alpha"]


@pytest.mark.parametrize(
    ("mangling", "generic"),
    [
        ("legacy", "symbols_rust::offcpu::queue::generic_wait"),  # legacy names carry no generic arguments
        ("v0", "symbols_rust::offcpu::queue::generic_wait::<u32>"),
    ],
)
def test_rust_names_are_demangled(run: RunProgram, tmp_path: Path, mangling: str, generic: str) -> None:
    binary = tmp_path / f"symbols_rust_{mangling}"
    subprocess.run(
        # Legacy is the default of stable rustc (asking for it by name is unstable in newer ones).
        [need("rustc"), "-O", "-C", "force-frame-pointers=yes",
         *(["-C", "symbol-mangling-version=v0"] if mangling == "v0" else []),
         "-o", str(binary), str(Path(__file__).parent / "symbols_rust.rs")],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    program = run(binary)
    frames = Symbolizer().user(program.pid, [program.addresses["wait_for"], program.addresses["generic_wait"]])
    method = "symbols_rust::offcpu::queue::Drain::wait_for"
    assert names(frames) == [method if mangling == "legacy" else f"<{method.rsplit('::', 1)[0]}>::wait_for", generic]


def test_perf_map_inside_the_process_root_and_pid_namespace(
    binaries: dict[str, Path], run: RunProgram, tmp_path: Path
) -> None:
    """A container-like process: own root (chroot) and own PID namespace, so it writes
    <its root>/tmp/perf-<its own pid>.map; the symbolizer must find it there, under that pid."""
    root = tmp_path / "root"
    (root / "tmp").mkdir(parents=True)
    libs = subprocess.run(["ldd", str(binaries["pie"])], check=True, capture_output=True, text=True).stdout
    for token in libs.split():
        if token.startswith("/"):
            target = root / token.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(token, target)
    shutil.copy(binaries["pie"], root / "target")
    program = run(need("unshare"), "--pid", "--fork", "--kill-child", "chroot", str(root), "/target")
    children = Path(f"/proc/{program.pid}/task/{program.pid}/children").read_text().split()
    pid = int(children[0])  # unshare's child became chroot, then the target (exec keeps the pid)
    status = Path(f"/proc/{pid}/status").read_text()
    nspid = int(status.split("NSpid:")[1].split("\n")[0].split()[-1])
    assert nspid != pid
    assert (root / "tmp" / f"perf-{nspid}.map").exists() and not Path(f"/tmp/perf-{pid}.map").exists()
    jit = program.addresses["jit_nanosleep_stub"]
    frames = Symbolizer().user(pid, [jit + 1, program.addresses["symbols_alpha"]])
    assert names(frames) == ["jit_nanosleep_stub", "symbols_alpha"]
    assert frames[0].kind is FrameKind.JIT


def test_minidebuginfo(binaries: dict[str, Path], run: RunProgram, tmp_path: Path) -> None:
    """Fedora/RHEL keep the local function symbols of stripped binaries as an xz-compressed ELF in
    .gnu_debugdata (built here as their find-debuginfo does)."""
    import lzma

    need("objcopy")
    binary = binaries["pie"]
    with open(binary, "rb") as f:
        elf = ELFFile(f)
        dynamic = {s.name for s in symbol_table(elf, ".dynsym").iter_symbols()}
        functions = {
            s.name
            for s in symbol_table(elf, ".symtab").iter_symbols()
            if s["st_info"]["type"] == "STT_FUNC" and s["st_shndx"] != "SHN_UNDEF"
        }
    keep = tmp_path / "keep_symbols"
    keep.write_text("\n".join(sorted(functions - dynamic)) + "\n")
    debug = tmp_path / "debug"
    mini = tmp_path / "mini_debuginfo"
    stripped = tmp_path / "target-mini"
    subprocess.run(["objcopy", "--only-keep-debug", str(binary), str(debug)], check=True, timeout=60)
    subprocess.run(["objcopy", "-S", "--remove-section", ".comment", f"--keep-symbols={keep}", str(debug), str(mini)],
                   check=True, timeout=60)  # fmt: skip
    (tmp_path / "mini.xz").write_bytes(lzma.compress(mini.read_bytes()))
    subprocess.run(["objcopy", "--strip-all", str(binary), str(stripped)], check=True, timeout=60)
    subprocess.run(["objcopy", f"--add-section=.gnu_debugdata={tmp_path / 'mini.xz'}", str(stripped)], check=True,
                   timeout=60)  # fmt: skip
    with open(stripped, "rb") as f:
        assert ELFFile(f).get_section_by_name(".symtab") is None
    program = run(stripped)
    sym = Symbolizer(debug_dirs=[str(tmp_path / "nothing-here")])
    frames = sym.user(program.pid, [program.addresses["symbols_static_beta"], program.addresses["symbols_alpha"]])
    assert names(frames) == ["symbols_static_beta", "symbols_alpha"]
