"""The kernel-matrix runner itself: exit statuses, the timeout, that a broken probe fails a leg,
the kernel lines and headers run.sh resolves and boots, and the legs matrix.sh makes of --legs.

The tests that boot a guest (tests/kernels/run.sh) take ~10-40 s apiece; the others only resolve
versions from the package lists.
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


def test_a_guest_kernel_panic_is_told_apart_and_its_leg_run_once_more() -> None:
    """A guest whose kernel panics (here made to, through sysrq) is no test's failure: run.sh exits
    125, and matrix.sh runs the leg again, once, saying so; a second panic fails the leg."""
    r = run(MATRIX, "--legs", "6.1:tracepoint", "--timeout", "120", "--",
            "sh", "-c", "echo started; echo c > /proc/sysrq-trigger; sleep 60", timeout=400)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert re.findall(r"^started$", out, re.M) == ["started"] * 2, out
    assert "the guest kernel panicked; running the leg again" in out, out
    assert re.search(r"/ tracepoint: FAILED \(\d+ s; guest kernel panic, rerun\)", r.stdout), r.stdout


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
        (["--kernel", "6.1.0-57-cloud-amd64", "--", "true"], "not a Debian kernel ABI"),
        (["--headers", "6.2", "--", "true"], "not a Debian kernel ABI"),
        (["true"], "the command goes after --"),
    ],
)
def test_bad_arguments_fail_at_once(args: list[str], message: str) -> None:
    r = run(RUN, *args, timeout=30)
    assert r.returncode == 2
    assert message in r.stderr


ABI_61 = r"6\.1\.\d+-\d+-amd64"
ABI_612 = r"6\.12\.\d+\+deb\d+-amd64"
ABI_612_RT = r"6\.12\.\d+\+deb\d+-rt-amd64"


@pytest.mark.parametrize(("line", "abi"), [("6.1", ABI_61), ("6.12", ABI_612), ("6.12-rt", ABI_612_RT)])
def test_kernel_lines_resolve_to_the_abi_their_metapackage_names(line: str, abi: str) -> None:
    r = run(RUN, "--kernel", line, "--print-kernel", timeout=120)
    assert r.returncode == 0, r.stderr
    assert re.fullmatch(abi, r.stdout.strip()), r.stdout
    # An exact ABI is taken as it is, with or without the flavour's -amd64.
    exact = r.stdout.strip()
    for given in (exact, exact.removesuffix("-amd64")):
        again = run(RUN, "--kernel", given, "--print-kernel", timeout=120)
        assert again.stdout.strip() == exact, again.stdout + again.stderr
    # With --headers, the headers' ABI.
    headers = run(RUN, "--kernel", "6.12", "--headers", line, "--print-kernel", timeout=120)
    assert headers.stdout.strip() == exact, headers.stdout + headers.stderr


def test_a_guest_with_another_kernels_headers() -> None:
    """6.12-rt booted with 6.1's generic headers where bcc looks: the "headers do not match" case."""
    r = run(RUN, "--kernel", "6.12-rt", "--headers", "6.1", "--timeout", "200", "--",
            "sh", "-c", 'v=$(uname -r); echo "kernel=$v headers=$OFFCPU_GUEST_HEADERS"; '
            'readlink /lib/modules/$v/build /lib/modules/$v/source; ls /lib/modules/$v/modules.dep')
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(rf"^kernel=({ABI_612_RT}) headers=({ABI_61})$", r.stdout, re.M)
    assert m, r.stdout
    kernel, headers = m.groups()
    assert re.search(rf"^/\S+/{headers}/root/usr/src/linux-headers-{headers}$", r.stdout, re.M), r.stdout
    common = headers.removesuffix("-amd64")
    assert re.search(rf"^/\S+/{headers}/root/usr/src/linux-headers-{common}-common$", r.stdout, re.M), r.stdout
    # The modules are the booted kernel's own.
    assert f"/lib/modules/{kernel}/modules.dep" in r.stdout


def matrix_list(*legs: str) -> list[tuple[str, str, str]]:
    # The default command's interpreter: this test's own virtualenv (a worktree may have none).
    env = {**os.environ, "OFFCPU_VENV": sys.prefix}
    r = subprocess.run([str(MATRIX), "--list", *(["--legs", ",".join(legs)] if legs else [])], cwd=PROJECT,
                       capture_output=True, text=True, timeout=120, check=False, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return [tuple(line.split("\t")) for line in r.stdout.splitlines()]  # type: ignore[misc]


def test_default_legs_cover_each_kernel_line_in_both_modes_and_mismatched_headers() -> None:
    """CI's legs: 6.1 and 6.12 in both modes, 6.12 with 6.1's headers, the host, and 6.12-rt in
    tracepoint mode with its RT tests alone; its kprobe and full legs run on demand (matrix.sh's
    RT_LEGS, docs/kernel-matrix.md)."""
    legs = {name: (selection, command) for name, selection, command in matrix_list()}
    names = "\n".join(legs)
    rt = sorted(n for n in legs if "-rt-amd64" in n)
    modes = [m.group(1) for n in rt if (m := re.fullmatch(rf"kernel {ABI_612_RT} / (\w+)", n))]
    assert len(rt) == 1 and modes == ["tracepoint"], names
    for rt_leg in rt:
        assert legs.pop(rt_leg)[0] == "rt", names
    legs.update({name: (selection, command) for name, selection, command in
                 matrix_list("6.12-rt:kprobe", "6.12-rt:tracepoint")})
    for abi in (ABI_61, ABI_612, ABI_612_RT):
        for mode, selection in (("kprobe", "hook"), ("tracepoint", "kernel")):
            name = next((n for n in legs if re.fullmatch(rf"kernel {abi} / {mode}", n)), None)
            assert name, names
            assert legs[name][0] == selection
    mismatched = [n for n in legs if re.fullmatch(rf"kernel {ABI_612} / kprobe \(headers {ABI_61}\)", n)]
    assert len(mismatched) == 1, names
    assert legs[mismatched[0]][0] == "truth"
    host = [n for n in legs if n.endswith(" / tracepoint") and not re.search(r"-amd64 /", n)]
    assert len(host) == 1 and legs[host[0]][0] == "all", names
    # RT tests only on the RT kernel's legs.
    for name, (_, command) in legs.items():
        assert ("or rt_kernel" in command.replace("\\", "")) == ("-rt-amd64" in name), (name, command)
    # tests=rt: the RT kernel's own tests alone.
    [(_, selection, command)] = matrix_list("6.12-rt:kprobe:tests=rt")
    assert selection == "rt" and "-m ((rt_kernel) and not cpu_clock_truth) or rt_kernel tests/" in command.replace(
        "\\", ""), command


def test_leg_syntax() -> None:
    legs = matrix_list("kprobe", "6.12-rt:tracepoint:tests=truth", "6.12:kprobe:headers=6.1:tests=all")
    assert [(re.sub(r"\d+\S*amd64", "V", n), s) for n, s, _ in legs] == [
        ("kernel V / kprobe", "hook"),  # a bare mode: --kernel's kernel, 6.1 by default
        ("kernel V / tracepoint", "truth"),
        ("kernel V / kprobe (headers V)", "all"),
    ]
    assert re.fullmatch(rf"kernel {ABI_61} / kprobe", legs[0][0])
    command = legs[1][2].replace("\\", "")
    # On the RT kernel the tests whose truth is the CPU clock are left out (docs/kernel-matrix.md).
    assert "-m ((kernel_truth) and not cpu_clock_truth) or rt_kernel tests/e2e/test_probe.py" in command, command


@pytest.mark.parametrize(
    ("legs", "message"),
    [
        ("6.12", "expected KERNEL:MODE"),
        ("6.12:fentry", "the mode must be kprobe or tracepoint"),
        ("6.12:kprobe:header=6.1", "unknown option 'header=6.1'"),
        ("6.12:kprobe:tests=most", "unknown selection 'most'"),
        ("latest:kprobe", "cannot resolve the kernel 'latest'"),
    ],
)
def test_bad_legs_fail_at_once(legs: str, message: str) -> None:
    r = run(MATRIX, "--legs", legs, "--list", timeout=60)
    assert r.returncode == 2
    assert message in r.stderr
