"""SkyWalking output: off-CPU `EBPFProfilingData` to a file, to an OAP task, or as a Rover-like agent.

Modes (any of them together):
- ``--skywalking.file PATH``: every flush appends length-delimited messages to PATH
  (``offcpu-exporter skywalking-dump PATH`` prints them).
- ``--skywalking.endpoint HOST:PORT --skywalking.task-id T --skywalking.process-id P``: every flush
  is streamed to the OAP's ``collectProfilingData`` under that task.
- ``--skywalking.endpoint HOST:PORT --skywalking.agent``: the watched processes are reported to the
  OAP, and data is streamed for the OFF_CPU tasks the OAP creates for them.
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any

from offcpu_exporter.config import positive_int, seconds
from offcpu_exporter.ratelimit import RateLimitedLog
from offcpu_exporter.sinks import SinkContext, SinkStats
from offcpu_exporter.sinks.skywalking.agent import Agent, AgentOptions
from offcpu_exporter.sinks.skywalking.client import OapClient, OapConnection, OapStreamTransport
from offcpu_exporter.sinks.skywalking.delivery import Batch, Delivery, RetryPolicy
from offcpu_exporter.sinks.skywalking.dump import add_dump_arguments, dump_main
from offcpu_exporter.sinks.skywalking.encode import TaskMetadata, encode_snapshot
from offcpu_exporter.sinks.skywalking.file import FileTransport
from offcpu_exporter.snapshot import Snapshot

__all__ = ["SkyWalkingSink", "add_arguments", "add_dump_arguments", "add_subcommands", "create", "dump_main"]

log = logging.getLogger(__name__)

MAX_QUEUED_SNAPSHOTS = 16  # flushes waiting for the encoder (80 s at the default 5 s interval)


def _endpoint(value: str) -> str:
    if not value:
        return ""  # argparse runs the default through this too: "" is "off"
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("SkyWalking output (EBPFProfilingData, off-CPU)")

    def add(name: str, **kwargs: Any) -> None:
        # Dotted flags (--skywalking.endpoint) keep the attribute names the sink reads (skywalking_endpoint).
        group.add_argument(name, dest=name[2:].replace(".", "_").replace("-", "_"), **kwargs)

    add("--skywalking.file", metavar="PATH", default="", help="append length-delimited EBPFProfilingData")
    add("--skywalking.endpoint", metavar="HOST:PORT", type=_endpoint, default="", help="SkyWalking OAP gRPC")
    add("--skywalking.tls", action="store_true", help="connect to the OAP with TLS")
    add(
        "--skywalking.ca-file",
        metavar="PEM",
        default="",
        help="CA certificates for TLS (system roots if unset)",
    )
    add(
        "--skywalking.authentication",
        metavar="TOKEN",
        default=os.environ.get("SW_AGENT_AUTHENTICATION", ""),
        help="token sent as the 'authentication' metadata (default: $SW_AGENT_AUTHENTICATION)",
    )
    add("--skywalking.task-id", metavar="ID", default="", help="stream every flush under this profiling task")
    add(
        "--skywalking.process-id",
        metavar="ID",
        default="",
        help="the OAP's process id for --skywalking.task-id",
    )
    add(
        "--skywalking.task-start-time",
        metavar="MS",
        type=int,
        default=0,
        help="profilingStartTime in ms since the epoch (default: when the probe started)",
    )
    add("--skywalking.agent", action="store_true", help="report processes and follow the OAP's OFF_CPU tasks")
    add(
        "--skywalking.agent-id",
        metavar="ID",
        default="",
        help="ebpfAgentID / roverInstanceId (default: random)",
    )
    add(
        "--skywalking.service-name",
        metavar="FMT",
        default="{exe}",
        help="fields: {comm} {exe} {pid} {hostname}",
    )
    add("--skywalking.instance-name", metavar="FMT", default="{hostname}", help="as --skywalking.service-name")
    add(
        "--skywalking.process-name",
        metavar="FMT",
        default="{comm}-{pid}",
        help="as --skywalking.service-name",
    )
    add("--skywalking.labels", metavar="L1,L2", default="", help="labels of the reported processes")
    add("--skywalking.report-cmdline", action="store_true", help="report command lines as a process property")
    add(
        "--skywalking.task-poll-interval",
        metavar="DURATION",
        type=seconds,
        default=10.0,
        help="queryTasks and keepAlive period (default: 10s)",
    )
    add(
        "--skywalking.buffer",
        metavar="MESSAGES",
        type=positive_int,
        default=10_000,
        help="messages kept for re-sending while a destination fails (default: %(default)s)",
    )
    add("--skywalking.timeout", metavar="DURATION", type=seconds, default=10.0, help="per-RPC deadline (default: 10s)")


def add_subcommands(subparsers: Any) -> None:
    """``offcpu-exporter skywalking-dump PATH`` (the CLI calls this hook of every sink module)."""
    add_dump_arguments(subparsers)


def _fail(message: str) -> None:
    # The CLI turns a ValueError from create() into one error line and exit status 2.
    raise ValueError(message)


def _check(options: argparse.Namespace) -> None:
    o = options
    if not o.skywalking_endpoint:
        for flag, value in (("agent", o.skywalking_agent), ("tls", o.skywalking_tls)):
            if value:
                _fail(f"--skywalking.{flag} needs --skywalking.endpoint")
        if o.skywalking_task_id and not o.skywalking_file:
            _fail("--skywalking.task-id needs --skywalking.endpoint (or names the records of --skywalking.file)")
    elif o.skywalking_agent:
        if o.skywalking_task_id:
            _fail("--skywalking.agent takes its tasks from the OAP: drop --skywalking.task-id")
    elif not o.skywalking_task_id or not o.skywalking_process_id:
        _fail("--skywalking.endpoint needs --skywalking.task-id and --skywalking.process-id, or --skywalking.agent")
    if o.skywalking_ca_file:
        if not o.skywalking_tls:
            _fail("--skywalking.ca-file needs --skywalking.tls")
        try:
            Path(o.skywalking_ca_file).read_bytes()
        except OSError as exc:
            _fail(f"--skywalking.ca-file: {exc.strerror}: {o.skywalking_ca_file}")
    if o.skywalking_file:
        parent = Path(o.skywalking_file).resolve().parent
        if not parent.is_dir() or not os.access(parent, os.W_OK):
            _fail(f"--skywalking.file: cannot write in {parent}")
    for flag in ("service", "instance", "process"):
        template = getattr(o, f"skywalking_{flag}_name")
        try:
            template.format(comm="c", exe="e", pid=1, hostname="h")
        except (KeyError, IndexError, ValueError) as exc:
            _fail(f"--skywalking.{flag}-name {template!r}: unknown field or bad format ({exc})")


class SkyWalkingSink:
    name = "skywalking"

    def __init__(
        self,
        options: argparse.Namespace,
        file_transport: FileTransport | None = None,
        client: OapClient | None = None,
        agent: Agent | None = None,
        policy: RetryPolicy | None = None,
    ) -> None:
        self.stats = SinkStats()
        self._warn = RateLimitedLog(log)
        self._options = options
        self._client = client
        self._agent = agent
        self._file: Delivery | None = None
        self._oap: Delivery | None = None
        limit = options.skywalking_buffer
        if file_transport is not None:
            self._file_transport = file_transport
            self._file = Delivery(file_transport, self.stats, limit, policy)
        if client is not None:
            self._oap = Delivery(OapStreamTransport(client), self.stats, limit, policy)
        # Encoding runs on the sink's own thread: for thousands of changed stacks it takes tens to
        # hundreds of ms, which must not delay the pipeline's next flush.
        self._snapshots: deque[Snapshot] = deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = False
        self._busy = False
        self._idle = threading.Condition(self._lock)
        self._encoder = threading.Thread(target=self._run, name="skywalking-encode", daemon=True)
        self._encoder.start()
        if agent is not None:
            agent.start()

    @property
    def deliveries(self) -> list[Delivery]:
        return [d for d in (self._file, self._oap) if d is not None]

    def _start_ms(self, snapshot: Snapshot) -> int:
        return self._options.skywalking_task_start_time or snapshot.start_time_ns // 1_000_000

    def publish(self, snapshot: Snapshot) -> None:
        """Queues the snapshot for the encoder thread; never waits."""
        with self._lock:
            if len(self._snapshots) >= MAX_QUEUED_SNAPSHOTS:
                # The encoder is that far behind: the oldest flush's data goes, counted.
                lost = self._snapshots.popleft()
                dropped = sum(1 for _ in lost.changed())
                self.stats.add("dropped", dropped)
                self._warn.warning("skywalking: encoder behind, dropped a flush of %d changed stacks", dropped)
            self._snapshots.append(snapshot)
            self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            with self._lock:
                snapshots = list(self._snapshots)
                self._snapshots.clear()
                self._wake.clear()
                self._busy = True
                closing = self._closing
            for snapshot in snapshots:
                try:
                    self._deliver(snapshot)
                except Exception:
                    # A bug must not kill the thread and silently stop the output.
                    self.stats.add("failed")
                    log.exception("skywalking: encoding a snapshot failed")
            with self._lock:
                self._busy = False
                self._idle.notify_all()
                if closing and not self._snapshots:
                    return

    def wait_idle(self, timeout: float) -> bool:
        """Waits until every published snapshot is encoded and handed to the destinations, and
        those have sent or put back what they had (for tests and benchmarks)."""
        end = time.monotonic() + timeout
        with self._lock:
            while self._busy or self._snapshots:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return all(d.wait_idle(max(0.0, end - time.monotonic())) for d in self.deliveries)

    def _deliver(self, snapshot: Snapshot) -> None:
        o = self._options
        by_process = None
        if self._file is not None or (self._oap is not None and self._agent is None):
            by_process = encode_snapshot(snapshot)
        if self._file is not None and by_process is not None:
            # One batch per process, named by the task/process ids given or by the pid, so that
            # the file says whose stacks follow.
            self._file.submit(
                [
                    Batch(
                        TaskMetadata(
                            o.skywalking_task_id,
                            o.skywalking_process_id or str(key.pid),
                            self._start_ms(snapshot),
                        ),
                        tuple(messages),
                    )
                    for key, messages in by_process.items()
                ]
            )
        if self._oap is None:
            return
        if self._agent is None:
            assert by_process is not None
            task = TaskMetadata(o.skywalking_task_id, o.skywalking_process_id, self._start_ms(snapshot))
            messages = tuple(m for batch in by_process.values() for m in batch)
            self._oap.submit([Batch(task, messages)])
            return
        self._agent.observe(snapshot)
        assignments = self._agent.assignments(snapshot)
        if not assignments:
            return
        encoded = encode_snapshot(snapshot, {key for key, _ in assignments})
        batches: list[Batch] = []
        for key, task in assignments:
            if key in encoded:
                batches.append(Batch(task, tuple(encoded[key])))
        self._oap.submit(batches)

    def close(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        with self._lock:
            self._closing = True
            self._wake.set()
        self._encoder.join(max(0.1, timeout / 2))  # encode the final snapshot before the last sends
        timeout = max(0.1, end - time.monotonic())
        if self._agent is not None:
            self._agent.close(min(timeout, 2.0))
        for delivery in self.deliveries:
            delivery.close(timeout)
        if self._file is not None:
            self._file_transport.close()
        if self._client is not None:
            self._client.close()


def create(options: argparse.Namespace, context: SinkContext) -> SkyWalkingSink | None:
    o = options
    _check(options)
    if not o.skywalking_file and not o.skywalking_endpoint:
        return None
    client = None
    agent = None
    if o.skywalking_endpoint:
        client = OapClient(
            OapConnection(
                endpoint=o.skywalking_endpoint,
                tls=o.skywalking_tls,
                ca_file=o.skywalking_ca_file,
                authentication=o.skywalking_authentication,
                timeout=o.skywalking_timeout,
            )
        )
        if o.skywalking_agent:
            agent = Agent(
                client,
                AgentOptions(
                    agent_id=o.skywalking_agent_id or str(uuid.uuid4()),
                    service_name=o.skywalking_service_name,
                    instance_name=o.skywalking_instance_name,
                    process_name=o.skywalking_process_name,
                    labels=tuple(label for label in o.skywalking_labels.split(",") if label),
                    report_cmdline=o.skywalking_report_cmdline,
                    poll_interval=o.skywalking_task_poll_interval,
                ),
            )
    policy = RetryPolicy(rpc_timeout=o.skywalking_timeout)
    file_transport = FileTransport(o.skywalking_file) if o.skywalking_file else None
    log.info(
        "skywalking output: file=%s endpoint=%s mode=%s",
        o.skywalking_file or "-",
        o.skywalking_endpoint or "-",
        "agent" if agent else ("task " + o.skywalking_task_id if client else "-"),
    )
    return SkyWalkingSink(options, file_transport, client, agent, policy)
