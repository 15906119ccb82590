"""The web server's own counters reach /metrics of the real exporter: a request the parser refuses,
and a changed --web.config.file read again (a broken one counted as a failure, the last good users
still in force; a good one counted as a success, the new users in force)."""

from __future__ import annotations

import base64
import os
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from testkit.exporter import ExporterProcess
from testkit.metrics_page import total
from testkit.web_client import raw_exchange, users_yaml

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(180)]


def _get(exp: ExporterProcess, path: str, user: str, password: str) -> tuple[int, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    request = urllib.request.Request(exp.url + path, headers={"Authorization": f"Basic {token}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""


def _until(exp: ExporterProcess, user: str, password: str, name: str, want: float, **labels: str) -> str:
    deadline = time.monotonic() + 30
    while True:
        status, text = _get(exp, "/metrics", user, password)
        if status == 200 and total(text, name, **labels) == want:
            return text
        assert time.monotonic() < deadline, (status, name, labels, text[-2000:])
        time.sleep(0.2)


def test_bad_requests_and_web_config_reloads_are_counted_on_metrics(tmp_path: Path) -> None:
    config = tmp_path / "web.yml"
    config.write_text("{}\n")  # no users yet: the test harness's readiness check needs no password
    with ExporterProcess(["--pid", str(os.getpid()), "--web.config.file", str(config)]) as exp:
        config.write_text(users_yaml({"prometheus": "first"}))
        text = _until(exp, "prometheus", "first", "offcpu_exporter_web_config_reloads_total", 1, result="success")
        assert total(text, "offcpu_exporter_http_bad_requests_total") == 0
        assert total(text, "offcpu_exporter_web_config_reloads_total", result="failure") == 0
        assert _get(exp, "/metrics", "prometheus", "second")[0] == 401

        assert raw_exchange(exp.port, b"GET /metrics HTTP/1.1\r\nHo(st: x\r\n\r\n").startswith(b"HTTP/1.1 400")
        _until(exp, "prometheus", "first", "offcpu_exporter_http_bad_requests_total", 1)

        config.write_text("basic_auth_users: [not, a, mapping\n")
        _until(exp, "prometheus", "first", "offcpu_exporter_web_config_reloads_total", 1, result="failure")
        assert _get(exp, "/metrics", "prometheus", "second")[0] == 401

        config.write_text(users_yaml({"prometheus": "second"}))
        _until(exp, "prometheus", "second", "offcpu_exporter_web_config_reloads_total", 2, result="success")
        assert _get(exp, "/metrics", "prometheus", "first")[0] == 401
        assert "web config" in exp.log()
