"""A real `offcpu-exporter serve` pushing to OTLP receivers on loopback while it watches workloads
with known blocking (each workload thread times its own blocking calls). The collector going down
and coming back: tests/reliability/test_outputs_down.py."""

from __future__ import annotations

import time
from collections import defaultdict

import pytest
from prometheus_client.parser import text_string_to_metric_families

from testkit.elf_lookup import gnu_build_id
from testkit.exporter import ExporterProcess
from testkit.otlp_metrics import points
from testkit.otlp_profiles import check_request, decode
from testkit.otlp_receivers import GrpcReceiver, HttpReceiver, Received
from testkit.workloads import Workload, build

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(240)]

# A binary of our own: the shared build path is rebuilt by whichever checkout's test runs first, and
# a binary replaced under a running workload cannot be symbolized ("[unknown] offcpu_workload+0x...").
NAME = "offcpu_workload_otlp"


@pytest.fixture(scope="module")
def binary():  # type: ignore[no-untyped-def]
    return build(name=NAME)


def _sleep_ns_by_thread(received: Received, pid: int, function: str = "offcpu_sleep_ms") -> dict[int, int]:
    out: dict[int, int] = defaultdict(int)
    with received.lock:
        requests = list(received.profiles)
    for request in requests:
        for s in decode(request):
            if s.resource["process.pid"] == pid and s.sample_type == "off_cpu/nanoseconds" and function in s.functions:
                out[s.attributes["thread.id"]] += s.value
    return out


def _prometheus(text: str, name: str, pid: int) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels.get("pid") == str(pid):
                out[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def _mapping_build_ids(request) -> dict[str, str]:  # type: ignore[no-untyped-def]
    d = request.dictionary
    out = {}
    for m in d.mapping_table[1:]:
        for i in m.attribute_indices:
            a = d.attribute_table[i]
            if d.string_table[a.key_strindex] == "process.executable.build_id.gnu":
                out[d.string_table[m.filename_strindex]] = a.value.string_value
    return out


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_profiles_and_metrics_match_the_workload_and_metrics_page(protocol: str, binary) -> None:  # type: ignore[no-untyped-def]
    receiver = GrpcReceiver() if protocol == "grpc" else HttpReceiver()
    with receiver, Workload("sleep", threads=2, iterations=40, interval_ms=25, binary=binary) as w:
        args = [
            "--pid",
            str(w.pid),
            "--per-thread",
            "--flush-interval",
            "1",
            "--otlp.endpoint",
            receiver.endpoint,
            "--otlp.protocol",
            protocol,
            "--otlp.interval",
            "1",
            "--otlp.headers",
            "X-Scope-OrgID=e2e",
        ]
        with ExporterProcess(args) as exp:
            w.go()
            result = w.wait()
            expected = {t.tid: t.blocked_ns for t in result.threads}
            # the workload has exited: two more flushes make its totals final
            assert receiver.received.wait_for(
                lambda r: sum(_sleep_ns_by_thread(r, w.pid).values()) >= 0.9 * sum(expected.values()),
                timeout=20,
            ), (dict(_sleep_ns_by_thread(receiver.received, w.pid)), expected, exp.log())
            time.sleep(2.5)
            page = exp.get("/metrics").decode()
        # SIGTERM: the final flush and the final metrics export happen on the way out
    got = receiver.received
    for request in got.profiles:
        check_request(request)
    assert all(h.get("x-scope-orgid") == "e2e" for h in got.headers)

    measured = _sleep_ns_by_thread(got, w.pid)
    assert set(measured) == set(expected)
    for tid, ns in expected.items():
        assert measured[tid] == pytest.approx(ns, rel=0.10), (tid, measured[tid], ns)
    switches = sum(
        s.value
        for r in got.profiles
        for s in decode(r)
        if s.sample_type == "off_cpu_switches/count" and "offcpu_sleep_ms" in s.functions
    )
    assert switches == pytest.approx(result.calls, rel=0.05)

    sample = next(s for r in got.profiles for s in decode(r) if "offcpu_sleep_ms" in s.functions)
    assert sample.resource["process.executable.name"] == NAME
    assert sample.resource["service.name"] == NAME
    leaf_user = sample.functions.index("offcpu_sleep_ms")
    assert set(sample.frame_types[:leaf_user]) == {"kernel"} and sample.frame_types[leaf_user] == "native"
    assert sample.mappings[leaf_user] == str(binary)
    # the workload's mapping carries its real GNU build id (what a backend symbolizes with)
    build_ids: dict[str, str] = {}
    for r in got.profiles:
        build_ids.update(_mapping_build_ids(r))
    assert build_ids[str(binary)] == gnu_build_id(binary)

    # metrics: the last export (at shutdown) carries the same totals as /metrics
    final = points(got.metrics[-1])
    otlp_time = {
        p.attributes["offcpu.reason"]: p.value
        for p in final
        if p.name == "offcpu.time" and p.attributes["process.pid"] == w.pid
    }
    prom_time: dict[str, float] = {}  # with --per-thread, one series per thread and reason: summed
    for k, v in _prometheus(page, "offcpu_seconds_total", w.pid).items():
        prom_time[dict(k)["reason"]] = prom_time.get(dict(k)["reason"], 0.0) + v
    assert otlp_time.keys() == prom_time.keys()
    for reason, value in prom_time.items():
        assert otlp_time[reason] == pytest.approx(value, rel=1e-6, abs=1e-9), reason
    otlp_n = sum(p.value for p in final if p.name == "offcpu.switches" and p.attributes["process.pid"] == w.pid)
    assert otlp_n == sum(_prometheus(page, "offcpu_switches_total", w.pid).values())
    stack_sum = sum(p.value for p in final if p.name == "offcpu.stack.time" and p.attributes["process.pid"] == w.pid)
    assert stack_sum == pytest.approx(sum(otlp_time.values()), rel=1e-9)
    # the process total also has the main thread's join and the exits; the sleeping stack alone:
    sleep_s = sum(
        p.value
        for p in final
        if p.name == "offcpu.stack.time" and p.attributes.get("offcpu.user_function") == "offcpu_sleep_ms"
    )
    assert sleep_s == pytest.approx(sum(expected.values()) / 1e9, rel=0.10)
