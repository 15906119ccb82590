"""`serve --drop-privileges` as the Helm chart runs it (every process, pod names from the Kubernetes
API) leaves no thread with more than the capabilities kept.

Capabilities are per thread in Linux: capset(2) and PR_CAPBSET_DROP change only the calling thread.
A thread started before the drop (the Kubernetes metadata watch, the web server, the pipeline, the
unwind-table describer, the outputs and gRPC's own threads) would keep everything it started with.
The real exporter runs against the fake API server of testkit, with OTLP pushes to a loopback
receiver so the output and gRPC threads exist too, and every thread in /proc/PID/task is read.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from offcpu_exporter.privileges import CAP_NAMES, kept_after_attach
from testkit.exporter import ExporterProcess
from testkit.kubernetes_api import FakeApi, pod
from testkit.otlp_receivers import GrpcReceiver

pytestmark = pytest.mark.kernel


def _status(pid: int, tid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/task/{tid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def _names(mask: str) -> set[str]:
    value = int(mask, 16)
    return {CAP_NAMES.get(b, str(b)) for b in range(64) if value >> b & 1}


@pytest.fixture
def api(tmp_path: Path) -> Iterator[FakeApi]:
    fake = FakeApi(tmp_path, [pod("dde1244b-5bb5-4297-b544-85f3bc0d80bf", "shop", "web-0", {"ab" * 32: "web"})])
    yield fake
    fake.close()


def test_every_thread_holds_only_the_kept_capabilities(api: FakeApi) -> None:
    with GrpcReceiver() as receiver, ExporterProcess(
            ["--all", "--drop-privileges", "--flush-interval", "1s", "--otlp.endpoint", receiver.endpoint,
             "--otlp.interval", "1s", "--kubernetes.service-account-dir", str(api.service_account)],
            env=api.environ) as exporter:
        assert exporter.proc is not None
        pid = exporter.proc.pid
        # Every thread there is to start: ready (so the metadata watch has started), and OTLP has pushed.
        deadline = time.monotonic() + 60
        while not (api.requests and receiver.received.metrics):
            assert time.monotonic() < deadline, exporter.log()
            time.sleep(0.2)
        expected = {k.name for k in kept_after_attach(exporter.port)} & _names(_status(pid, pid)["CapPrm"])
        assert "CAP_BPF" not in expected and "CAP_PERFMON" not in expected  # on this 6.x kernel
        threads = {int(t.name): (t / "comm").read_text().strip() for t in Path(f"/proc/{pid}/task").iterdir()}
        assert len(threads) >= 5, threads  # main, metadata watch, web, pipeline, OTLP (+ gRPC's own)
        wrong = {}
        for tid in threads:
            status = _status(pid, tid)
            sets = {name: _names(status[name]) for name in ("CapEff", "CapPrm", "CapBnd")}
            if any(s != expected for s in sets.values()) or int(status["CapInh"], 16) or int(status["CapAmb"], 16) \
                    or status["NoNewPrivs"].strip() != "1":
                wrong[tid] = {k: status[k] for k in ("CapEff", "CapPrm", "CapBnd", "CapInh", "CapAmb", "NoNewPrivs")}
        assert not wrong, (f"threads keeping more than {sorted(expected)}: {wrong}", threads)
        # The watch thread, started after the drop, still reaches the API server.
        while not any(r["query"].get("watch") for r in api.requests):
            assert time.monotonic() < deadline, exporter.log()
            time.sleep(0.2)
        assert "Traceback" not in exporter.log(), exporter.log()
