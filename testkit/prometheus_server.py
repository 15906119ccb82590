"""A Prometheus server from Debian's package on loopback, for end-to-end tests."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from testkit.exporter import free_port

__all__ = ["SCRAPE_INTERVAL_S", "PrometheusServer", "scrape_config"]

SCRAPE_INTERVAL_S = 1


def scrape_config(job: str, target: str, extra: str = "") -> str:
    """One scrape_configs entry (YAML, indented for the list); `extra` lines are job-level keys."""
    return f"  - job_name: {job}\n{extra}    static_configs:\n      - targets: ['{target}']\n"


class PrometheusServer:
    def __init__(self, tmp: Path, scrape_configs: str) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail("prometheus not found: scripts/setup --test installs Debian's prometheus package")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = tmp / "prometheus.yml"
        config.write_text(
            "global:\n"
            f"  scrape_interval: {SCRAPE_INTERVAL_S}s\n"
            f"  scrape_timeout: {SCRAPE_INTERVAL_S}s\n"
            "scrape_configs:\n" + scrape_configs
        )
        self.log_path = tmp / "prometheus.log"
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}" if params else self.url + path
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, promql: str, at: float) -> list[dict[str, Any]]:
        return list(self.api("/api/v1/query", query=promql, time=f"{at:.3f}")["result"])

    def value(self, promql: str, at: float) -> float:
        result = self.query(promql, at)
        assert len(result) == 1, (promql, result)
        return float(result[0]["value"][1])

    def targets(self) -> list[dict[str, Any]]:
        return list(self.api("/api/v1/targets")["activeTargets"])

    def wait_targets(self, done: Callable[[list[dict[str, Any]]], bool], timeout: float = 60.0) -> list[Any]:
        """Poll /api/v1/targets (not a sleep) until `done` says so."""
        deadline = time.monotonic() + timeout
        last: list[Any] = []
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.log_path.read_text()}")
            try:
                last = self.targets()
                if last and done(last):
                    return last
            except OSError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"targets not as expected within {timeout} s: {last}")

    def wait_target_up(self, timeout: float = 60.0) -> None:
        self.wait_targets(lambda ts: all(t["health"] == "up" for t in ts), timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
