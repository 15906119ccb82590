"""The OAP transports against a real gRPC server on loopback (testkit/skywalking_oap.py)."""

from __future__ import annotations

import logging
import subprocess
import threading
import time

import grpc
import pytest

from offcpu_exporter.formats.proto.skywalking.ebpf.profiling import Profile_pb2 as pb
from offcpu_exporter.sinks.retry import Backoff
from offcpu_exporter.sinks.skywalking.agent import Agent, AgentOptions
from offcpu_exporter.sinks.skywalking.client import OapClient, OapConnection
from offcpu_exporter.sinks.skywalking.delivery import RetryPolicy
from offcpu_exporter.sinks.skywalking.options import SkyWalkingOptions
from offcpu_exporter.sinks.skywalking.sink import SkyWalkingSink, create
from testkit.skywalking_oap import FakeOap, Task, oap_process_id
from testkit.skywalking_sink import context, parse
from testkit.snapshots import PIPE, SEC, SLEEP, T0, process, sample, snapshot

pytestmark = pytest.mark.timeout(60)

APP = process(4242, "app", cmdline=("app", "--serve"))
OTHER = process(777, "other")
FAST = RetryPolicy(attempts=3, backoff=Backoff(base=0.05, cap=0.2), deadline=2.0, rpc_timeout=1.0)
T0_MS = T0 // 1_000_000


@pytest.fixture
def oap():
    server = FakeOap().start()
    yield server
    server.stop()


def stream_sink(endpoint: str, *extra: str, policy: RetryPolicy = FAST) -> SkyWalkingSink:
    options = parse(
        [
            "--skywalking.endpoint",
            endpoint,
            "--skywalking.task-id",
            "task-1",
            "--skywalking.process-id",
            "p-1",
            *extra,
        ]
    )
    client = OapClient(OapConnection(endpoint, authentication=options.skywalking_authentication, timeout=1.0))
    return SkyWalkingSink(SkyWalkingOptions.from_args(options), client=client, policy=policy)


def test_task_mode_streams_each_flush(oap: FakeOap) -> None:
    sink = stream_sink(oap.endpoint)
    sink.publish(snapshot([sample(APP, SLEEP, 10, 2 * SEC), sample(APP, PIPE, 4, SEC)], [APP], sequence=1))
    assert oap.wait_for(lambda r: len(r.streams) == 1)
    sink.publish(snapshot([sample(APP, SLEEP, 1, SEC // 10)], [APP], sequence=2))
    assert oap.wait_for(lambda r: len(r.streams) == 2)
    sink.close(5)

    first, second = oap.recorded.streams
    assert len(first.messages) == 2 and len(second.messages) == 1
    head = first.messages[0]
    assert (head.task.taskId, head.task.processId) == ("task-1", "p-1")
    assert head.task.profilingStartTime == T0_MS
    assert abs(head.task.currentTime - time.time() * 1000) < 60_000
    assert not first.messages[1].HasField("task")
    assert second.messages[0].HasField("task")
    for message in first.messages + second.messages:
        stacks = message.offCPU.stacks
        assert [s.stackType for s in stacks] == [pb.PROCESS_KERNEL_SPACE, pb.PROCESS_USER_SPACE]
        assert stacks[0].stackSymbols[0] == "finish_task_switch.isra.0"
    by_leaf = {m.offCPU.stacks[1].stackSymbols[0]: m.offCPU for m in first.messages}
    assert (by_leaf["offcpu_sleep_ms"].switchCount, by_leaf["offcpu_sleep_ms"].duration) == (10, 2 * SEC)
    assert (by_leaf["offcpu_pipe_read"].switchCount, by_leaf["offcpu_pipe_read"].duration) == (4, SEC)
    assert sink.stats.get("sent") == 3 and sink.stats.get("dropped") == 0
    assert "authentication" not in first.metadata


def test_authentication_header() -> None:
    oap = FakeOap(token="s3cret").start()
    try:
        good = stream_sink(oap.endpoint, "--skywalking.authentication", "s3cret")
        good.publish(snapshot([sample(APP, SLEEP, 1, 5)], [APP]))
        assert oap.wait_for(lambda r: len(r.streams) == 1)
        good.close(5)
        assert oap.recorded.streams[0].metadata["authentication"] == "s3cret"

        bad = stream_sink(oap.endpoint, "--skywalking.authentication", "wrong")
        bad.publish(snapshot([sample(APP, SLEEP, 1, 5)], [APP]))
        bad.close(1)
        assert len(oap.recorded.streams) == 1  # refused by the server
        assert bad.stats.get("sent") == 0 and bad.stats.get("dropped") == 1
        assert bad.stats.get("failed") >= 1
    finally:
        oap.stop()


def test_tls_with_ca_file(tmp_path) -> None:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    credentials = grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())])
    oap = FakeOap(credentials=credentials).start()
    try:
        options = parse(
            ["--skywalking.endpoint", oap.endpoint, "--skywalking.tls", "--skywalking.ca-file", str(cert),
             "--skywalking.task-id", "t", "--skywalking.process-id", "p"]
        )  # fmt: skip
        sink = create(options, context())
        assert sink is not None
        sink.publish(snapshot([sample(APP, SLEEP, 3, 30)], [APP]))
        assert oap.wait_for(lambda r: len(r.streams) == 1)
        sink.close(5)
        assert oap.recorded.streams[0].messages[0].offCPU.switchCount == 3
    finally:
        oap.stop()


def test_oap_down_then_back_loses_nothing_within_the_buffer(oap: FakeOap) -> None:
    sink = stream_sink(oap.endpoint, "--skywalking.buffer", "100")
    (delivery,) = sink.deliveries
    sink.publish(snapshot([sample(APP, SLEEP, 1, 10)], [APP], sequence=1))
    assert oap.wait_for(lambda r: len(r.streams) == 1)
    assert sink.wait_idle(5) and sink.stats.get("sent") == 1  # the answer is back, too

    oap.stop()
    expected = {1: 10}
    for seq in range(2, 8):  # six flushes while the OAP is down
        sink.publish(snapshot([sample(APP, SLEEP, seq, seq * 10), sample(APP, PIPE, 1, 1)], [APP], sequence=seq))
        assert sink.wait_idle(10)
        expected[seq] = seq * 10
    assert delivery.pending() == 12
    assert sink.stats.get("failed") >= 6 and sink.stats.get("retried") >= 6

    oap.start()  # same port
    deadline = time.monotonic() + 20
    while sum(len(s.messages) for s in oap.recorded.streams) < 13 and time.monotonic() < deadline:
        sink.publish(snapshot([], [APP], sequence=99))  # later flushes with no change re-send the backlog
        sink.wait_idle(10)
        time.sleep(0.2)
    sink.close(5)

    data = oap.data()
    assert len(data) == 13
    sleeps = sorted(m.offCPU.duration for m in data if m.offCPU.stacks[1].stackSymbols[0] == "offcpu_sleep_ms")
    assert sleeps == sorted(expected.values())
    assert sink.stats.get("dropped") == 0 and sink.stats.get("sent") == 13
    # The backlog went out as one stream (one task header) after the restart.
    assert all(s.messages[0].task.taskId == "task-1" for s in oap.recorded.streams)


def test_oap_down_beyond_the_buffer_counts_drops(oap: FakeOap, caplog) -> None:
    sink = stream_sink(oap.endpoint, "--skywalking.buffer", "5")
    (delivery,) = sink.deliveries
    oap.stop()
    with caplog.at_level(logging.WARNING):
        for seq in range(1, 5):  # 4 flushes of 2 messages: 8 messages, 5 kept
            sink.publish(snapshot([sample(APP, SLEEP, seq, seq), sample(APP, PIPE, seq, seq)], [APP], sequence=seq))
            assert sink.wait_idle(10)
    assert delivery.pending() == 5
    assert sink.stats.get("dropped") == 3
    assert "buffer full (5 messages)" in caplog.text
    oap.start()
    deadline = time.monotonic() + 20
    while not oap.data() and time.monotonic() < deadline:
        sink.publish(snapshot([], [APP], sequence=99))
        sink.wait_idle(10)
        time.sleep(0.2)
    sink.close(5)
    data = oap.data()
    assert len(data) == 5  # the newest five: the oldest were dropped
    assert sorted(m.offCPU.switchCount for m in data) == [2, 3, 3, 4, 4]
    assert sink.stats.get("sent") == 5 and sink.stats.get("dropped") == 3


def test_close_with_oap_down_counts_the_rest_dropped(oap: FakeOap) -> None:
    sink = stream_sink(oap.endpoint)
    oap.stop()
    sink.publish(snapshot([sample(APP, SLEEP, 1, 1)], [APP]))
    started = time.monotonic()
    sink.close(1.0)
    assert time.monotonic() - started < 5
    assert sink.stats.get("dropped") == 1 and sink.stats.get("sent") == 0


def test_publish_never_waits_for_a_hanging_oap() -> None:
    # A server that accepts the connection but never answers: each RPC runs into its deadline.
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    try:
        endpoint = f"127.0.0.1:{listener.getsockname()[1]}"
        sink = stream_sink(endpoint)
        started = time.monotonic()
        for seq in range(1, 20):
            sink.publish(snapshot([sample(APP, SLEEP, 1, 1)], [APP], sequence=seq))
        assert time.monotonic() - started < 0.5
        sink.close(0.5)
        assert sink.stats.get("sent") == 0 and sink.stats.get("dropped") == 19
    finally:
        listener.close()


def test_publish_returns_at_once_and_a_far_behind_encoder_drops_counted(oap: FakeOap, monkeypatch) -> None:
    import offcpu_exporter.sinks.skywalking.sink as skywalking

    real = skywalking.encode_snapshot
    gate = threading.Event()
    released = threading.Event()  # an encode got past the gate

    def slow_encode(snap, processes=None):  # type: ignore[no-untyped-def]
        gate.wait(10)
        released.set()
        return real(snap, processes)

    monkeypatch.setattr(skywalking, "encode_snapshot", slow_encode)
    monkeypatch.setattr(skywalking, "MAX_QUEUED_SNAPSHOTS", 2)
    sink = stream_sink(oap.endpoint)
    for seq in range(1, 6):  # 1 is being encoded, 2..5 queue; only the newest two are kept
        sink.publish(snapshot([sample(APP, SLEEP, seq, seq), sample(APP, PIPE, seq, seq)], [APP], sequence=seq))
        time.sleep(0.05)
    # Every publish returned while the encoder was still held at the gate: a publish that waited
    # for the encoder would have returned only once the gate's wait timed out. (Not a time limit,
    # which a loaded machine exceeds: 1.29 s was seen against 1 s.)
    assert not released.is_set()
    gate.set()
    assert sink.wait_idle(10)
    sink.close(5)
    assert sink.stats.get("dropped") == 4  # flushes 2 and 3, two changed stacks each
    assert sorted(m.offCPU.switchCount for m in oap.data()) == [1, 1, 4, 4, 5, 5]


# --- agent mode --------------------------------------------------------------------------------


def agent_sink(oap: FakeOap, *extra: str) -> tuple[SkyWalkingSink, Agent]:
    options = parse(["--skywalking.endpoint", oap.endpoint, "--skywalking.agent", *extra])
    client = OapClient(OapConnection(oap.endpoint, timeout=1.0))
    agent = Agent(
        client,
        AgentOptions(
            agent_id="agent-1",
            process_name=options.skywalking_process_name,
            labels=("host-a",),
            report_cmdline=options.skywalking_report_cmdline,
            poll_interval=0.2,
        ),
        clock_ms=lambda: T0_MS + 30_000,
        hostname="host-a",
    )
    return SkyWalkingSink(SkyWalkingOptions.from_args(options), client=client, agent=agent, policy=FAST), agent


def test_agent_reports_processes_and_follows_an_off_cpu_task(oap: FakeOap, caplog) -> None:
    sink, agent = agent_sink(oap, "--skywalking.report-cmdline")

    def flush(seq: int) -> None:
        sink.publish(
            snapshot(
                [sample(APP, SLEEP, seq, seq * SEC // 10), sample(OTHER, PIPE, seq, seq)],
                [APP, OTHER],
                sequence=seq,
            )
        )
        assert sink.wait_idle(10)

    flush(1)
    assert oap.wait_for(lambda r: len(agent.process_ids()) == 2 and len(r.pings) >= 1)
    app_id = oap_process_id("app", "host-a", "app-4242")
    other_id = oap_process_id("other", "host-a", "other-777")
    assert agent.process_ids() == {APP.key: app_id, OTHER.key: other_id}
    reported = {p.hostProcess.pid: p.hostProcess for r in oap.recorded.reports for p in r.processes}
    assert set(reported) == {4242, 777}
    host = reported[4242]
    assert oap.recorded.reports[0].ebpfAgentID == "agent-1"
    assert (
        host.entity.layer,
        host.entity.serviceName,
        host.entity.instanceName,
        host.entity.processName,
    ) == (
        "OS_LINUX",
        "app",
        "host-a",
        "app-4242",
    )
    assert list(host.entity.labels) == ["host-a"]
    properties = {p.key: p.value for p in host.properties}
    assert properties == {"pid": "4242", "support_ebpf_profiling": "true", "command_line": "app --serve"}
    assert {p.entityMetadata.processName for p in oap.recorded.pings[-1].processes} == {
        "app-4242",
        "other-777",
    }

    # Window [T0+10 s, T0+20 s): flushes 3 and 4 (5 s each from T0) belong to it, for APP only.
    with caplog.at_level(logging.INFO):
        oap.add_task(Task("off-1", [app_id], "OFF_CPU", start_ms=T0_MS + 10_000, duration_s=10, update_ms=500))
        oap.add_task(Task("on-1", [app_id], "ON_CPU", start_ms=T0_MS, duration_s=60, update_ms=600))
        oap.add_task(Task("net-1", [other_id], "NETWORK", start_ms=T0_MS, duration_s=60, update_ms=400))
        queries_before = len(oap.recorded.queries)
        assert oap.wait_for(lambda r: len(r.queries) >= queries_before + 2)
        assert agent.wait_cycles(1, 5)
    assert "ignoring ON_CPU task on-1" in caplog.text
    assert "ignoring NETWORK task net-1" in caplog.text
    assert oap.recorded.queries[-1].latestUpdateTime == 600
    assert oap.recorded.queries[-1].roverInstanceId == "agent-1"

    for seq in range(2, 7):
        flush(seq)
    sink.close(5)

    data = oap.data()
    assert len(data) == 2
    assert [m.offCPU.switchCount for m in data] == [3, 4]
    assert sum(m.offCPU.duration for m in data) == (3 + 4) * SEC // 10
    for message in data:
        assert [s.stackType for s in message.offCPU.stacks] == [
            pb.PROCESS_KERNEL_SPACE,
            pb.PROCESS_USER_SPACE,
        ]
        assert message.offCPU.stacks[1].stackSymbols[0] == "offcpu_sleep_ms"
    for stream in oap.recorded.streams:
        task = stream.messages[0].task
        assert (task.taskId, task.processId, task.profilingStartTime) == ("off-1", app_id, T0_MS + 10_000)


def test_agent_survives_an_oap_outage(oap: FakeOap) -> None:
    sink, agent = agent_sink(oap)
    sink.publish(snapshot([sample(APP, SLEEP, 1, 1)], [APP], sequence=1))
    assert oap.wait_for(lambda r: len(agent.process_ids()) == 1)
    oap.stop()
    assert agent.wait_cycles(agent.cycles + 3, 10)  # polls fail, the thread goes on
    oap.add_task(Task("off-2", [agent.process_ids()[APP.key]], start_ms=T0_MS, duration_s=30, update_ms=1))
    queries = len(oap.recorded.queries)
    oap.start()
    assert oap.wait_for(lambda r: len(r.queries) > queries, 10)
    deadline = time.monotonic() + 10
    while not agent.assignments(snapshot([], [APP], sequence=2)) and time.monotonic() < deadline:
        time.sleep(0.1)
    sink.publish(snapshot([sample(APP, SLEEP, 2, 2)], [APP], sequence=2))
    assert oap.wait_for(lambda r: len(r.streams) == 1, 10)
    sink.close(5)
    assert oap.data()[0].task.taskId == "off-2"


def test_agent_forgets_exited_processes(oap: FakeOap) -> None:
    sink, agent = agent_sink(oap)
    sink.publish(snapshot([], [APP, OTHER], sequence=1))
    assert oap.wait_for(lambda r: len(agent.process_ids()) == 2)
    sink.publish(snapshot([], [APP], sequence=2))
    n = len(oap.recorded.pings)
    assert oap.wait_for(lambda r: len(r.pings) >= n + 2)
    sink.close(5)
    assert {p.entityMetadata.processName for p in oap.recorded.pings[-1].processes} == {"app-4242"}
    assert set(agent.process_ids()) == {APP.key}
