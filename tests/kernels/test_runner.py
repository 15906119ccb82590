"""The kernel-matrix runner itself: exit statuses, the timeout, and that a broken probe fails a leg.

Each test boots the stock Debian kernel under QEMU (tests/kernels/run.sh), ~8-35 s apiece.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parents[1]
RUN = HERE / "run.sh"
MATRIX = HERE / "matrix.sh"

pytestmark = [
    pytest.mark.slow,
    # Boots a VM and loads BPF programs: needs root, so without it the test fails (tests/conftest.py).
    pytest.mark.kernel,
    # A guest would boot another guest under emulation in emulation.
    pytest.mark.skipif("OFFCPU_GUEST_KERNEL" in os.environ, reason="already inside a kernel-matrix guest"),
]


def run(*args: str | Path, timeout: float = 280) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], cwd=PROJECT, capture_output=True, text=True, timeout=timeout, check=False
    )


def test_probe_attaches_to_finish_task_switch_and_counts_in_a_stock_kernel() -> None:
    r = run(RUN, "--attach", "kprobe", "--timeout", "240", "--",
            sys.executable, "tests/kernels/probe_check.py")
    assert r.returncode == 0, r.stdout + r.stderr
    # The guest kernel (not the host's) with the scheduler hook found in its kallsyms.
    assert re.search(r"probe_check: \d+\.\d+\.\d+-\d+-amd64 / kprobe: hooked finish_task_switch", r.stdout), r.stdout
    assert ": ok" in r.stdout
    assert "exit 0" in r.stderr


def test_exit_status_and_output_are_the_commands() -> None:
    r = run(RUN, "--timeout", "120", "--",
            "sh", "-c", "echo \"attach=$OFFCPU_ATTACH cwd=$(pwd)\"; echo 'to stderr' >&2; exit 3")
    assert r.returncode == 3, r.stdout + r.stderr
    assert f"attach=auto cwd={PROJECT}" in r.stdout
    assert "to stderr" in r.stdout


def test_broken_probe_fails_the_kprobe_leg() -> None:
    # A symbol regex that matches nothing: bcc compiles and loads the program, the attach fails.
    r = run(MATRIX, "--legs", "kprobe", "--timeout", "240", "--",
            sys.executable, "tests/kernels/probe_check.py", "--symbol-regex", "^offcpu_no_such_function$")
    assert r.returncode == 1, r.stdout + r.stderr
    assert re.search(r"^kernel \d+\.\d+\.\d+-\d+-amd64 / kprobe: FAILED \(\d+ s\)$", r.stdout, re.M), r.stdout
    assert "FAILED to attach: kprobe attach on /^offcpu_no_such_function$/ failed" in r.stdout


def test_hung_guest_is_killed_at_the_timeout() -> None:
    r = run(RUN, "--timeout", "10", "--", "sleep", "600", timeout=60)
    assert r.returncode == 124, r.stdout + r.stderr
    assert "guest did not finish within 10 s" in r.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--attach", "fentry", "--", "true"], "--attach must be kprobe, tracepoint or auto"),
        (["--timeout", "0", "--", "true"], "--timeout must be a positive number"),
        (["--kernel", "latest", "--", "true"], "not a Debian kernel ABI"),
        (["true"], "the command goes after --"),
    ],
)
def test_bad_arguments_fail_at_once(args: list[str], message: str) -> None:
    r = run(RUN, *args, timeout=30)
    assert r.returncode == 2
    assert message in r.stderr
