"""A real Prometheus server scrapes the web server over TLS with basic auth: the right credentials
scrape, a wrong password and plain HTTP to the TLS port are refused, as Prometheus reports them.

The server runs in this process with the real Prometheus sink over a synthetic snapshot (no kernel
needed: what is under test is TLS, auth and the exposition as Prometheus reads them).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from offcpu_exporter.sinks import SinkContext
from offcpu_exporter.sinks.prometheus.sink import PrometheusSink
from offcpu_exporter.web import Routes
from offcpu_exporter.web.options import WebOptions
from offcpu_exporter.web.server import WebServer
from testkit.prometheus_server import PrometheusServer, scrape_config
from testkit.snapshots import Builder, many_stacks, process
from testkit.tls import self_signed

PASSWORD = "correct horse"


def test_prometheus_scrapes_over_tls_with_basic_auth_and_is_refused_otherwise(tmp_path: Path) -> None:
    import bcrypt

    self_signed(tmp_path / "tls.key", tmp_path / "tls.crt")
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode()
    (tmp_path / "web.yml").write_text(
        f"tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\nbasic_auth_users:\n  prometheus: '{hashed}'\n"
    )
    (tmp_path / "right.pw").write_text(PASSWORD)
    (tmp_path / "wrong.pw").write_text("wrong")

    b = Builder()
    for pid in (101, 102):
        for i, st in enumerate(many_stacks(4)):
            b.add(process(pid, f"app{pid}"), st, 0.5 * (i + 1), count=i + 1)
    snapshot = b.snapshot()
    routes = Routes()
    ctx = SinkContext(latest=lambda: snapshot, flush_now=lambda t: snapshot, routes=routes)
    ctx.sinks.append(PrometheusSink(ctx))
    server = WebServer(routes, WebOptions(listen_address="127.0.0.1:0", config_file=str(tmp_path / "web.yml")))
    server.start()
    target = f"127.0.0.1:{server.port}"
    tls = f"    scheme: https\n    tls_config:\n      ca_file: {tmp_path / 'tls.crt'}\n"
    jobs = (
        scrape_config(
            "right",
            target,
            tls + f"    basic_auth:\n      username: prometheus\n      password_file: {tmp_path / 'right.pw'}\n",
        )
        + scrape_config(
            "wrong",
            target,
            tls + f"    basic_auth:\n      username: prometheus\n      password_file: {tmp_path / 'wrong.pw'}\n",
        )
        + scrape_config("plain", target, "    scheme: http\n")
    )
    prom = PrometheusServer(tmp_path, jobs)
    try:
        # A first scrape can time out on a loaded machine (TLS handshake plus a bcrypt check within
        # a 1 s scrape timeout): wait for the state to settle, with a deadline, then assert it.
        targets = prom.wait_targets(lambda ts: len(ts) == 3 and all(t["health"] != "unknown" for t in ts)
                                    and any(t["labels"]["job"] == "right" and t["health"] == "up" for t in ts))
        by_job = {t["labels"]["job"]: t for t in targets}
        assert by_job["right"]["health"] == "up", by_job["right"]
        assert by_job["wrong"]["health"] == "down"
        assert "401" in by_job["wrong"]["lastError"]
        assert by_job["plain"]["health"] == "down"
        at = float(prom.api("/api/v1/query", query="time()")["result"][1])
        series = prom.query('offcpu_seconds_total{job="right",reason="sleeping"}', at)
        assert {s["metric"]["pid"]: float(s["value"][1]) for s in series} == {
            "101": pytest.approx(5.0),
            "102": pytest.approx(5.0),
        }
        assert not prom.query('up{job=~"wrong|plain"} == 1', at)
    finally:
        prom.stop()
        server.stop()
