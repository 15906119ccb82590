"""Builds and runs the programs of tests/workloads/ (offcpu_workload.c by default): processes with known
blocking."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).resolve().parent.parent / "tests" / "workloads" / "offcpu_workload.c"
WORKLOAD_COMM = SOURCE.stem  # the comm of its processes and threads (build() names the binary so)
_BUILD_DIR = Path(os.environ.get("OFFCPU_TEST_BUILD", Path(tempfile.gettempdir()) / "offcpu-test-build"))


def build(source: Path = SOURCE, name: str | None = None, extra_flags: tuple[str, ...] = ()) -> Path:
    """Compile once per source content and flags (cached in a temp dir, which also works with the
    read-only checkout of the kernel-matrix guest; checkouts of different versions do not mix)."""
    _BUILD_DIR.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha1(source.read_bytes() + " ".join(extra_flags).encode()).hexdigest()[:12]
    # The file name is the process's comm (15 characters at most): keep the stem first.
    out = _BUILD_DIR / digest / (name or source.stem)
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".tmp{os.getpid()}")
        subprocess.run(
            ["gcc", "-O0", "-g", "-fno-omit-frame-pointer", "-pthread", *extra_flags, "-o", str(tmp),
             str(source)],
            check=True,
        )
        tmp.replace(out)
    return out


@dataclass
class ThreadResult:
    tid: int
    function: str
    blocked_ns: int
    calls: int
    blocked_off_ns: int  # the part of blocked_ns spent off CPU (minus the thread's CPU time in the calls)
    wall_ns: int
    oncpu_ns: int
    # Measured by offcpu_workload.c only:
    blocks: int = 0  # calls that had to wait: each left the CPU once (a pipe byte already there does not)
    runq_ns: int = 0
    switches: int = 0  # times switched in between the two schedstat reads (schedstat field 3)
    opened_ns: int = 0  # CLOCK_MONOTONIC when its measured window opened, right before its first block
    hist: list[int] = field(default_factory=list)  # blocking calls per duration slot (sleep mode), as offcpu.h
    name: str = ""  # the thread's name, where the workload sets one (wait_sites.c)


@dataclass
class WorkloadResult:
    pid: int
    mode: str
    iterations: int
    interval_ms: int
    wall_ns: int
    threads: list[ThreadResult]
    joined_ns: int = 0  # CLOCK_MONOTONIC when the main thread went to join its threads

    @property
    def blocked_ns(self) -> int:
        return sum(t.blocked_ns for t in self.threads)

    @property
    def blocked_off_ns(self) -> int:
        return sum(t.blocked_off_ns for t in self.threads)

    @property
    def calls(self) -> int:
        return sum(t.calls for t in self.threads)


class Workload:
    """A started workload. With `wait_go` (default) it prints its pid and waits for `go()`."""

    def __init__(self, mode: str, *, threads: int = 1, iterations: int = 50, interval_ms: int = 20,
                 wait_go: bool = True, binary: Path | None = None) -> None:
        self.binary = binary or build()
        args = [str(self.binary), mode, "--threads", str(threads), "--iterations", str(iterations),
                "--interval-ms", str(interval_ms)]
        if wait_go:
            args.append("--wait-go")
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.pid = self.proc.pid
        self._waiting = wait_go
        if wait_go:
            assert self.proc.stdout is not None
            line = self.proc.stdout.readline().split()
            if line[:1] != ["ready"]:
                raise RuntimeError(f"workload did not start: {line!r}")

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def wait(self, timeout: float = 120) -> WorkloadResult:
        out, _ = self.proc.communicate(timeout=timeout)
        if self.proc.returncode != 0:
            raise RuntimeError(f"workload exited with {self.proc.returncode}")
        data: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        threads = [ThreadResult(**t) for t in data.pop("threads")]
        return WorkloadResult(threads=threads, **data)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> Workload:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
