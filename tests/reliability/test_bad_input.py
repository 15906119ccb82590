"""Bad input: unknown and exited pids, bad options, unreadable /proc entries, hostile process
names, corrupt ELF files, hostile symlinks in a container root, secrets in command lines. Clear
errors, no crash, nothing lost for the healthy targets."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from offcpu_exporter.symbols.elf import ElfFormatError, read_elf
from offcpu_exporter.symbols.rootfs import resolve_in_root
from offcpu_exporter.targets import ProcessTable, TargetRules
from testkit.exporter import ROOT, ExporterProcess
from testkit.metrics_page import label_sets, total
from testkit.workloads import Workload, build


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "offcpu_exporter", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


def _one_error_line(stderr: str, message: str) -> bool:
    """One `offcpu-exporter: error:` line holding the message (other lines are ordinary logging)."""
    errors = [line for line in stderr.splitlines() if line.startswith("offcpu-exporter: error:")]
    return len(errors) == 1 and message in errors[0] and "Traceback" not in stderr


def _exited_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


# -- start-up -------------------------------------------------------------------------------


def test_serve_with_only_unknown_or_exited_pids_is_a_one_line_error() -> None:
    r = _run("serve", "--pid", str(_exited_pid()), "--web.listen-address", "127.0.0.1:0")
    assert r.returncode == 2, r
    assert _one_error_line(r.stderr, "does not exist"), r.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["serve", "--cmdline", "[a-"], "invalid regular expression"),
    (["serve", "--comm", "(?P<x"], "invalid regular expression"),
    (["serve", "--max-counters", "0"], "must be positive"),
    (["serve", "--stack-storage-size", "many"], "invalid integer"),
    (["serve", "--exited-grace", "-1"], "--exited-grace"),
    (["serve", "--web.listen-address", "127.0.0.1"], "expected host:port"),
])
def test_more_bad_flags(args: list[str], message: str) -> None:
    r = _run(*args)
    assert r.returncode == 2, r
    assert _one_error_line(r.stderr, message), r.stderr
    assert "probe attached" not in r.stderr  # refused before anything was loaded


@pytest.mark.parametrize(("text", "message"), [
    ("max-counters: -5\n", "must be positive"),
    ("exited-grace: [1]\n", "expected a single value"),
    ("per-thread: 3\n", "expected true or false"),
    ("cmdline: '[a-'\n", "invalid regular expression"),
    ("stack-storage-size: 1.5\n", "invalid integer"),
    ("comm: {a: 1}\n", "expected a single value"),
])
def test_more_config_files_with_wrong_types(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "c.yml"
    path.write_text(text)
    r = _run("serve", "--config.file", str(path))
    assert r.returncode == 2, r
    assert _one_error_line(r.stderr, message), r.stderr


@pytest.mark.kernel
def test_a_dead_pid_among_live_ones_is_reported_and_the_live_one_is_counted() -> None:
    dead = _exited_pid()
    with Workload("sleep", iterations=30, interval_ms=20) as w, \
            ExporterProcess(["--pid", str(dead), "--pid", str(w.pid), "--flush-interval", "0.3"]) as exp:
        time.sleep(0.5)
        w.go()
        result = w.wait()
        time.sleep(1.0)
        text = exp.get("/metrics").decode()
        log = exp.log()
    assert [line for line in log.splitlines() if f"pid {dead} does not exist" in line], log
    measured = total(text, "offcpu_stack_seconds_total", pid=str(w.pid), user_function="offcpu_sleep_ms")
    assert measured == pytest.approx(result.blocked_ns / 1e9, rel=0.05)


# -- /proc entries that cannot be read --------------------------------------------------------


def _proc(root: Path, pid: int, comm: str, start: int = 1) -> Path:
    d = root / str(pid)
    d.mkdir()
    (d / "stat").write_text(f"{pid} ({comm}) S 1 " + " ".join(["0"] * 17) + f" {start} 0 0\n")
    (d / "status").write_text(f"Tgid:\t{pid}\n")
    (d / "cmdline").write_bytes(f"{comm}\0--flag\0".encode())
    return d


def test_unreadable_and_garbled_proc_entries_are_skipped(tmp_path: Path) -> None:
    _proc(tmp_path, 10, "app")
    broken = {
        11: lambda d: ((d / "stat").unlink(), (d / "stat").mkdir()),  # EISDIR
        12: lambda d: (d / "stat").write_text("garbage without parentheses"),
        13: lambda d: (d / "stat").write_text("13 (app) S"),  # truncated
        14: lambda d: (d / "stat").write_bytes(b"14 (app\xff\xfe) S 1 " + b"0 " * 17 + b"x 0 0"),  # bad start
        15: lambda d: ((d / "status").unlink(), (d / "cmdline").unlink(), (d / "stat").unlink()),
        16: lambda d: (d / "cmdline").unlink(),  # stat fine, cmdline gone: still matched by comm
        17: lambda d: os.symlink("/nonexistent", d / "exe"),  # dangling exe link
    }
    for pid, spoil in broken.items():
        spoil(_proc(tmp_path, pid, "app"))
    (tmp_path / "self").mkdir()  # not a pid
    table = ProcessTable(TargetRules(comm=re.compile("^app$"), cmdline=re.compile("--nothing")),
                         proc_root=str(tmp_path))
    added, exited = table.refresh()
    assert sorted(p.pid for p in added) == [10, 16, 17]
    assert exited == []
    pinned = ProcessTable(TargetRules(pids=(10, 11, 12, 15)), proc_root=str(tmp_path))
    problems = pinned.start()
    assert len(problems) == 3 and pinned.watched_pids() == {10}
    # An entry that turns unreadable while watched counts as exited, not as a crash.
    (tmp_path / "10" / "stat").unlink()
    _, exited = pinned.refresh()
    assert [p.pid for p in exited] == [10]


# -- hostile process names ------------------------------------------------------------------

HOSTILE = b'a\nb"c\\d{e\xffz}'  # newline, quote, backslash, brace, a non-UTF-8 byte (13 of 15 bytes)


@pytest.mark.kernel
def test_a_hostile_process_name_is_escaped_in_the_exposition_and_in_the_log(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: scripts/setup --test installs Debian's prometheus package"
    code = ("import sys, time\n"
            f"open('/proc/self/comm', 'wb').write({HOSTILE!r})\n"
            "print('ready', flush=True); sys.stdin.readline()\n"
            "for _ in range(50): time.sleep(0.01)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None and proc.stdout.readline().startswith("ready")
        with Path(f"/proc/{proc.pid}/comm").open("rb") as f:
            assert f.read().rstrip(b"\n") == HOSTILE
        with ExporterProcess(["--comm", r"c\\d\{e", "--flush-interval", "0.3"]) as exp:
            deadline = time.monotonic() + 10
            while str(proc.pid) not in exp.get("/metrics").decode() and time.monotonic() < deadline:
                time.sleep(0.2)
            proc.stdin.write("go\n")
            proc.stdin.flush()
            proc.wait(10)
            time.sleep(0.8)
            text = exp.get("/metrics").decode()
            log = exp.log()
    finally:
        proc.kill()
    want = HOSTILE.decode("utf-8", "replace")
    comms = {s["comm"] for s in label_sets(text, "offcpu_seconds_total") if s.get("pid") == str(proc.pid)}
    assert comms == {want}, comms
    assert total(text, "offcpu_seconds_total", pid=str(proc.pid)) > 0.4  # 50 x 10 ms asleep
    r = subprocess.run([promtool, "check", "metrics"], input=text.encode(), capture_output=True, timeout=60)
    assert r.returncode == 0, (r.stdout + r.stderr).decode()
    # The log names it on one line: the newline inside the name is escaped.
    lines = [line for line in log.splitlines() if f"[{proc.pid}]" in line]
    assert lines and all(r"a\nb" in line for line in lines), log


def test_log_formatter_escapes_control_characters() -> None:
    import json
    import logging

    from offcpu_exporter.logfmt import JsonFormatter, LogfmtFormatter

    record = logging.LogRecord("x", logging.INFO, __file__, 1, "process %s started", ("evil\nFAKE ERROR\r\x1b[31m",),
                               None)
    line = LogfmtFormatter().format(record)
    assert "\n" not in line and "\r" not in line and "\x1b" not in line
    assert line.endswith(r' level=info source=x msg="process evil\nFAKE ERROR\r\x1b[31m started"'), line
    line = JsonFormatter().format(record)
    assert "\n" not in line and "\r" not in line and "\x1b" not in line
    assert json.loads(line)["msg"] == "process evil\nFAKE ERROR\r\x1b[31m started"


# -- container roots ------------------------------------------------------------------------


def test_hostile_symlinks_never_leave_the_container_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    (root / "lib").mkdir(parents=True)
    (root / "etc").mkdir()
    outside.mkdir()
    (outside / "secret.so").write_text("host file")
    (root / "etc" / "secret.so").write_text("container file")
    (root / "lib" / "ok.so").write_text("library")
    os.symlink(str(outside), root / "abs")  # absolute link: the host's directory if followed naively
    os.symlink("../../../../../../" + str(outside).lstrip("/"), root / "rel")  # climbs above the root
    os.symlink("/abs/secret.so", root / "lib" / "chain.so")  # a chain through an absolute link
    os.symlink("loop", root / "loop")
    os.symlink(str(outside / "secret.so"), root / "lib" / "direct.so")
    r = str(root)
    assert resolve_in_root(r, "/lib/ok.so") == f"{r}/lib/ok.so"
    for path in ("/abs/secret.so", "/rel/secret.so", "/lib/chain.so", "/lib/direct.so", "/../outside/secret.so",
                 "/loop"):
        got = resolve_in_root(r, path)
        assert got is None or (got.startswith(r + "/") and Path(got).read_text() != "host file"), (path, got)
    # Re-anchored at the container's root, an absolute link means the container's own path.
    os.symlink("/etc/secret.so", root / "lib" / "anchored.so")
    assert resolve_in_root(r, "/lib/anchored.so") == f"{r}/etc/secret.so"


# -- corrupt ELF files ----------------------------------------------------------------------

_ELF_SEED = build(name="offcpu_workload").read_bytes()


@settings(max_examples=150, deadline=2000, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(st.lists(st.tuples(st.integers(0, 4095), st.integers(0, 255)), min_size=1, max_size=16),
       st.integers(64, len(_ELF_SEED)))
def test_corrupt_headers_and_truncation_give_format_errors_only(flips: list[tuple[int, int]], cut: int) -> None:
    """The ELF reader on a real binary with bytes of its headers flipped and its tail cut: a
    parsed result or ElfFormatError, never another exception, a hang or a huge allocation (150
    examples, derandomized so a run is bounded and repeatable)."""
    data = bytearray(_ELF_SEED[:cut])
    for offset, value in flips:
        if offset < len(data):
            data[offset] = value
    try:
        info = read_elf(io.BytesIO(bytes(data)), len(data))
    except ElfFormatError:
        return
    for table in (info.symtab, info.dynsym):
        if table is not None:
            assert len(table.entries) <= len(data)  # never more symbols than the bytes can hold
