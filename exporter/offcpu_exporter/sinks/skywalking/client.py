"""The gRPC connection to a SkyWalking OAP: channel, credentials, the authentication header and
one method per RPC the exporter uses. No retries here (see `delivery` and `agent`)."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc

from offcpu_exporter.formats.proto.skywalking.common import Common_pb2
from offcpu_exporter.formats.proto.skywalking.ebpf.profiling import (
    Process_pb2,
    Process_pb2_grpc,
    Profile_pb2,
    Profile_pb2_grpc,
)
from offcpu_exporter.formats.skywalking import TaskMetadata, with_task

__all__ = ["OapClient", "OapConnection", "OapStreamTransport"]

log = logging.getLogger(__name__)

# SkyWalking agents (Java, Go, Rover) send the OAP's shared token as this gRPC metadata key; the
# OAP's AuthenticationServerInterceptor rejects calls without it when a token is configured.
AUTHENTICATION_KEY = "authentication"


@dataclass(frozen=True)
class OapConnection:
    endpoint: str  # HOST:PORT
    tls: bool = False
    ca_file: str = ""  # PEM roots for TLS; the system roots when empty
    authentication: str = ""
    timeout: float = 10.0  # seconds per RPC


class OapClient:
    def __init__(self, connection: OapConnection) -> None:
        self.connection = connection
        options = [
            ("grpc.keepalive_time_ms", 60_000),
            ("grpc.max_reconnect_backoff_ms", 10_000),
        ]
        if connection.tls:
            roots = Path(connection.ca_file).read_bytes() if connection.ca_file else None
            credentials = grpc.ssl_channel_credentials(root_certificates=roots)
            self._channel = grpc.secure_channel(connection.endpoint, credentials, options=options)
        else:
            self._channel = grpc.insecure_channel(connection.endpoint, options=options)
        self._metadata: tuple[tuple[str, str], ...] = (
            ((AUTHENTICATION_KEY, connection.authentication),) if connection.authentication else ()
        )
        self._profiling = Profile_pb2_grpc.EBPFProfilingServiceStub(self._channel)
        self._process = Process_pb2_grpc.EBPFProcessServiceStub(self._channel)

    def _timeout(self, timeout: float | None) -> float:
        return self.connection.timeout if timeout is None else max(0.001, min(timeout, self.connection.timeout))

    def collect(self, messages: Iterator[Profile_pb2.EBPFProfilingData], timeout: float | None = None) -> None:
        self._profiling.collectProfilingData(messages, timeout=self._timeout(timeout), metadata=self._metadata)

    def query_tasks(
        self, instance_id: str, latest_update_ms: int, timeout: float | None = None
    ) -> Common_pb2.Commands:
        query = Profile_pb2.EBPFProfilingTaskQuery(roverInstanceId=instance_id, latestUpdateTime=latest_update_ms)
        result: Common_pb2.Commands = self._profiling.queryTasks(
            query, timeout=self._timeout(timeout), metadata=self._metadata
        )
        return result

    def report_processes(
        self, report: Process_pb2.EBPFProcessReportList, timeout: float | None = None
    ) -> Process_pb2.EBPFReportProcessDownstream:
        result: Process_pb2.EBPFReportProcessDownstream = self._process.reportProcesses(
            report, timeout=self._timeout(timeout), metadata=self._metadata
        )
        return result

    def keep_alive(self, pings: Process_pb2.EBPFProcessPingPkgList, timeout: float | None = None) -> None:
        self._process.keepAlive(pings, timeout=self._timeout(timeout), metadata=self._metadata)

    def close(self) -> None:
        self._channel.close()


class OapStreamTransport:
    """Sends one batch as one `collectProfilingData` client stream; the first message carries the
    task metadata with the current time, as Rover does on each flush."""

    name = "oap"

    def __init__(self, client: OapClient) -> None:
        self._client = client

    def send(self, task: TaskMetadata, messages: Sequence[Profile_pb2.EBPFProfilingData], timeout: float) -> None:
        if not messages:
            return
        self._client.collect(iter(with_task(task, messages)), timeout=timeout)

    def close(self) -> None:
        pass  # the channel belongs to the sink, which may share it with the agent
