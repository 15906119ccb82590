"""The SkyWalking sink: encodes each flush on its own thread and hands the batches to the file and
OAP deliveries (and, as an agent, follows the OAP's tasks)."""

from __future__ import annotations

import argparse
import logging
import threading
import time
import uuid
from collections import deque

from offcpu_exporter.formats.skywalking import TaskMetadata, encode_snapshot
from offcpu_exporter.ratelimit import RateLimitedLog
from offcpu_exporter.sinks import SinkContext, SinkStats
from offcpu_exporter.sinks.skywalking.agent import Agent, AgentOptions
from offcpu_exporter.sinks.skywalking.client import OapClient, OapConnection, OapStreamTransport
from offcpu_exporter.sinks.skywalking.delivery import Batch, Delivery, RetryPolicy
from offcpu_exporter.sinks.skywalking.file import FileTransport
from offcpu_exporter.sinks.skywalking.options import SkyWalkingOptions, enabled
from offcpu_exporter.snapshot import Snapshot

__all__ = ["SkyWalkingSink", "create"]

log = logging.getLogger(__name__)

MAX_QUEUED_SNAPSHOTS = 16  # flushes waiting for the encoder (80 s at the default 5 s interval)


class SkyWalkingSink:
    name = "skywalking"

    def __init__(
        self,
        options: SkyWalkingOptions,
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
        limit = options.buffer
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
        return self._options.task_start_time_ms or snapshot.start_time_ns // 1_000_000

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
            self._file.publish(
                [
                    Batch(
                        TaskMetadata(
                            o.task_id,
                            o.process_id or str(key.pid),
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
            task = TaskMetadata(o.task_id, o.process_id, self._start_ms(snapshot))
            messages = tuple(m for batch in by_process.values() for m in batch)
            self._oap.publish([Batch(task, messages)])
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
        self._oap.publish(batches)

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
    if not enabled(options):
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
    return SkyWalkingSink(SkyWalkingOptions.from_args(options), file_transport, client, agent, policy)
