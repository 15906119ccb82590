"""The unwinder on the real kernel, behind the probe's hook (testkit/unwind_harness.py): user
stacks of code built without frame pointers equal gdb's backtraces of the same blocked threads and
reach the threads' roots; frame pointers still carry code without tables, JIT code included.

gdb is the reference: it unwinds from .eh_frame too, with its own, independent implementation.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from offcpu_exporter.symbols import Symbolizer
from offcpu_exporter.unwind import layout
from offcpu_exporter.unwind.source import UnwindConfig
from testkit.gdb import gdb_backtraces
from testkit.unwind_harness import Capture, Harness
from testkit.unwind_target import OMIT_FP, TARGET, start
from testkit.workloads import build

pytestmark = pytest.mark.kernel
HERE = Path(__file__).parent
# The outermost frames of a thread on Debian's glibc: the entry point (main thread), clone3.
ROOTS = {"_start", "__clone3", "clone3", "__clone", "clone"}


@pytest.fixture(scope="module")
def harness() -> Iterator[Harness]:
    with Harness() as h:
        yield h


def blocked_stacks(captures: list[Capture]) -> dict[int, tuple[int, ...]]:
    """Per thread, the stack it was captured with most often (where it blocks, not where it was
    once preempted)."""
    per_tid: dict[int, Counter[tuple[int, ...]]] = {}
    for c in captures:
        per_tid.setdefault(c.tid, Counter())[c.frames] += 1
    return {tid: counts.most_common(1)[0][0] for tid, counts in per_tid.items()}


def names(symbolizer: Symbolizer, pid: int, frames: tuple[int, ...]) -> list[str]:
    """Frame names the way gdb names them: a return address by its call instruction (pc - 1), so
    that a call to a function that never returns, the last instruction of its caller, is named
    after the caller and not after whatever follows it."""
    lookup = [frames[0], *(pc - 1 for pc in frames[1:])]
    return [f.name for f in symbolizer.user(pid, lookup)]


def root_share(captures: list[Capture], pid: int) -> tuple[float, float]:
    """Shares of the off-CPU time of pid's threads whose stack, by the unwinder and by frame
    pointers (bpf_get_stack), reaches the thread's root."""
    symbolizer = Symbolizer()
    total = unwound = fp = 0
    for c in captures:
        if c.tgid != pid:
            continue
        total += c.off_ns
        if c.end == "root" and names(symbolizer, pid, c.frames)[-1] in ROOTS:
            unwound += c.off_ns
        if c.fp_frames and names(symbolizer, pid, c.fp_frames)[-1] in ROOTS:
            fp += c.off_ns
    assert total > 0, "no off-CPU time captured"
    return unwound / total, fp / total


def assert_same_as_gdb(harness: Harness, pid: int, threads: int, own_binary: str | None) -> list[Capture]:
    harness.watch(pid)
    try:
        captures = harness.collect(2.0)
    finally:
        harness.unwatch(pid)
    ours = blocked_stacks([c for c in captures if c.tgid == pid])
    theirs = gdb_backtraces(pid)
    assert len(theirs) == threads, theirs
    symbolizer = Symbolizer()
    for tid, gdb_frames in theirs.items():
        assert tid in ours, f"thread {tid} was not captured"
        frames = ours[tid]
        our_names = names(symbolizer, pid, frames)
        detail = "\n".join(f"{pc:#x} {name}" for pc, name in zip(frames, our_names, strict=True))
        detail += "\ngdb:\n" + "\n".join(f"{pc:#x} {name}" for pc, name in gdb_frames)
        assert [pc for pc, _ in gdb_frames] == list(frames), detail
        if own_binary is not None:
            mapped = symbolizer.user(pid, frames)
            for (_, gdb_name), ours_name, frame in zip(gdb_frames, our_names, mapped, strict=True):
                if frame.module == own_binary:
                    assert ours_name == gdb_name, detail
        assert our_names[-1] in ROOTS, detail
    return captures


def test_frames_equal_gdb_for_code_without_frame_pointers(harness: Harness, started: list) -> None:
    binary = build(TARGET, "unwind_target", OMIT_FP)
    p = start(started, str(binary), ready="ready")
    captures = assert_same_as_gdb(harness, p.pid, threads=4, own_binary=str(binary))
    by_fp = blocked_stacks([Capture(c.tgid, c.tid, c.off_ns, c.fp_frames, "", (), 0, 0) for c in captures])
    # Without the tables the same stacks stop after one or two frames: the test is not vacuous.
    assert max(len(f) for f in by_fp.values()) <= 3, by_fp


def test_frames_equal_gdb_for_stock_debian_python(harness: Harness, started: list) -> None:
    """Debian's python3.11: stripped, no frame pointers, a deep interpreter stack."""
    p = start(started, sys.executable if "python3" in Path(sys.executable).name else "/usr/bin/python3", "-c",
              "import time\nprint('ready', flush=True)\nwhile True: time.sleep(0.02)", ready="ready")
    captures = assert_same_as_gdb(harness, p.pid, threads=1, own_binary=None)
    assert max(len(c.frames) for c in captures) >= 10


def test_most_off_cpu_time_reaches_the_root(harness: Harness, started: list) -> None:
    """The issue's bar: >= 90% of off-CPU time in stacks that reach the thread's root."""
    binary = build(TARGET, "unwind_target", OMIT_FP)
    p = start(started, str(binary), ready="ready")
    py = start(started, "/usr/bin/python3", "-c",
               "import time\nprint('ready', flush=True)\nwhile True: time.sleep(0.01); sum(range(20000))",
               ready="ready")
    harness.watch(p.pid)
    harness.watch(py.pid)
    try:
        captures = harness.collect(3.0)
    finally:
        harness.unwatch(p.pid)
        harness.unwatch(py.pid)
    for pid in (p.pid, py.pid):
        unwound, fp = root_share(captures, pid)
        print(f"pid {pid}: {unwound:.1%} of off-CPU time reaches the root unwound, {fp:.1%} with frame pointers")
        assert unwound >= 0.9
        assert fp < 0.5


def test_the_probes_maps_hold_a_node_of_10000_processes(started: list) -> None:
    """Issue 27's node: 10,000 processes with tables in the maps the probe declares (its
    UnwindConfig), each with 4 mappings, and a process whose mappings sit in the last slots of
    unwind_mappings still walked to its root. The process entry held the mappings inline before
    (8 KiB each), and the map took 4,096 processes."""
    config = UnwindConfig()
    fake, count = 4_000_000, 10_000  # tgids above any pid_max: no real process collides
    with Harness(config=config) as h:
        binary = build(TARGET, "unwind_target", OMIT_FP)
        p = start(started, str(binary), ready="ready")
        h.watch(p.pid)
        own = h.maps.read_process(p.pid) or []
        assert own, "the target has tables"
        filler = layout.UnwindMapping(0x1000, 0x2000, 0, 0, 0)
        base = config.mapping_slots // 2
        h.maps.write_mappings(base, bytes(filler) * (4 * count))
        for i in range(count):
            h.maps.set_process(fake + i, base + 4 * i, 4)
        assert len(h.maps.read_process(fake + count - 1) or []) == 4
        last = config.mapping_slots - len(own)
        h.maps.write_mappings(last, b"".join(bytes(m) for m in own))
        h.maps.set_process(p.pid, last, len(own))
        try:
            captures = h.collect(2.0)
        finally:
            h.unwatch(p.pid)
    unwound, _ = root_share(captures, p.pid)
    assert unwound >= 0.9, unwound


def test_frame_pointers_carry_code_without_tables(harness: Harness, started: list) -> None:
    """A process without tables is walked with its frame pointers: the same frames as the
    kernel's own frame-pointer walk (bpf_get_stack)."""
    binary = build(TARGET, "unwind_target_fp", ("-O0", "-fno-omit-frame-pointer", "-pthread"))
    p = start(started, str(binary), ready="ready")
    harness.watch(p.pid, tables=False)
    try:
        captures = [c for c in harness.collect(1.0) if c.tgid == p.pid]
    finally:
        harness.unwatch(p.pid)
    assert captures
    same = sum(1 for c in captures if c.frames == c.fp_frames)
    assert same / len(captures) >= 0.95, [(c.frames, c.fp_frames) for c in captures if c.frames != c.fp_frames][:3]


# The first table of /usr/bin/node (372,000 rows) takes pyelftools 15-25 s here, 25 times that
# under the kernel matrix's emulation.
@pytest.mark.timeout(1200)
def test_jit_frames_between_cfi_frames(harness: Harness, started: list, tmp_path: Path) -> None:
    """node --perf-basic-prof blocked in Atomics.wait: libc and node's C++ (tables) below, JS
    functions (JIT code with frame pointers, named by the perf map) in the middle, node's C++ and
    the entry point above. Without the tables the stack stops at the libc frame."""
    node = shutil.which("node") or shutil.which("nodejs")
    if node is None:
        pytest.fail("node is not installed (scripts/setup --test installs nodejs)")
    script = HERE.parent / "symbols" / "node_block.js"
    p = subprocess.Popen([node, "--perf-basic-prof", str(script), "300000"], stdout=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, text=True, cwd=tmp_path)
    started.append(p)
    assert p.stdout is not None and p.stdout.readline().startswith("ready")
    try:
        time.sleep(0.5)  # the JS functions are compiled and in the perf map
        harness.watch(p.pid)
        try:
            captures = [c for c in harness.collect(2.0) if c.tgid == p.pid and c.tid == p.pid]
        finally:
            harness.unwatch(p.pid)
        symbolizer = Symbolizer()
        stacks = Counter(tuple(names(symbolizer, p.pid, c.frames)) for c in captures if c.end == "root")
        assert stacks, Counter(c.end for c in captures)
        frames, _ = stacks.most_common(1)[0]
        text = "\n".join(frames)
        # TurboFan may inline waitInJs into outerLoop (seen under emulation): either names our JS.
        assert any(f.startswith("JS:") and ("waitInJs" in f or "outerLoop" in f) for f in frames), text
        assert any(f.startswith("Builtins_JSEntry") for f in frames), text  # JIT code, then C++ again
        assert frames[-1] in ROOTS, text
        assert not any(f.startswith("[unknown]") for f in frames), text
    finally:
        Path(f"/tmp/perf-{p.pid}.map").unlink(missing_ok=True)
