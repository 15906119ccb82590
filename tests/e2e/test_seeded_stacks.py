"""Threads blocked since before the exporter started: their blocks are seeded with the stacks
/proc shows (offcpu_exporter/blocked_stacks.py), not the placeholder, on a real server whose
background threads sit idle for the whole recording (Debian's redis-server: three bio threads and
jemalloc's background thread wait on condition variables from start-up on).

What "equal to gdb's backtrace" allows: gdb_frames.py leaves out gdb's inlined and tail-call
frames (not on the stack: neither the probe nor this walk can see them); names are compared after
taking off leading underscores, a symbol version (`@GLIBC_2.3.2`) and glibc's `_impl` suffix (one
function, several aliases at its address: gdb picks `___pthread_cond_wait`, `clone3`,
`__libc_start_main_impl`, the symbolizer `pthread_cond_wait`, `__clone3`, `__libc_start_main`);
and a frame gdb cannot name (`??`) is one the symbolizer cannot name either (`[unknown] obj+0x...`).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from offcpu_exporter.formats import Profile, ProfileFilter
from offcpu_exporter.probe.loader import ProbeConfig
from offcpu_exporter.probe.stack_ids import stack_id
from offcpu_exporter.snapshot import Frame, FrameKind
from offcpu_exporter.stack_names import reaches_root
from offcpu_exporter.unwind import TableCache, Unwinder
from offcpu_exporter.unwind.objects import object_table
from testkit.gdb import gdb_backtraces
from testkit.inprocess import ATTACH, FLUSH_TIMEOUT, running_pipeline

pytestmark = pytest.mark.kernel

RECORD_SECONDS = 8.0
IDLE_THREADS = ("bio_close_file", "bio_aof_fsync", "bio_lazy_free", "jemalloc_bg_thd")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _threads(pid: int) -> dict[int, str]:
    out = {}
    for name in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{name}/comm") as f:
            out[int(name)] = f.read().strip()
    return out


@pytest.fixture
def redis() -> Iterator[subprocess.Popen[bytes]]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed (scripts/setup --test installs it)")
    p = subprocess.Popen([binary, "--port", str(_free_port()), "--bind", "127.0.0.1", "--save", "",
                          "--appendonly", "no", "--protected-mode", "yes"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while set(IDLE_THREADS) - set(_threads(p.pid).values()):
            assert time.monotonic() < deadline, _threads(p.pid)
            time.sleep(0.05)
        time.sleep(0.5)  # its background threads are waiting by now, before any probe exists
        yield p
    finally:
        p.kill()
        p.wait()


def _normal(name: str) -> str:
    name = name.split("@", 1)[0].lstrip("_")
    return name.removesuffix("_impl")


def _same_function(ours: Frame, gdb_name: str) -> bool:
    if gdb_name == "??":
        return ours.kind is FrameKind.PLACEHOLDER and ours.name.startswith("[unknown]")
    return _normal(ours.name) == _normal(gdb_name)


def test_threads_blocked_before_watching_have_their_stacks_named_as_gdb_names_them(
        redis: subprocess.Popen[bytes], tmp_path: Path) -> None:
    pid = redis.pid
    names = _threads(pid)
    # As a deployed exporter has them: redis's tables in the disk cache (a cold build of its 17
    # objects takes ~7 s here, more than the seeding's budget of waiting on a loaded test machine).
    # Built in this process: an earlier test's stopped exporter refuses new table builders
    # (unwind/build.py's cancel_builds()) until a describer starts again.
    cache = str(tmp_path / "unwind")
    Unwinder(None, cache=TableCache(cache), build_table=object_table).update(pid)
    config = ProbeConfig(attach=ATTACH, per_thread=True, unwind_cache_dir=cache)
    with running_pipeline(pids=(pid,), flush_interval=1.0, probe_config=config) as pipeline:
        # The window opens at a flush: the first one comes after the seeding, which may wait for
        # tables (the empty snapshot before it is dated the pipeline's creation).
        start = pipeline.flush_now(FLUSH_TIMEOUT)
        time.sleep(RECORD_SECONDS)
        end = pipeline.flush_now(FLUSH_TIMEOUT)
        probe = pipeline.probe
        # An id is the kernel's hash of its frames, whoever stored them. (Not every user stack can
        # be checked: the kernel's frame-pointer walk may store a zero frame through code without
        # frame pointers, and a stack is read back only up to its first zero.)
        kernel_stacks = [(sid, addresses) for sid in probe.stack_ids()
                         if (addresses := probe.stack(sid)) and addresses[0] >= 0xFFFF800000000000]
        assert kernel_stacks
        for sid, addresses in kernel_stacks:
            assert stack_id(addresses) == sid, (hex(sid), [hex(a) for a in addresses])
    gdb = gdb_backtraces(pid)  # after: the idle threads still wait where they waited

    seeded = dict(end.health.seeded_stacks)
    print(f"seeded blocks by stacks: {seeded}")
    assert seeded.get("captured", 0) >= len(IDLE_THREADS), seeded
    assert seeded.get("placeholder", 0) == 0, seeded

    profile = Profile.between(start, end, ProfileFilter(frozenset({pid})))
    total = sum(s.value.ns for s in profile.samples)
    complete = sum(s.value.ns for s in profile.samples if reaches_root(s.stack.user))
    placeholder = sum(s.value.ns for s in profile.samples
                      if any("since before it was watched" in f.name for f in (*s.stack.user, *s.stack.kernel)))
    print(f"{complete / total:.1%} of {total / 1e9:.1f} s off CPU in stacks that reach the thread's root; "
          f"{placeholder / total:.1%} under the placeholder")
    for s in sorted(profile.samples, key=lambda s: -s.value.ns)[:12]:
        print(f"  {s.tid} {names.get(s.tid, '?')} {s.value.ns / 1e9:.2f} s root={reaches_root(s.stack.user)} "
              f"{[f.name for f in s.stack.user]}")
    window_ns = end.time_ns - start.time_ns
    assert total >= 0.9 * len(names) * window_ns * 0.9
    per_thread: dict[int, int] = {}
    for s in profile.samples:
        per_thread[s.tid] = per_thread.get(s.tid, 0) + s.value.ns
    assert max(per_thread.values()) <= window_ns, (per_thread, window_ns)  # no thread more than wall time
    assert complete >= 0.9 * total
    assert placeholder == 0

    # Per thread, the stack holding most of its time is gdb's backtrace of it.
    ours: dict[int, tuple[Frame, ...]] = {}
    for s in sorted(profile.samples, key=lambda s: -s.value.ns):
        ours.setdefault(s.tid, s.stack.user)
    assert set(gdb) == set(names)
    for tid, frames in gdb.items():
        assert tid in ours, f"thread {tid} ({names[tid]}) not in the profile"
        detail = f"{names[tid]}: ours {[f.name for f in ours[tid]]}\ngdb: {[n for _, n in frames]}"
        assert len(ours[tid]) == len(frames), detail
        assert all(_same_function(o, g) for o, (_, g) in zip(ours[tid], frames, strict=True)), detail
        assert reaches_root(ours[tid]), detail
        if names[tid].startswith("bio_"):
            assert any(f.name == "bioProcessBackgroundJobs" for f in ours[tid]), detail
    # The kernel half of a seeded block is the one /proc showed: it waits in a futex.
    bio = next(tid for tid, n in names.items() if n == "bio_lazy_free")
    kernel = max((s for s in profile.samples if s.tid == bio), key=lambda s: s.value.ns).stack.kernel
    assert any(re.fullmatch(r"futex_.*wait.*", f.name) for f in kernel), [f.name for f in kernel]
