"""The Linux capabilities the Helm chart grants are enough for the exporter, and each one is needed.

The real exporter (`record`, real probe) runs as root with only the chart's capabilities in its bounding
set (setpriv), against a workload running as another user from a binary that user alone may read, as
in another container. With all of them it attaches and names both halves of the stack; without BPF or
PERFMON it cannot load or attach; without SYSLOG kernel frames are unknown (kallsyms reads as zeros);
without SYS_PTRACE or DAC_READ_SEARCH the user frames are unknown (the other user's maps and binary
cannot be read).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testkit.exporter import SOURCE_ENV
from testkit.helm_chart import container, render
from testkit.workloads import Workload

pytestmark = pytest.mark.kernel

ROOT = Path(__file__).resolve().parents[2]
def chart_capabilities() -> list[str]:
    return list(container(render({}))["securityContext"]["capabilities"]["add"])


def bounding_set() -> set[str]:
    """Capability names this process may pass on (a sandbox may lack some)."""
    mask = int(next(line for line in Path("/proc/self/status").read_text().splitlines()
                    if line.startswith("CapBnd:")).split()[1], 16)
    names = {"DAC_READ_SEARCH": 2, "SYS_PTRACE": 19, "SYS_ADMIN": 21, "SYS_RESOURCE": 24, "SYSLOG": 34,
             "PERFMON": 38, "BPF": 39, "CHECKPOINT_RESTORE": 40}
    return {name for name, bit in names.items() if mask >> bit & 1}


def record_with(capabilities: list[str], wrapper: Path, tmp_path: Path) -> tuple[int, str, str]:
    """(exit status, folded output, log) of `record` with only these capabilities."""
    out = tmp_path / "out.folded"
    caps = ",".join(["-all", *(f"+{c.lower()}" for c in capabilities)])
    with Workload("sleep", iterations=20, interval_ms=20, binary=wrapper) as workload:
        proc = subprocess.Popen(
            ["setpriv", f"--bounding-set={caps}", sys.executable, "-m", "offcpu_exporter", "record",
             "--pid", str(workload.pid), "--duration", "2.5", "--format", "folded", "-o", str(out),
             "--kubernetes.metadata", "off"],
            cwd=ROOT, env={**os.environ, **SOURCE_ENV}, stderr=subprocess.PIPE, text=True,
        )
        assert proc.stderr is not None
        log = []
        for line in proc.stderr:
            log.append(line)
            if "recording for" in line or "error" in line.lower():
                break
        time.sleep(0.5)  # the pid reaches the kernel filter right after the attach
        workload.go()
        workload.wait(30)
        log.append(proc.communicate(timeout=60)[1])
    folded = out.read_text() if proc.returncode == 0 else ""
    return proc.returncode, folded, "".join(log)


def test_the_chart_capabilities_are_enough(other_users_binary: Path, tmp_path: Path) -> None:
    granted = [c for c in chart_capabilities() if c in bounding_set()]
    # SYS_RESOURCE only matters before Linux 5.11 (BPF memory charged to RLIMIT_MEMLOCK); a sandbox
    # without it still proves the rest. CHECKPOINT_RESTORE (map_files) has the /proc/PID/root fallback.
    assert set(chart_capabilities()) - set(granted) <= {"SYS_RESOURCE", "CHECKPOINT_RESTORE"}
    status, folded, log = record_with(granted, other_users_binary, tmp_path)
    assert status == 0, log
    # The workload's own sleeps (offcpu_window_mark sleeps too: it marks the measured window).
    stacks = [line for line in folded.splitlines() if "do_nanosleep" in line and "offcpu_window_mark" not in line]
    assert stacks and all("offcpu_sleep_ms" in line for line in stacks), folded


@pytest.mark.parametrize("missing", ["BPF", "PERFMON", "SYSLOG", "SYS_PTRACE", "DAC_READ_SEARCH"])
def test_each_capability_is_needed(missing: str, other_users_binary: Path, tmp_path: Path) -> None:
    granted = [c for c in chart_capabilities() if c in bounding_set() and c != missing]
    status, folded, log = record_with(granted, other_users_binary, tmp_path)
    if missing in ("BPF", "PERFMON"):
        assert status != 0, folded  # cannot load / attach the program
        return
    assert status == 0, log
    if missing == "SYSLOG":
        assert "do_nanosleep" not in folded and "[unknown]" in folded  # kernel frames unnamed
        assert "offcpu_sleep_ms" in folded
    else:
        assert "do_nanosleep" in folded and "offcpu_sleep_ms" not in folded  # user frames unnamed
