"""The DWARF unwinder inside the exporter: the probe captures user stacks from the tables the
pipeline has built for its targets (in the background), and the outputs carry complete stacks, named
as gdb names them, for code built without frame pointers and for a stock Debian binary."""

from __future__ import annotations

import subprocess
import time

import pytest

from offcpu_exporter.formats import Profile, ProfileFilter
from offcpu_exporter.snapshot import Frame
from offcpu_exporter.stack_names import reaches_root
from testkit.gdb import gdb_backtraces
from testkit.inprocess import FLUSH_TIMEOUT, running_pipeline
from testkit.unwind_target import OMIT_FP, TARGET, start
from testkit.workloads import build

pytestmark = pytest.mark.kernel


def _profile(pid: int, seconds: float) -> tuple[Profile, dict[int, list[tuple[int, str]]]]:
    """Off-CPU time of `pid` over `seconds` once its tables are built, and gdb's backtraces after."""
    with running_pipeline(pids=(pid,), flush_interval=0.5) as pipeline:
        assert pipeline.describer is not None, "the probe was loaded without the unwinder"
        assert pipeline.describer.wait_idle(600), "the unwind tables were not built"
        time.sleep(0.3)  # blocks that began before the tables were in the maps have ended
        before = pipeline.flush_now(FLUSH_TIMEOUT)
        time.sleep(seconds)
        after = pipeline.flush_now(FLUSH_TIMEOUT)
        health = after.health
    assert health.unwind_processes >= 1 and health.unwind_walks.get("root", 0) > 0, health
    return Profile.between(before, after, ProfileFilter(frozenset({pid}))), gdb_backtraces(pid)


def _root_share(profile: Profile) -> float:
    total = sum(s.value.ns for s in profile.samples)
    assert total > 0
    return sum(s.value.ns for s in profile.samples if reaches_root(s.stack.user)) / total


def test_code_without_frame_pointers_has_complete_stacks_named_as_gdb_names_them(
        started: list[subprocess.Popen[str]]) -> None:
    binary = build(TARGET, "unwind_target", OMIT_FP)
    p = start(started, str(binary), ready="ready")
    profile, gdb = _profile(p.pid, 2.0)
    share = _root_share(profile)
    print(f"{share:.1%} of the off-CPU time in stacks that reach the thread's root")
    assert share >= 0.9
    # Each thread's main stack (where it blocks) is gdb's backtrace of it, frame for frame: the
    # program's own functions by name, and as many frames.
    ours: dict[int, tuple[Frame, ...]] = {}
    for s in sorted(profile.samples, key=lambda s: -s.value.ns):
        ours.setdefault(s.tid, s.stack.user)
    assert len(gdb) == 4
    for tid, frames in gdb.items():
        assert tid in ours, f"thread {tid} not in the profile"
        names = [f.name for f in ours[tid]]
        detail = f"ours: {names}\ngdb: {[n for _, n in frames]}"
        assert len(names) == len(frames), detail
        for ours_frame, (_, gdb_name) in zip(ours[tid], frames, strict=True):
            if ours_frame.module == str(binary):
                assert ours_frame.name == gdb_name, detail
        assert reaches_root(ours[tid]), detail


def test_a_stock_debian_binary_has_complete_stacks(started: list[subprocess.Popen[str]]) -> None:
    """Debian's python3.11: stripped, no frame pointers; with frame pointers its stacks end in libc."""
    p = start(started, "/usr/bin/python3", "-c",
              "import time\nprint('ready', flush=True)\nwhile True: time.sleep(0.01); sum(range(20000))",
              ready="ready")
    profile, gdb = _profile(p.pid, 2.0)
    share = _root_share(profile)
    print(f"python3: {share:.1%} of the off-CPU time in stacks that reach the root")
    assert share >= 0.9
    (frames,) = gdb.values()
    main = max(profile.samples, key=lambda s: s.value.ns).stack.user
    assert len(main) == len(frames), ([f.name for f in main], frames)
