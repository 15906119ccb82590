"""A SkyWalking OAP stand-in for tests: a real gRPC server on loopback implementing
EBPFProfilingService and EBPFProcessService from the project's own .proto files.

It assigns process ids the way the OAP does (sha256 of ``processName_instanceId``), hands out
the tasks a test adds (only those updated after the query's ``latestUpdateTime``, as the OAP's
query does), and records every stream, report and ping it receives.
"""

from __future__ import annotations

import base64
import hashlib
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field

import grpc

from offcpu_exporter.formats.proto.skywalking.common import Common_pb2
from offcpu_exporter.formats.proto.skywalking.ebpf.profiling import (
    Process_pb2,
    Process_pb2_grpc,
    Profile_pb2,
    Profile_pb2_grpc,
)


def oap_process_id(service: str, instance: str, process: str) -> str:
    """The OAP's IDManager: serviceId = base64(service) + ".1", instanceId = serviceId + "_" +
    base64(instance), processId = sha256hex(process + "_" + instanceId)."""
    service_id = base64.b64encode(service.encode()).decode() + ".1"
    instance_id = service_id + "_" + base64.b64encode(instance.encode()).decode()
    return hashlib.sha256(f"{process}_{instance_id}".encode()).hexdigest()


@dataclass
class Stream:
    messages: list[Profile_pb2.EBPFProfilingData]
    metadata: dict[str, str]


@dataclass
class Task:
    task_id: str
    process_ids: list[str]
    target_type: str = "OFF_CPU"
    start_ms: int = 0
    duration_s: int = 60
    update_ms: int = 0
    trigger_type: str = "FIXED_TIME"

    def command(self) -> Common_pb2.Command:
        args = {
            "TaskId": self.task_id,
            "ProcessId": ",".join(self.process_ids),
            "TaskUpdateTime": str(self.update_ms),
            "TriggerType": self.trigger_type,
            "TargetType": self.target_type,
            "TaskStartTime": str(self.start_ms),
            "ExtensionConfigJSON": "",
            "FixedTriggerDuration": str(self.duration_s),
        }
        return Common_pb2.Command(
            command="EBPFProfilingTaskQuery",
            args=[Common_pb2.KeyStringValuePair(key=k, value=v) for k, v in args.items()],
        )


@dataclass
class Recorded:
    streams: list[Stream] = field(default_factory=list)
    reports: list[Process_pb2.EBPFProcessReportList] = field(default_factory=list)
    pings: list[Process_pb2.EBPFProcessPingPkgList] = field(default_factory=list)
    queries: list[Profile_pb2.EBPFProfilingTaskQuery] = field(default_factory=list)


class _Profiling(Profile_pb2_grpc.EBPFProfilingServiceServicer):
    def __init__(self, oap: FakeOap) -> None:
        self.oap = oap

    def queryTasks(self, request, context):
        self.oap._check_auth(context)
        with self.oap.lock:
            self.oap.recorded.queries.append(request)
            tasks = [t for t in self.oap.tasks if t.update_ms > request.latestUpdateTime]
            self.oap.changed.notify_all()
        return Common_pb2.Commands(commands=[t.command() for t in tasks])

    def collectProfilingData(self, request_iterator, context):
        self.oap._check_auth(context)
        messages = list(request_iterator)
        with self.oap.lock:
            self.oap.recorded.streams.append(Stream(messages, dict(context.invocation_metadata())))
            self.oap.changed.notify_all()
        return Common_pb2.Commands()


class _Process(Process_pb2_grpc.EBPFProcessServiceServicer):
    def __init__(self, oap: FakeOap) -> None:
        self.oap = oap

    def reportProcesses(self, request, context):
        self.oap._check_auth(context)
        downstream = Process_pb2.EBPFReportProcessDownstream()
        for process in request.processes:
            host = process.hostProcess
            properties = {p.key: p.value for p in host.properties}
            if properties.get("support_ebpf_profiling") != "true":
                continue
            e = host.entity
            item = downstream.processes.add(processId=oap_process_id(e.serviceName, e.instanceName, e.processName))
            item.hostProcess.pid = host.pid
            item.hostProcess.entityMetadata.CopyFrom(e)
        with self.oap.lock:
            self.oap.recorded.reports.append(request)
            self.oap.changed.notify_all()
        return downstream

    def keepAlive(self, request, context):
        self.oap._check_auth(context)
        with self.oap.lock:
            self.oap.recorded.pings.append(request)
            self.oap.changed.notify_all()
        return Common_pb2.Commands()


class FakeOap:
    def __init__(self, token: str = "", credentials: grpc.ServerCredentials | None = None) -> None:
        self.token = token
        self.credentials = credentials
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.recorded = Recorded()
        self.tasks: list[Task] = []
        self.port = 0
        self._server: grpc.Server | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> FakeOap:
        """Starts (or restarts, on the same port) the server."""
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        Profile_pb2_grpc.add_EBPFProfilingServiceServicer_to_server(_Profiling(self), server)
        Process_pb2_grpc.add_EBPFProcessServiceServicer_to_server(_Process(self), server)
        address = f"127.0.0.1:{self.port}"
        if self.credentials is not None:
            port = server.add_secure_port(address, self.credentials)
        else:
            port = server.add_insecure_port(address)
        if port == 0:
            raise RuntimeError(f"cannot bind {address}")
        self.port = port
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait(5)
            self._server = None

    def _check_auth(self, context: grpc.ServicerContext) -> None:
        if self.token and dict(context.invocation_metadata()).get("authentication") != self.token:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "bad token")

    def add_task(self, task: Task) -> None:
        with self.lock:
            self.tasks.append(task)

    def wait_for(self, predicate: Callable[[Recorded], bool], timeout: float = 10.0) -> bool:
        end = time.monotonic() + timeout
        with self.lock:
            while not predicate(self.recorded):
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(left)
            return True

    def data(self) -> list[Profile_pb2.EBPFProfilingData]:
        with self.lock:
            return [m for s in self.recorded.streams for m in s.messages]


def sleep_totals(messages: list[Profile_pb2.EBPFProfilingData]) -> tuple[int, int]:
    """(switches, ns) of the stacks whose innermost user frame is offcpu_sleep_ms."""
    count = ns = 0
    for message in messages:
        stacks = message.offCPU.stacks
        user = [s for s in stacks if s.stackType == Profile_pb2.PROCESS_USER_SPACE]
        if user and user[0].stackSymbols[0] == "offcpu_sleep_ms":
            count += message.offCPU.switchCount
            ns += message.offCPU.duration
    return count, ns
