from __future__ import annotations

import random
from collections import defaultdict

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from offcpu_exporter import __version__
from offcpu_exporter.series.selection import Selection
from offcpu_exporter.sinks.otlp.metrics import OffcpuMetrics
from offcpu_exporter.sinks.prometheus.collector import OffCPUCollector
from offcpu_exporter.snapshot import Counter, Frame, FrameKind, ProcessInfo, ProcessKey, Reason, Snapshot, Stack
from testkit.otlp_metrics import points, resource_of
from testkit.otlp_receivers import GrpcReceiver, HttpReceiver
from testkit.otlp_sink import sink_from_args
from testkit.snapshots import APP, DB, snapshot_of, two_process_snapshot

pytestmark = pytest.mark.timeout(60)


def _stack(i: int) -> Stack:
    return Stack(user=(Frame(f"fn{i}", FrameKind.NATIVE, "/bin/x", i),), kernel=(Frame("schedule", FrameKind.KERNEL),))


def _prometheus_rows(snapshot: Snapshot, selection: Selection) -> dict[tuple[str, ...], float]:
    reg = CollectorRegistry()
    reg.register(OffCPUCollector(lambda: snapshot, lambda: [], selection, bcc="test"))
    out: dict[tuple[str, ...], float] = {}
    for family in text_string_to_metric_families(generate_latest(reg).decode()):
        for sample in family.samples:
            labels = sample.labels
            if sample.name in ("offcpu_seconds_total", "offcpu_switches_total"):
                out[(sample.name, labels["pid"], labels["reason"])] = sample.value
            elif sample.name in ("offcpu_stack_seconds_total", "offcpu_stack_switches_total"):
                out[(sample.name, labels["pid"], labels["stack_id"])] = sample.value
    return out


def _otlp_rows(metrics: OffcpuMetrics) -> dict[tuple[str, ...], float]:
    rows = metrics.rows()
    out: dict[tuple[str, ...], float] = {}
    for name, observations, key in (
        ("offcpu_seconds_total", rows.process_time, "offcpu.reason"),
        ("offcpu_switches_total", rows.process_switches, "offcpu.reason"),
        ("offcpu_stack_seconds_total", rows.stack_time, "offcpu.stack_id"),
        ("offcpu_stack_switches_total", rows.stack_switches, "offcpu.stack_id"),
    ):
        for o in observations:
            assert o.attributes is not None
            pid = str(o.attributes.get("process.pid", "other"))
            out[(name, pid, str(o.attributes[key]))] = o.value
    return out


def test_same_series_as_prometheus_over_a_changing_workload() -> None:
    """Stacks appear, grow at changing rates and overtake each other; processes come and go, more
    than --max-processes of them. Both outputs, each with its own Selection fed the same snapshots,
    export the same series with the same values at every step, and every OTLP series only grows."""
    rng = random.Random(7)
    procs = [ProcessInfo(key=ProcessKey(100 + i, i), comm=f"p{i}", exe=f"/usr/bin/p{i}") for i in range(5)]
    totals: dict[tuple[int, int], Counter] = defaultdict(Counter)
    current: list[Snapshot] = []
    metrics = OffcpuMetrics(lambda: current[-1], top_stacks=3, max_processes=3)
    prom_selection = Selection(max_processes=3, top_stacks=3)
    previous: dict[tuple[str, ...], float] = {}
    for seq in range(1, 40):
        live_procs = procs[: min(5, 1 + seq // 4)]
        rows = []
        for p in live_procs:
            for i in range(min(8, 2 + seq // 3)):
                inc = Counter(rng.randint(0, 3), rng.randint(0, 10**9) * (i + 1) * rng.choice((1, 1, 5)))
                totals[(p.pid, i)] = totals[(p.pid, i)] + inc
                rows.append((p, 0, "", Reason.SLEEPING, _stack(i), totals[(p.pid, i)], inc))
        current.append(snapshot_of(rows, sequence=seq))
        otlp = _otlp_rows(metrics)
        prom = _prometheus_rows(current[-1], prom_selection)
        assert otlp.keys() == prom.keys()
        for key, value in prom.items():
            assert otlp[key] == pytest.approx(value, rel=1e-12, abs=1e-12), key
        for key, value in previous.items():
            if key in otlp:
                assert otlp[key] >= value - 1e-9, key
        previous = otlp
        # sum-exact: stacks of a process add up to the process
        for pid in {k[1] for k in otlp}:
            stacks = sum(v for k, v in otlp.items() if k[0] == "offcpu_stack_seconds_total" and k[1] == pid)
            procs_s = sum(v for k, v in otlp.items() if k[0] == "offcpu_seconds_total" and k[1] == pid)
            assert stacks == pytest.approx(procs_s, rel=1e-9)
    assert any(k[1] == "other" for k in previous), "no process was folded"
    assert any(k[2] == "other" and k[1] != "other" and v > 0 for k, v in previous.items()), "no stack was folded"


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_metrics_carry_the_snapshot_totals(protocol: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=ci,service.namespace=perf")
    snap = two_process_snapshot(sequence=5)
    receiver = GrpcReceiver() if protocol == "grpc" else HttpReceiver()
    with receiver:
        sink = sink_from_args(
            [
                "--otlp.endpoint",
                receiver.endpoint,
                "--otlp.protocol",
                protocol,
                "--no-otlp.profiles",
                "--otlp.interval",
                "0.3",
                "--otlp.top-stacks",
                "2",
                "--otlp.headers",
                "X-Scope-OrgID=t1",
            ],
            latest=lambda: snap,
        )
        assert receiver.received.wait_for(lambda r: any(points(m) for m in r.metrics), timeout=15)
        sink.close(5)
    request = next(m for m in receiver.received.metrics if points(m))
    resource = resource_of(request)
    assert resource["service.name"] == "offcpu-exporter"
    assert resource["service.version"] == __version__
    assert resource["host.name"] == "test-host"
    assert resource["deployment.environment.name"] == "ci" and resource["service.namespace"] == "perf"
    assert all(h.get("x-scope-orgid") == "t1" for h in receiver.received.headers)
    assert sink.stats.get("metrics_sent") >= 1

    pts = points(request)
    assert {p.name: p.unit for p in pts} == {
        "offcpu.time": "s",
        "offcpu.switches": "{switch}",
        "offcpu.stack.time": "s",
        "offcpu.stack.switches": "{switch}",
    }
    assert all(p.monotonic and p.cumulative for p in pts)
    by_name: dict[str, dict[tuple, float]] = defaultdict(dict)
    for p in pts:
        by_name[p.name][tuple(sorted(p.attributes.items()))] = p.value

    for key, view in snap.processes.items():
        reasons = {dict(a)["offcpu.reason"] for a in by_name["offcpu.time"] if dict(a)["process.pid"] == key.pid}
        assert reasons == {"runnable", "sleeping", "uninterruptible", "other", "stolen"}  # zeros too, as /metrics
        switched = {dict(a)["offcpu.reason"] for a in by_name["offcpu.switches"] if dict(a)["process.pid"] == key.pid}
        assert switched == reasons - {"stolen"}  # time lost without a switch has no switches
        for reason, counter in view.by_reason.items():
            (value,) = [
                v
                for attrs, v in by_name["offcpu.time"].items()
                if dict(attrs)["process.pid"] == key.pid and dict(attrs)["offcpu.reason"] == reason.label
            ]
            assert value == pytest.approx(counter.ns / 1e9)
        stack_ns = sum(v for a, v in by_name["offcpu.stack.time"].items() if dict(a)["process.pid"] == key.pid)
        stack_n = sum(v for a, v in by_name["offcpu.stack.switches"].items() if dict(a)["process.pid"] == key.pid)
        assert stack_ns == pytest.approx(view.total.ns / 1e9)
        assert stack_n == view.total.count

    app_stacks = [dict(a) for a in by_name["offcpu.stack.time"] if dict(a)["process.pid"] == APP.pid]
    assert len(app_stacks) == 3  # top 2 + other
    other = next(a for a in app_stacks if a["offcpu.stack_id"] == "other")
    assert other["offcpu.user_function"] == other["offcpu.kernel_function"] == "other"
    named = [a for a in app_stacks if a["offcpu.stack_id"] != "other"]
    assert {a["offcpu.user_function"] for a in named} == {"offcpu_sleep_ms", "offcpu_pipe_read"}
    assert {a["offcpu.kernel_function"] for a in named} == {"do_nanosleep", "pipe_read"}
    app_attrs = next(dict(a) for a in by_name["offcpu.time"] if dict(a)["process.pid"] == APP.pid)
    assert app_attrs["k8s.pod.name"] == "app-7d9f" and app_attrs["process.executable.name"] == "app"
    db_attrs = next(dict(a) for a in by_name["offcpu.time"] if dict(a)["process.pid"] == DB.pid)
    assert "k8s.pod.name" not in db_attrs


def test_env_service_name_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    from offcpu_exporter.sinks.otlp.metrics import exporter_resource

    monkeypatch.setenv("OTEL_SERVICE_NAME", "offcpu-node-a")
    assert exporter_resource("h").attributes["service.name"] == "offcpu-node-a"
    monkeypatch.delenv("OTEL_SERVICE_NAME")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "host.name=node-7")
    assert exporter_resource("h").attributes["host.name"] == "node-7"


def test_limit_messages_name_the_otlp_flags(caplog: pytest.LogCaptureFixture) -> None:
    """The selection is shared with Prometheus; what an OTLP user is told to raise is an OTLP flag."""
    procs = [ProcessInfo(key=ProcessKey(100 + i, i), comm=f"p{i}") for i in range(3)]
    rows = [(p, 0, "", Reason.SLEEPING, _stack(i), Counter(1, 10**9), Counter(1, 10**9))
            for p in procs for i in range(3)]
    snapshot = snapshot_of(rows, sequence=1)
    metrics = OffcpuMetrics(lambda: snapshot, top_stacks=1, max_processes=2)
    with caplog.at_level("INFO", logger="offcpu_exporter.series.selection"):
        metrics.rows()
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "--otlp.max-processes=2" in messages and "--otlp.top-stacks=1" in messages
    assert "--prometheus" not in messages
