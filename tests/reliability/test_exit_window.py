"""A process read while it exits: the kernel reports the exit (sched_process_exit) early in
do_exit(), before the process has freed its memory and files and become a zombie, and reports
nothing after. A targets refresh in between finds it alive; it must still leave the table as soon
as it is gone, not at the next /proc rescan a minute later (its series would outlive their grace
period, and a reused pid would meet a stale entry)."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

from offcpu_exporter.core import CoreConfig, build_core
from offcpu_exporter.probe.loader import Probe, ProbeConfig
from offcpu_exporter.targets import TargetRules
from testkit.inprocess import ATTACH

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(120)]

COMM = "exit_window"
# Memory the process frees as it exits: 512 MiB of 4 KiB pages takes the kernel ~0.1 s here, and
# on kernels whose sched_process_exit comes before exit_mm() (6.16+) that is the window.
CHILD = f"""
import ctypes, mmap, os, sys
ctypes.CDLL(None).prctl(15, b"{COMM}", 0, 0, 0)
m = mmap.mmap(-1, 512 << 20)
m.madvise(mmap.MADV_NOHUGEPAGE)
for i in range(0, len(m), 4096):
    m[i] = 1
print("ready", flush=True)
sys.stdin.readline()
os._exit(0)
"""
PF_EXITING = 0x4


def _stat(pid: int) -> tuple[str, int]:
    """(state, flags) of /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return fields[0], int(fields[6])


def test_a_process_seen_alive_while_it_exits_is_retired_once_it_is_a_zombie() -> None:
    probe = Probe(ProbeConfig(attach=ATTACH))
    core = build_core(CoreConfig(probe=probe.config, rules=TargetRules(comm=re.compile(f"^{COMM}$")),
                                 targets_interval=0.2), probe=probe)
    pipeline = core.pipeline  # refreshed by hand below, never by its loop: the test picks the moment
    probe.start()
    try:
        pipeline.sync_targets()  # the first refresh: a /proc rescan
        in_window = 0
        for _ in range(5):
            child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
            try:
                assert child.stdout is not None and child.stdin is not None
                assert child.stdout.readline() == "ready\n"
                pipeline.sync_targets()
                assert child.pid in pipeline.processes.watched_pids()
                child.stdin.write("\n")
                child.stdin.flush()
                while not _stat(child.pid)[1] & PF_EXITING:
                    pass
                time.sleep(0.01)  # past sched_process_exit, inside exit_mm() on 6.16+
                pipeline.sync_targets()
                seen_exiting = _stat(child.pid)[0] not in ("Z", "X")
                deadline = time.monotonic() + 10
                while _stat(child.pid)[0] != "Z" and time.monotonic() < deadline:
                    time.sleep(0.005)  # not reaped: a zombie until wait() below
                pipeline.sync_targets()
                pipeline.sync_targets()
                assert child.pid not in pipeline.processes.watched_pids(), \
                    f"pid {child.pid} exited (a zombie) and is still watched"
                in_window += seen_exiting
            finally:
                child.kill()
                child.wait()
        print(f"{in_window} of 5 exits read by the exporter while the process was still exiting")
    finally:
        probe.close()
