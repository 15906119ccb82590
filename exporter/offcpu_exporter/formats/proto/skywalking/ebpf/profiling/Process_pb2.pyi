from offcpu_exporter.formats.proto.skywalking.common import Common_pb2 as _Common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EBPFProcessReportList(_message.Message):
    __slots__ = ("processes", "ebpfAgentID")
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    EBPFAGENTID_FIELD_NUMBER: _ClassVar[int]
    processes: _containers.RepeatedCompositeFieldContainer[EBPFProcessProperties]
    ebpfAgentID: str
    def __init__(self, processes: _Optional[_Iterable[_Union[EBPFProcessProperties, _Mapping]]] = ..., ebpfAgentID: _Optional[str] = ...) -> None: ...

class EBPFProcessProperties(_message.Message):
    __slots__ = ("hostProcess", "k8sProcess")
    HOSTPROCESS_FIELD_NUMBER: _ClassVar[int]
    K8SPROCESS_FIELD_NUMBER: _ClassVar[int]
    hostProcess: EBPFHostProcessMetadata
    k8sProcess: EBPFKubernetesProcessMetadata
    def __init__(self, hostProcess: _Optional[_Union[EBPFHostProcessMetadata, _Mapping]] = ..., k8sProcess: _Optional[_Union[EBPFKubernetesProcessMetadata, _Mapping]] = ...) -> None: ...

class EBPFHostProcessMetadata(_message.Message):
    __slots__ = ("entity", "pid", "properties")
    ENTITY_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    entity: EBPFProcessEntityMetadata
    pid: int
    properties: _containers.RepeatedCompositeFieldContainer[_Common_pb2.KeyStringValuePair]
    def __init__(self, entity: _Optional[_Union[EBPFProcessEntityMetadata, _Mapping]] = ..., pid: _Optional[int] = ..., properties: _Optional[_Iterable[_Union[_Common_pb2.KeyStringValuePair, _Mapping]]] = ...) -> None: ...

class EBPFProcessEntityMetadata(_message.Message):
    __slots__ = ("layer", "serviceName", "instanceName", "processName", "labels")
    LAYER_FIELD_NUMBER: _ClassVar[int]
    SERVICENAME_FIELD_NUMBER: _ClassVar[int]
    INSTANCENAME_FIELD_NUMBER: _ClassVar[int]
    PROCESSNAME_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    layer: str
    serviceName: str
    instanceName: str
    processName: str
    labels: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, layer: _Optional[str] = ..., serviceName: _Optional[str] = ..., instanceName: _Optional[str] = ..., processName: _Optional[str] = ..., labels: _Optional[_Iterable[str]] = ...) -> None: ...

class EBPFKubernetesProcessMetadata(_message.Message):
    __slots__ = ("entity", "pid", "properties")
    ENTITY_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    entity: EBPFProcessEntityMetadata
    pid: int
    properties: _containers.RepeatedCompositeFieldContainer[_Common_pb2.KeyStringValuePair]
    def __init__(self, entity: _Optional[_Union[EBPFProcessEntityMetadata, _Mapping]] = ..., pid: _Optional[int] = ..., properties: _Optional[_Iterable[_Union[_Common_pb2.KeyStringValuePair, _Mapping]]] = ...) -> None: ...

class EBPFReportProcessDownstream(_message.Message):
    __slots__ = ("processes",)
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    processes: _containers.RepeatedCompositeFieldContainer[EBPFProcessDownstream]
    def __init__(self, processes: _Optional[_Iterable[_Union[EBPFProcessDownstream, _Mapping]]] = ...) -> None: ...

class EBPFProcessDownstream(_message.Message):
    __slots__ = ("processId", "hostProcess", "k8sProcess")
    PROCESSID_FIELD_NUMBER: _ClassVar[int]
    HOSTPROCESS_FIELD_NUMBER: _ClassVar[int]
    K8SPROCESS_FIELD_NUMBER: _ClassVar[int]
    processId: str
    hostProcess: EBPFHostProcessDownstream
    k8sProcess: EBPFKubernetesProcessDownstream
    def __init__(self, processId: _Optional[str] = ..., hostProcess: _Optional[_Union[EBPFHostProcessDownstream, _Mapping]] = ..., k8sProcess: _Optional[_Union[EBPFKubernetesProcessDownstream, _Mapping]] = ...) -> None: ...

class EBPFHostProcessDownstream(_message.Message):
    __slots__ = ("pid", "entityMetadata")
    PID_FIELD_NUMBER: _ClassVar[int]
    ENTITYMETADATA_FIELD_NUMBER: _ClassVar[int]
    pid: int
    entityMetadata: EBPFProcessEntityMetadata
    def __init__(self, pid: _Optional[int] = ..., entityMetadata: _Optional[_Union[EBPFProcessEntityMetadata, _Mapping]] = ...) -> None: ...

class EBPFKubernetesProcessDownstream(_message.Message):
    __slots__ = ("pid", "entityMetadata")
    PID_FIELD_NUMBER: _ClassVar[int]
    ENTITYMETADATA_FIELD_NUMBER: _ClassVar[int]
    pid: int
    entityMetadata: EBPFProcessEntityMetadata
    def __init__(self, pid: _Optional[int] = ..., entityMetadata: _Optional[_Union[EBPFProcessEntityMetadata, _Mapping]] = ...) -> None: ...

class EBPFProcessPingPkgList(_message.Message):
    __slots__ = ("processes", "ebpfAgentID")
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    EBPFAGENTID_FIELD_NUMBER: _ClassVar[int]
    processes: _containers.RepeatedCompositeFieldContainer[EBPFProcessPingPkg]
    ebpfAgentID: str
    def __init__(self, processes: _Optional[_Iterable[_Union[EBPFProcessPingPkg, _Mapping]]] = ..., ebpfAgentID: _Optional[str] = ...) -> None: ...

class EBPFProcessPingPkg(_message.Message):
    __slots__ = ("entityMetadata", "properties")
    ENTITYMETADATA_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    entityMetadata: EBPFProcessEntityMetadata
    properties: _containers.RepeatedCompositeFieldContainer[_Common_pb2.KeyStringValuePair]
    def __init__(self, entityMetadata: _Optional[_Union[EBPFProcessEntityMetadata, _Mapping]] = ..., properties: _Optional[_Iterable[_Union[_Common_pb2.KeyStringValuePair, _Mapping]]] = ...) -> None: ...
