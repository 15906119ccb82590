"""A real PostgreSQL server from Debian's packages, on loopback, under pgbench: a multi-process
server under a real load generator, for truth tests against the kernel's own accounting."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from testkit.exporter import free_port

__all__ = ["PostgresServer", "postgres_bin"]

_USER = "postgres"  # initdb and the server refuse to run as root


def postgres_bin() -> Path:
    """The newest installed server's bin directory (Debian: /usr/lib/postgresql/VERSION/bin)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(p.split("/")[4]))
    if not found:
        raise RuntimeError("PostgreSQL is not installed: scripts/setup --test installs Debian's postgresql")
    return Path(found[-1]).parent


class PostgresServer:
    """`with PostgresServer() as pg: pg.pgbench(clients=8, seconds=60)`: a new cluster in a temporary
    directory, listening on 127.0.0.1 only, stopped and removed on exit."""

    def __init__(self, *, scale: int = 2) -> None:
        self.bin = postgres_bin()
        self.port = free_port()
        self.scale = scale
        self.dir = Path(tempfile.mkdtemp(prefix="offcpu-pg-"))
        self.data = self.dir / "data"
        self.pid = 0
        self._loads: list[subprocess.Popen[bytes]] = []

    def _run_as_owner(self, *args: str, timeout: float = 120.0) -> None:
        subprocess.run(["runuser", "-u", _USER, "--", *args], check=True, timeout=timeout,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=self.dir)

    def start(self) -> PostgresServer:
        shutil.chown(self.dir, _USER)
        os.chmod(self.dir, 0o700)
        self._run_as_owner(str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", _USER)
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run_as_owner(str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", options, "-l",
                           str(self.dir / "server.log"), "-w", "start")
        self.pid = int((self.data / "postmaster.pid").read_text().split()[0])
        self._run_as_owner(str(self.bin / "pgbench"), "-h", "127.0.0.1", "-p", str(self.port), "-U", _USER, "-i",
                           "-s", str(self.scale), "-q", "postgres", timeout=300)
        return self

    def pgbench(self, *, clients: int, seconds: int) -> subprocess.Popen[bytes]:
        """A pgbench run (TPC-B-like, `clients` connections: one backend process each), bounded in time."""
        load = subprocess.Popen(["runuser", "-u", _USER, "--", str(self.bin / "pgbench"), "-h", "127.0.0.1", "-p",
                                 str(self.port), "-U", _USER, "-c", str(clients), "-j", "2", "-T", str(seconds),
                                 "postgres"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.dir)
        self._loads.append(load)
        return load

    def processes(self) -> list[int]:
        """The postmaster and its children (background workers and one backend per connection)."""
        out = subprocess.run(["pgrep", "-P", str(self.pid)], capture_output=True, text=True, check=False).stdout
        return sorted([self.pid, *(int(p) for p in out.split())])

    def wait_for_backends(self, n: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        baseline = 5  # checkpointer, background writer, walwriter, autovacuum and replication launchers
        while len(self.processes()) < 1 + baseline + n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{n} backends not up within {timeout} s: {self.processes()}")
            time.sleep(0.2)

    def stop(self) -> None:
        for load in self._loads:
            with contextlib.suppress(ProcessLookupError):
                load.kill()
            load.wait()
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self._run_as_owner(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def postgres_under_load(*, clients: int, seconds: int) -> Iterator[PostgresServer]:
    with PostgresServer() as pg:
        pg.pgbench(clients=clients, seconds=seconds)
        pg.wait_for_backends(clients)
        yield pg
