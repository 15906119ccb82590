"""Stacks of threads blocked before they were watched, read from a synthetic /proc: the kernel
half through kallsyms, the user half from /proc/PID/syscall and /proc/PID/mem, stored under the
kernel's stack ids and counted by outcome."""

from __future__ import annotations

from pathlib import Path

from offcpu_exporter.blocked_stacks import (
    CAPTURED,
    PLACEHOLDER,
    TRUNCATED,
    BlockedStacks,
    Budget,
    kernel_addresses,
    parse_kernel_stack,
    user_registers,
)
from offcpu_exporter.in_progress import InProgress
from offcpu_exporter.probe import layout
from offcpu_exporter.probe.stack_ids import stack_id
from offcpu_exporter.symbols.kernel import KernelSymbols
from testkit.kernel_maps import MemoryMaps

KALLSYMS = """\
ffffffff81000000 T _stext
ffffffff81100000 t __pfx_futex_wait
ffffffff81100010 T futex_wait
ffffffff81100200 t __futex_wait
ffffffff81100300 t show_stat
ffffffff81100400 T do_syscall_64
ffffffff81100800 t show_stat
ffffffff81100880 T entry_SYSCALL_64
ffffffffc0001000 t nfs_wait_bit_killable\t[nfs]
ffffffffc0001100 t nfs_other\t[nfs]
"""
STACK = """\
[<0>] futex_wait+0x9a/0x150
[<0>] __futex_wait+0x8a/0x100
[<0>] nfs_wait_bit_killable+0x20/0x80 [nfs]
[<0>] do_syscall_64+0x71/0x290
"""


def _symbols(tmp_path: Path) -> KernelSymbols:
    (tmp_path / "kallsyms").write_text(KALLSYMS)
    (tmp_path / "modules").write_text("nfs 8192 0 - Live 0xffffffffc0001000\n")
    return KernelSymbols(str(tmp_path / "kallsyms"), str(tmp_path / "modules"))


def test_kernel_stack_lines_become_addresses_as_bpf_get_stack_gives_them(tmp_path: Path) -> None:
    frames = parse_kernel_stack(STACK + "garbage\n[<0>] after_garbage+0x1/0x2\n")
    assert frames == [("futex_wait", 0x9A, 0x150, ""), ("__futex_wait", 0x8A, 0x100, ""),
                      ("nfs_wait_bit_killable", 0x20, 0x80, "nfs"), ("do_syscall_64", 0x71, 0x290, "")]
    symbols = _symbols(tmp_path)
    addresses = kernel_addresses(frames, symbols.address_of)
    assert addresses == (0xFFFFFFFF811000AA, 0xFFFFFFFF8110028A, 0xFFFFFFFFC0001020, 0xFFFFFFFF81100471)
    # And they name the same functions again.
    assert [symbols.resolve(a).name for a in addresses] == [
        "futex_wait", "__futex_wait", "nfs_wait_bit_killable [nfs]", "do_syscall_64"]


def test_a_name_is_matched_whole_and_duplicates_by_their_size(tmp_path: Path) -> None:
    symbols = _symbols(tmp_path)
    assert symbols.address_of("futex_wai") is None  # a prefix of a name is not the name
    assert symbols.address_of("wait") is None
    assert symbols.address_of("nfs_other") is None  # in a module, asked for in the kernel
    assert symbols.address_of("nfs_other", "nfs") == 0xFFFFFFFFC0001100
    # Two static show_stat: 0x100 and 0x80 bytes to the next symbol.
    assert symbols.address_of("show_stat", "", 0x70) == 0xFFFFFFFF81100800
    assert symbols.address_of("show_stat", "", 0xF0) == 0xFFFFFFFF81100300
    assert kernel_addresses([("missing", 1, 2, "")], symbols.address_of) is None


def test_user_registers_are_the_last_two_fields_of_proc_syscall() -> None:
    assert user_registers("202 0x1 0x189 0x0 0x0 0x0 0xffffffff 0x7f1a74bfe200 0x7f1a75aa3f16\n") == (
        0x7F1A74BFE200, 0x7F1A75AA3F16)
    assert user_registers("-1 0x7ffd0 0x4005\n") == (0x7FFD0, 0x4005)  # not in a system call
    assert user_registers("running\n") is None


def test_stack_ids_follow_the_kernels_hash() -> None:
    assert stack_id(()) == layout.STACK_EMPTY
    a, b = stack_id((1, 2, 3)), stack_id((1, 2, 4))
    assert a != b and a >= layout.STACK_RESERVED and b >= layout.STACK_RESERVED
    assert stack_id(tuple(range(200))) == stack_id(tuple(range(127)))  # the probe's depth


def _thread(root: Path, tgid: int, tid: int, *, flags: int = 0, runs: int = 3) -> Path:
    d = root / str(tgid) / "task" / str(tid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "stat").write_text(f"{tid} (redis (x)) S 1 0 0 0 0 {flags} " + "0 " * 40 + "\n")
    (d / "schedstat").write_text(f"100 200 {runs}\n")
    (d / "wchan").write_text("futex_wait")
    (d / "stack").write_text(STACK)
    (d / "syscall").write_text("202 0x1 0x189 0x0 0x0 0x0 0xffffffff 0x10000 0x401234\n")
    return d


def test_seeded_blocks_carry_the_stacks_read_from_proc(tmp_path: Path) -> None:
    symbols = _symbols(tmp_path)
    proc = tmp_path / "proc"
    _thread(proc, 50, 50)
    _thread(proc, 50, 51, flags=0x00200000)  # a kernel thread: no user half
    (proc / "50" / "mem").write_bytes(b"")
    kernel = MemoryMaps(per_thread=True)
    progress = InProgress(kernel, proc_root=str(proc), kernel_address=symbols.address_of)  # type: ignore[arg-type]
    assert progress.seed(50) == 2
    user = kernel.starts[50].user_stack
    kstack = kernel.starts[50].kernel_stack
    # No unwind tables (the stand-in has no unwinder): the user half is its leaf, the pc.
    assert kernel.stacks[user] == (0x401234,)
    assert kernel.stacks[kstack][0] == 0xFFFFFFFF811000AA and len(kernel.stacks[kstack]) == 4
    assert user == stack_id((0x401234,)) and kstack == stack_id(kernel.stacks[kstack])
    assert kernel.starts[51].user_stack == layout.STACK_EMPTY and kernel.starts[51].kernel_stack == kstack
    assert progress.seeded_stacks == {CAPTURED: 1, TRUNCATED: 1, PLACEHOLDER: 0}


def test_without_kernel_symbols_or_budget_a_half_stays_the_placeholder(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    _thread(proc, 50, 50)
    kernel = MemoryMaps(per_thread=True)
    progress = InProgress(kernel, proc_root=str(proc))  # type: ignore[arg-type]
    assert progress.seed(50) == 1
    assert kernel.starts[50].kernel_stack == layout.STACK_SEEDED
    assert kernel.stacks[kernel.starts[50].user_stack] == (0x401234,)
    assert progress.seeded_stacks[PLACEHOLDER] == 1
    # A spent budget: both halves are the placeholder.
    spent = Budget(1.0, 0.0)
    spent.spend(2.0)
    _thread(proc, 60, 60)
    kernel = MemoryMaps(per_thread=True)
    progress = InProgress(kernel, stacks=BlockedStacks(kernel, None, proc_root=str(proc),  # type: ignore[arg-type]
                                                       capture_budget=spent), proc_root=str(proc))
    assert progress.seed(60) == 1
    assert (kernel.starts[60].user_stack, kernel.starts[60].kernel_stack) == (layout.STACK_SEEDED, layout.STACK_SEEDED)


def test_stacks_of_a_block_not_seeded_after_all_are_left_to_the_flush_to_free(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    _thread(proc, 50, 50)

    class Woken(MemoryMaps):
        def seed_start(self, tid: int, entry: object) -> bool:
            stored = super().seed_start(tid, entry)  # type: ignore[arg-type]
            _thread(proc, 50, 50, runs=4)  # it ran (and blocked again) meanwhile
            return stored

    kernel = Woken(per_thread=True)
    progress = InProgress(kernel, proc_root=str(proc))  # type: ignore[arg-type]
    assert progress.seed(50) == 0
    assert kernel.starts == {} and len(kernel.stacks) == 1  # unreferenced: Aggregator frees it
    assert sum(progress.seeded_stacks.values()) == 0
