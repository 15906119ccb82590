"""Runs a real `offcpu-exporter serve` subprocess on a free loopback port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The src layout's root: on PYTHONPATH, a subprocess runs this checkout's package even where the
# virtualenv's editable install points at another checkout (a git worktree).
SOURCE_ROOT = ROOT / "exporter"
SOURCE_ENV = {"PYTHONPATH": str(SOURCE_ROOT)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ExporterProcess:
    """`with ExporterProcess(["--pid", "123"]) as exp: urllib.request.urlopen(exp.url + "/metrics")`."""

    def __init__(self, args: list[str], *, port: int | None = None, ready_timeout: float = 120.0,
                 env: dict[str, str] | None = None, scheme: str = "http") -> None:
        self.port = port or free_port()
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        self.args = [sys.executable, "-m", "offcpu_exporter", "serve", "--web.listen-address", f"127.0.0.1:{self.port}",
                     *args]
        self.ready_timeout = ready_timeout
        self.env = {**os.environ, **SOURCE_ENV, **(env or {})}
        self.proc: subprocess.Popen[str] | None = None
        self.log_path = Path(os.environ.get("OFFCPU_TEST_LOGS", "/tmp")) / f"offcpu-exporter-{self.port}.log"

    def start(self) -> ExporterProcess:
        self._log = open(self.log_path, "w")  # noqa: SIM115
        self.proc = subprocess.Popen(self.args, cwd=ROOT, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
                                     text=True)
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"exporter exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"exporter not ready within {self.ready_timeout} s:\n{self.log()}")

    def get(self, path: str, timeout: float = 30.0) -> bytes:
        with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
            return bytes(r.read())

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def wait_for_log(self, text: str, count: int = 1, timeout: float = 30.0) -> None:
        """Until `text` appears `count` times in the log: what a fixed sleep would only hope for on a
        loaded machine (a targets scan that has picked up a new process, say)."""
        deadline = time.monotonic() + timeout
        while self.log().count(text) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} not {count} times in the exporter's log in {timeout} s:\n{self.log()}")
            time.sleep(0.05)

    def log(self) -> str:
        try:
            return self.log_path.read_text()
        except OSError:
            return ""

    def __enter__(self) -> ExporterProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def parse_folded(text: str) -> dict[str, int]:
    """Folded stacks (`record --format folded`) as stack -> value, a repeated stack summed."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        stack, _, value = line.rpartition(" ")
        out[stack] = out.get(stack, 0) + int(value)
    return out
