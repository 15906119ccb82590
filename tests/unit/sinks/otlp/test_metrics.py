from __future__ import annotations

import random
from collections import defaultdict

import pytest

from exporter import __version__
from exporter.sinks.otlp.metrics import StackSelection
from exporter.snapshot import Counter, Frame, FrameKind, Reason, Stack
from tests.support.otlp_metrics import points, resource_of
from tests.support.otlp_receivers import GrpcReceiver, HttpReceiver
from tests.support.otlp_sink import sink_from_args
from tests.support.synthetic_snapshots import APP, DB, snapshot_of, two_process_snapshot

pytestmark = pytest.mark.timeout(60)


def _stack(i: int) -> Stack:
    return Stack(user=(Frame(f"fn{i}", FrameKind.NATIVE, "/bin/x", i),), kernel=(Frame("schedule", FrameKind.KERNEL),))


def test_stack_selection_is_exact_monotonic_and_bounded() -> None:
    """Stacks appear, grow at changing rates and overtake each other; K = 3 of 8 get series."""
    rng = random.Random(7)
    k = 3
    selection = StackSelection(k)
    totals = {i: Counter() for i in range(8)}
    previous: dict[str, Counter] = {}
    for seq in range(1, 40):
        live = range(min(8, 2 + seq // 3))  # new stacks keep appearing
        increases = {i: Counter(rng.randint(0, 3), rng.randint(0, 10**9) * (i + 1)) for i in live}
        for i, inc in increases.items():
            totals[i] = totals[i] + inc
        rows = snapshot_of(
            [(APP, 0, "", Reason.SLEEPING, _stack(i), totals[i], increases[i]) for i in live], sequence=seq
        )
        out = selection.update(rows)[APP.key]
        named = [r for r in out if r.stack is not None]
        assert len(named) <= k
        # exact: the series add up to the process total
        assert sum((r.value for r in out), Counter()) == sum((totals[i] for i in live), Counter())
        # monotonic: no series ever goes down
        current = {(r.stack.stack_id if r.stack else "other"): r.value for r in out}
        for key, value in previous.items():
            assert current[key].ns >= value.ns and current[key].count >= value.count, key
        previous = current
    assert len(previous) == k + 1


def test_stack_selection_forgets_exited_processes() -> None:
    selection = StackSelection(2)
    selection.update(two_process_snapshot(sequence=1))
    only_app = snapshot_of([(APP, 0, "", Reason.SLEEPING, _stack(1), Counter(1, 10), Counter(1, 10))])
    assert set(selection.update(only_app)) == {APP.key}
    assert set(selection._state) == {APP.key}


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_metrics_carry_the_snapshot_totals(protocol: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=ci,service.namespace=perf")
    snap = two_process_snapshot(sequence=5)
    receiver = GrpcReceiver() if protocol == "grpc" else HttpReceiver()
    with receiver:
        sink = sink_from_args(
            [
                "--otlp-endpoint",
                receiver.endpoint,
                "--otlp-protocol",
                protocol,
                "--no-otlp-profiles",
                "--otlp-interval",
                "0.3",
                "--otlp-top-stacks",
                "2",
                "--otlp-headers",
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
        assert reasons == {"runnable", "sleeping", "uninterruptible", "other"}  # zeros too, as /metrics
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
    assert {a["offcpu.stack_id"] for a in app_stacks} >= {"other"}
    named = [a for a in app_stacks if a["offcpu.stack_id"] != "other"]
    assert {a["offcpu.user_function"] for a in named} == {"offcpu_sleep_ms", "offcpu_pipe_read"}
    assert {a["offcpu.kernel_function"] for a in named} == {"do_nanosleep", "pipe_read"}
    app_attrs = next(dict(a) for a in by_name["offcpu.time"] if dict(a)["process.pid"] == APP.pid)
    assert app_attrs["k8s.pod.name"] == "app-7d9f" and app_attrs["process.executable.name"] == "app"
    db_attrs = next(dict(a) for a in by_name["offcpu.time"] if dict(a)["process.pid"] == DB.pid)
    assert "k8s.pod.name" not in db_attrs


def test_env_service_name_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    from exporter.sinks.otlp.metrics import exporter_resource

    monkeypatch.setenv("OTEL_SERVICE_NAME", "offcpu-node-a")
    assert exporter_resource("h").attributes["service.name"] == "offcpu-node-a"
    monkeypatch.delenv("OTEL_SERVICE_NAME")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "host.name=node-7")
    assert exporter_resource("h").attributes["host.name"] == "node-7"
