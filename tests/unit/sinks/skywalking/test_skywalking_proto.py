"""The project's SkyWalking .proto files against the wire facts (docs/skywalking.md), and the
committed generated code against a fresh generation."""

from __future__ import annotations

import pytest
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from offcpu_exporter.formats.proto.skywalking import generate
from offcpu_exporter.formats.proto.skywalking.common import Common_pb2
from offcpu_exporter.formats.proto.skywalking.ebpf.profiling import Process_pb2, Process_pb2_grpc, Profile_pb2
from testkit.gencode import stale_descriptors

T = FieldDescriptor
# (message, field, number, type, repeated, message type or enum or oneof) from the protocol facts.
FACTS: list[tuple[type[Message], str, int, int, bool, str | None]] = [
    (Common_pb2.KeyStringValuePair, "key", 1, T.TYPE_STRING, False, None),
    (Common_pb2.KeyStringValuePair, "value", 2, T.TYPE_STRING, False, None),
    (Common_pb2.Command, "command", 1, T.TYPE_STRING, False, None),
    (Common_pb2.Command, "args", 2, T.TYPE_MESSAGE, True, "KeyStringValuePair"),
    (Common_pb2.Commands, "commands", 1, T.TYPE_MESSAGE, True, "Command"),
    (Profile_pb2.EBPFProfilingTaskQuery, "roverInstanceId", 1, T.TYPE_STRING, False, None),
    (Profile_pb2.EBPFProfilingTaskQuery, "latestUpdateTime", 2, T.TYPE_INT64, False, None),
    (Profile_pb2.EBPFProfilingData, "task", 1, T.TYPE_MESSAGE, False, "EBPFProfilingTaskMetadata"),
    (Profile_pb2.EBPFProfilingData, "onCPU", 2, T.TYPE_MESSAGE, False, "EBPFOnCPUProfiling"),
    (Profile_pb2.EBPFProfilingData, "offCPU", 3, T.TYPE_MESSAGE, False, "EBPFOffCPUProfiling"),
    (Profile_pb2.EBPFProfilingTaskMetadata, "taskId", 1, T.TYPE_STRING, False, None),
    (Profile_pb2.EBPFProfilingTaskMetadata, "processId", 2, T.TYPE_STRING, False, None),
    (Profile_pb2.EBPFProfilingTaskMetadata, "profilingStartTime", 3, T.TYPE_INT64, False, None),
    (Profile_pb2.EBPFProfilingTaskMetadata, "currentTime", 4, T.TYPE_INT64, False, None),
    (Profile_pb2.EBPFProfilingStackMetadata, "stackType", 1, T.TYPE_ENUM, False, "EBPFProfilingStackType"),
    (Profile_pb2.EBPFProfilingStackMetadata, "stackId", 2, T.TYPE_INT32, False, None),
    (Profile_pb2.EBPFProfilingStackMetadata, "stackSymbols", 3, T.TYPE_STRING, True, None),
    (Profile_pb2.EBPFOnCPUProfiling, "stacks", 1, T.TYPE_MESSAGE, True, "EBPFProfilingStackMetadata"),
    (Profile_pb2.EBPFOnCPUProfiling, "dumpCount", 2, T.TYPE_INT32, False, None),
    (Profile_pb2.EBPFOffCPUProfiling, "stacks", 1, T.TYPE_MESSAGE, True, "EBPFProfilingStackMetadata"),
    (Profile_pb2.EBPFOffCPUProfiling, "switchCount", 2, T.TYPE_INT32, False, None),
    (Profile_pb2.EBPFOffCPUProfiling, "duration", 3, T.TYPE_INT64, False, None),
    (Process_pb2.EBPFProcessReportList, "processes", 1, T.TYPE_MESSAGE, True, "EBPFProcessProperties"),
    (Process_pb2.EBPFProcessReportList, "ebpfAgentID", 2, T.TYPE_STRING, False, None),
    (Process_pb2.EBPFProcessProperties, "hostProcess", 1, T.TYPE_MESSAGE, False, "EBPFHostProcessMetadata"),
    (
        Process_pb2.EBPFProcessProperties,
        "k8sProcess",
        2,
        T.TYPE_MESSAGE,
        False,
        "EBPFKubernetesProcessMetadata",
    ),
    (Process_pb2.EBPFProcessEntityMetadata, "layer", 1, T.TYPE_STRING, False, None),
    (Process_pb2.EBPFProcessEntityMetadata, "serviceName", 2, T.TYPE_STRING, False, None),
    (Process_pb2.EBPFProcessEntityMetadata, "instanceName", 3, T.TYPE_STRING, False, None),
    (Process_pb2.EBPFProcessEntityMetadata, "processName", 4, T.TYPE_STRING, False, None),
    (Process_pb2.EBPFProcessEntityMetadata, "labels", 5, T.TYPE_STRING, True, None),
    (Process_pb2.EBPFReportProcessDownstream, "processes", 1, T.TYPE_MESSAGE, True, "EBPFProcessDownstream"),
    (Process_pb2.EBPFProcessDownstream, "processId", 1, T.TYPE_STRING, False, None),
    (Process_pb2.EBPFProcessDownstream, "hostProcess", 2, T.TYPE_MESSAGE, False, "EBPFHostProcessDownstream"),
    (
        Process_pb2.EBPFProcessDownstream,
        "k8sProcess",
        3,
        T.TYPE_MESSAGE,
        False,
        "EBPFKubernetesProcessDownstream",
    ),
    (Process_pb2.EBPFProcessPingPkgList, "processes", 1, T.TYPE_MESSAGE, True, "EBPFProcessPingPkg"),
    (Process_pb2.EBPFProcessPingPkgList, "ebpfAgentID", 2, T.TYPE_STRING, False, None),
    (Process_pb2.EBPFProcessPingPkg, "entityMetadata", 1, T.TYPE_MESSAGE, False, "EBPFProcessEntityMetadata"),
    (Process_pb2.EBPFProcessPingPkg, "properties", 2, T.TYPE_MESSAGE, True, "KeyStringValuePair"),
]
for _meta in (Process_pb2.EBPFHostProcessMetadata, Process_pb2.EBPFKubernetesProcessMetadata):
    FACTS += [
        (_meta, "entity", 1, T.TYPE_MESSAGE, False, "EBPFProcessEntityMetadata"),
        (_meta, "pid", 2, T.TYPE_INT32, False, None),
        (_meta, "properties", 3, T.TYPE_MESSAGE, True, "KeyStringValuePair"),
    ]
for _down in (Process_pb2.EBPFHostProcessDownstream, Process_pb2.EBPFKubernetesProcessDownstream):
    FACTS += [
        (_down, "pid", 1, T.TYPE_INT32, False, None),
        (_down, "entityMetadata", 2, T.TYPE_MESSAGE, False, "EBPFProcessEntityMetadata"),
    ]


@pytest.mark.parametrize(("message", "name", "number", "kind", "repeated", "type_name"), FACTS)
def test_fields_match_the_protocol_facts(message, name, number, kind, repeated, type_name) -> None:
    field = message.DESCRIPTOR.fields_by_name[name]
    assert field.number == number
    assert field.type == kind
    assert field.is_repeated == repeated
    if kind == T.TYPE_MESSAGE:
        assert field.message_type.name == type_name
    if kind == T.TYPE_ENUM:
        assert field.enum_type.name == type_name
    assert message.DESCRIPTOR.full_name.startswith("skywalking.v3.")


def test_no_field_beyond_the_facts() -> None:
    listed: dict[str, set[str]] = {}
    for message, name, *_ in FACTS:
        listed.setdefault(message.DESCRIPTOR.full_name, set()).add(name)
    for full_name, names in listed.items():
        descriptor = next(m for m, *_ in FACTS if m.DESCRIPTOR.full_name == full_name).DESCRIPTOR
        assert set(descriptor.fields_by_name) == names, full_name


def test_oneofs_and_enum() -> None:
    assert [f.name for f in Profile_pb2.EBPFProfilingData.DESCRIPTOR.oneofs_by_name["profiling"].fields] == [
        "onCPU",
        "offCPU",
    ]
    assert [f.name for f in Process_pb2.EBPFProcessProperties.DESCRIPTOR.oneofs_by_name["metadata"].fields] == [
        "hostProcess",
        "k8sProcess",
    ]
    assert [f.name for f in Process_pb2.EBPFProcessDownstream.DESCRIPTOR.oneofs_by_name["process"].fields] == [
        "hostProcess",
        "k8sProcess",
    ]
    assert Profile_pb2.PROCESS_KERNEL_SPACE == 0
    assert Profile_pb2.PROCESS_USER_SPACE == 1


def test_service_method_paths() -> None:
    profiling = Profile_pb2.DESCRIPTOR.services_by_name["EBPFProfilingService"]
    query = profiling.methods_by_name["queryTasks"]
    collect = profiling.methods_by_name["collectProfilingData"]
    assert query.full_name == "skywalking.v3.EBPFProfilingService.queryTasks"
    assert (query.input_type.name, query.output_type.name) == ("EBPFProfilingTaskQuery", "Commands")
    assert (collect.input_type.name, collect.output_type.name) == ("EBPFProfilingData", "Commands")
    assert collect.client_streaming and not collect.server_streaming
    assert not query.client_streaming and not query.server_streaming
    process = Process_pb2.DESCRIPTOR.services_by_name["EBPFProcessService"]
    report = process.methods_by_name["reportProcesses"]
    ping = process.methods_by_name["keepAlive"]
    assert (report.input_type.name, report.output_type.name) == (
        "EBPFProcessReportList",
        "EBPFReportProcessDownstream",
    )
    assert (ping.input_type.name, ping.output_type.name) == ("EBPFProcessPingPkgList", "Commands")
    assert not report.client_streaming and not ping.client_streaming
    # The gRPC path the stub calls is the OAP's.
    source = Process_pb2_grpc.__file__
    with open(source) as f:
        assert "'/skywalking.v3.EBPFProcessService/reportProcesses'" in f.read()


# --- bytes written by hand from the field numbers ------------------------------------------------


def varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int32/int64 go on the wire as 10-byte two's complement
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def key(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def uint(number: int, value: int) -> bytes:
    return key(number, 0) + varint(value)


def length(number: int, payload: bytes | str) -> bytes:
    data = payload.encode() if isinstance(payload, str) else payload
    return key(number, 2) + varint(len(data)) + data


def test_profiling_data_decodes_from_hand_written_bytes() -> None:
    task = length(1, "task-1") + length(2, "proc-9") + uint(3, 1_700_000_000_000) + uint(4, 1_700_000_005_000)
    kernel = uint(1, 0) + uint(2, 77) + length(3, "do_nanosleep") + length(3, "hrtimer_nanosleep")
    user_half = uint(1, 1) + uint(2, 77) + length(3, "offcpu_sleep_ms")
    off = length(1, kernel) + length(1, user_half) + uint(2, 12) + uint(3, 5_000_000_123)
    data = Profile_pb2.EBPFProfilingData.FromString(length(1, task) + length(3, off))

    assert data.task.taskId == "task-1"
    assert data.task.processId == "proc-9"
    assert data.task.profilingStartTime == 1_700_000_000_000
    assert data.task.currentTime == 1_700_000_005_000
    assert data.WhichOneof("profiling") == "offCPU"
    assert data.offCPU.switchCount == 12
    assert data.offCPU.duration == 5_000_000_123
    assert [s.stackType for s in data.offCPU.stacks] == [
        Profile_pb2.PROCESS_KERNEL_SPACE,
        Profile_pb2.PROCESS_USER_SPACE,
    ]
    assert [s.stackId for s in data.offCPU.stacks] == [77, 77]
    assert list(data.offCPU.stacks[0].stackSymbols) == ["do_nanosleep", "hrtimer_nanosleep"]
    assert list(data.offCPU.stacks[1].stackSymbols) == ["offcpu_sleep_ms"]
    # And our encoding of the same message is these bytes (fields in number order; proto3 leaves
    # out the default stackType 0).
    kernel_no_default = kernel[len(uint(1, 0)) :]
    expected = length(1, task) + length(3, length(1, kernel_no_default) + off[len(length(1, kernel)) :])
    assert data.SerializeToString() == expected


def test_on_cpu_and_query_from_hand_written_bytes() -> None:
    data = Profile_pb2.EBPFProfilingData.FromString(length(2, uint(2, 5)))
    assert data.WhichOneof("profiling") == "onCPU" and data.onCPU.dumpCount == 5
    query = Profile_pb2.EBPFProfilingTaskQuery.FromString(length(1, "rover-1") + uint(2, 1234))
    assert (query.roverInstanceId, query.latestUpdateTime) == ("rover-1", 1234)


def test_process_messages_from_hand_written_bytes() -> None:
    entity = length(1, "OS_LINUX") + length(2, "svc") + length(3, "inst") + length(4, "app-1") + length(5, "l1")
    prop = length(1, "support_ebpf_profiling") + length(2, "true")
    host = length(1, entity) + uint(2, 4242) + length(3, prop)
    report = Process_pb2.EBPFProcessReportList.FromString(length(1, length(1, host)) + length(2, "agent-7"))
    assert report.ebpfAgentID == "agent-7"
    p = report.processes[0]
    assert p.WhichOneof("metadata") == "hostProcess"
    assert p.hostProcess.pid == 4242
    e = p.hostProcess.entity
    assert (e.layer, e.serviceName, e.instanceName, e.processName, list(e.labels)) == (
        "OS_LINUX",
        "svc",
        "inst",
        "app-1",
        ["l1"],
    )
    assert (p.hostProcess.properties[0].key, p.hostProcess.properties[0].value) == (
        "support_ebpf_profiling",
        "true",
    )

    k8s = Process_pb2.EBPFProcessProperties.FromString(length(2, uint(2, 7)))
    assert k8s.WhichOneof("metadata") == "k8sProcess" and k8s.k8sProcess.pid == 7

    down = Process_pb2.EBPFReportProcessDownstream.FromString(
        length(1, length(1, "abc123") + length(2, uint(1, 4242) + length(2, length(4, "app-1"))))
    )
    d = down.processes[0]
    assert d.processId == "abc123" and d.WhichOneof("process") == "hostProcess"
    assert d.hostProcess.pid == 4242 and d.hostProcess.entityMetadata.processName == "app-1"
    down_k8s = Process_pb2.EBPFProcessDownstream.FromString(length(3, uint(1, 8)))
    assert down_k8s.WhichOneof("process") == "k8sProcess" and down_k8s.k8sProcess.pid == 8

    ping = Process_pb2.EBPFProcessPingPkgList.FromString(
        length(1, length(1, entity) + length(2, prop)) + length(2, "agent-7")
    )
    assert ping.ebpfAgentID == "agent-7"
    assert ping.processes[0].entityMetadata.processName == "app-1"
    assert ping.processes[0].properties[0].value == "true"

    commands = Common_pb2.Commands.FromString(
        length(1, length(1, "EBPFProfilingTaskQuery") + length(2, length(1, "TaskId") + length(2, "t1")))
    )
    assert commands.commands[0].command == "EBPFProfilingTaskQuery"
    assert (commands.commands[0].args[0].key, commands.commands[0].args[0].value) == ("TaskId", "t1")


def test_committed_generated_code_is_current() -> None:
    modules = {"common/Common.proto": Common_pb2, "ebpf/profiling/Profile.proto": Profile_pb2,
               "ebpf/profiling/Process.proto": Process_pb2}
    assert set(modules) == set(generate.PROTOS)
    stale = stale_descriptors(modules, generate.HERE)
    assert not stale, f"regenerate as {generate.__file__} says ({stale})"


def test_vendored_protos_are_upstream_files_with_their_licence() -> None:
    for proto in generate.PROTOS:
        text = (generate.HERE / proto).read_text()
        assert text.startswith("/*\n * Licensed to the Apache Software Foundation (ASF)"), proto
        assert "http://www.apache.org/licenses/LICENSE-2.0" in text, proto


def test_generated_modules_import_inside_the_package() -> None:
    # protoc writes `from common import Common_pb2`; the committed files import through the package.
    for name in generate.generated_names():
        if not name.endswith(".py"):
            continue
        text = (generate.HERE / name).read_text()
        assert "\nfrom common import" not in text and "\nfrom ebpf" not in text, name
