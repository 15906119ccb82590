"""Building and running the symbolizer's test programs (tests/e2e/symbols/: real processes, real /proc)."""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from offcpu_exporter.formats import folded

SOURCES = Path(__file__).resolve().parent.parent / "tests" / "e2e" / "symbols"
READY = "ready"


def need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.fail(f"{tool} is not installed (scripts/setup --test installs it)")
    return path


def compile_c(out: Path, source: str, *flags: str, cxx: bool = False) -> Path:
    compiler = need("g++" if cxx else "gcc")
    cmd = [compiler, "-O0", "-fno-omit-frame-pointer", "-Wl,--build-id", *flags, "-o", str(out)]
    cmd.append(str(SOURCES / source))
    if not cxx:
        cmd.append("-ldl")
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    return out


@dataclass
class Program:
    """A running test program that printed `NAME 0xADDRESS` lines and `ready`."""

    proc: subprocess.Popen[bytes]
    addresses: dict[str, int] = field(default_factory=dict)
    _pending: bytes = b""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def read_until(self, word: str, timeout: float = 20.0) -> list[str]:
        assert self.proc.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while True:
            while b"\n" not in self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no {word!r} from pid {self.pid}; got {lines}")
                ready, _, _ = select.select([fd], [], [], left)
                if not ready:
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise EOFError(f"pid {self.pid} exited ({self.proc.poll()}); got {lines}")
                self._pending += chunk
            raw, self._pending = self._pending.split(b"\n", 1)
            line = raw.decode().strip()
            lines.append(line)
            parts = line.split()
            if len(parts) == 2 and parts[1].startswith("0x"):
                self.addresses[parts[0]] = int(parts[1], 16)
            if parts and parts[0] == word:
                return lines

    def command(self, line: str, until: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()
        self.read_until(until)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()
        perf_map = Path(f"/tmp/perf-{self.pid}.map")
        if perf_map.exists():
            perf_map.unlink()


def start(argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> Program:
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        bufsize=0,
        env={**os.environ, **(env or {})},
    )
    program = Program(proc)
    try:
        program.read_until(READY)
    except BaseException:
        program.stop()
        raise
    return program


class Recorder:
    """`offcpu-exporter record` in the background; ready once every pid is in the kernel filter."""

    def __init__(self, pids: list[int], duration: float) -> None:
        # Debug logging: the symbolizer says which files and debug files it used, for failure messages.
        argv = [sys.executable, "-m", "offcpu_exporter", "record", "--log.level", "debug", "--format", "folded"]
        argv += ["--duration", str(duration)]
        for pid in pids:
            argv += ["--pid", str(pid)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.stderr: list[str] = []
        self._expected = len(pids)
        self._added = 0
        self.attached = threading.Event()  # every pid is in the kernel filter (a debug log line)
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)
            if "adding target" in line:
                self._added += 1
            if "recording for" in line and self._added >= self._expected:
                self.attached.set()  # every pid in the filter, their tables built: the window begins

    def wait_attached(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.attached.wait(0.2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                pytest.fail("exporter did not attach: " + "".join(self.stderr[-20:]))

    def log_tail(self, lines: int = 40) -> str:
        return "".join(line for line in self.stderr if "offcpu_exporter.symbols" in line)[-6000:] + "".join(
            self.stderr[-lines:]
        )

    def result(self, timeout: float = 120.0) -> dict[str, int]:
        # Not communicate(): it would read stderr too, racing the reader thread.
        assert self.proc.stdout is not None
        timer = threading.Timer(timeout, self.proc.kill)
        timer.start()
        try:
            out = self.proc.stdout.read()
            self.proc.wait()
        finally:
            timer.cancel()
        self.proc.stdout.close()
        self._reader.join(5)
        assert self.proc.returncode == 0, "".join(self.stderr[-20:])
        stacks: dict[str, int] = {}
        for frames, us in folded.parse(out):
            key = ";".join(frames)
            stacks[key] = stacks.get(key, 0) + us
        return stacks


def off_cpu_us(folded: dict[str, int], comm: str, user_leaf: str) -> int:
    """Off-CPU microseconds of `comm`'s stacks whose innermost user frame is `user_leaf`, found as
    the frame right before the kernel's syscall entry."""
    total = 0
    for stack, us in folded.items():
        frames = stack.split(";")
        if frames[0] != comm:
            continue
        for i, frame in enumerate(frames[1:], 1):
            if frame.startswith("entry_SYSCALL"):
                if frames[i - 1] == user_leaf:
                    total += us
                break
    return total
