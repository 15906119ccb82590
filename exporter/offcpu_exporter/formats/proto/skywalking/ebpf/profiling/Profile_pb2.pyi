from offcpu_exporter.formats.proto.skywalking.common import Common_pb2 as _Common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EBPFProfilingStackType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROCESS_KERNEL_SPACE: _ClassVar[EBPFProfilingStackType]
    PROCESS_USER_SPACE: _ClassVar[EBPFProfilingStackType]
PROCESS_KERNEL_SPACE: EBPFProfilingStackType
PROCESS_USER_SPACE: EBPFProfilingStackType

class EBPFProfilingTaskQuery(_message.Message):
    __slots__ = ("roverInstanceId", "latestUpdateTime")
    ROVERINSTANCEID_FIELD_NUMBER: _ClassVar[int]
    LATESTUPDATETIME_FIELD_NUMBER: _ClassVar[int]
    roverInstanceId: str
    latestUpdateTime: int
    def __init__(self, roverInstanceId: _Optional[str] = ..., latestUpdateTime: _Optional[int] = ...) -> None: ...

class EBPFProfilingData(_message.Message):
    __slots__ = ("task", "onCPU", "offCPU")
    TASK_FIELD_NUMBER: _ClassVar[int]
    ONCPU_FIELD_NUMBER: _ClassVar[int]
    OFFCPU_FIELD_NUMBER: _ClassVar[int]
    task: EBPFProfilingTaskMetadata
    onCPU: EBPFOnCPUProfiling
    offCPU: EBPFOffCPUProfiling
    def __init__(self, task: _Optional[_Union[EBPFProfilingTaskMetadata, _Mapping]] = ..., onCPU: _Optional[_Union[EBPFOnCPUProfiling, _Mapping]] = ..., offCPU: _Optional[_Union[EBPFOffCPUProfiling, _Mapping]] = ...) -> None: ...

class EBPFProfilingTaskMetadata(_message.Message):
    __slots__ = ("taskId", "processId", "profilingStartTime", "currentTime")
    TASKID_FIELD_NUMBER: _ClassVar[int]
    PROCESSID_FIELD_NUMBER: _ClassVar[int]
    PROFILINGSTARTTIME_FIELD_NUMBER: _ClassVar[int]
    CURRENTTIME_FIELD_NUMBER: _ClassVar[int]
    taskId: str
    processId: str
    profilingStartTime: int
    currentTime: int
    def __init__(self, taskId: _Optional[str] = ..., processId: _Optional[str] = ..., profilingStartTime: _Optional[int] = ..., currentTime: _Optional[int] = ...) -> None: ...

class EBPFProfilingStackMetadata(_message.Message):
    __slots__ = ("stackType", "stackId", "stackSymbols")
    STACKTYPE_FIELD_NUMBER: _ClassVar[int]
    STACKID_FIELD_NUMBER: _ClassVar[int]
    STACKSYMBOLS_FIELD_NUMBER: _ClassVar[int]
    stackType: EBPFProfilingStackType
    stackId: int
    stackSymbols: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, stackType: _Optional[_Union[EBPFProfilingStackType, str]] = ..., stackId: _Optional[int] = ..., stackSymbols: _Optional[_Iterable[str]] = ...) -> None: ...

class EBPFOnCPUProfiling(_message.Message):
    __slots__ = ("stacks", "dumpCount")
    STACKS_FIELD_NUMBER: _ClassVar[int]
    DUMPCOUNT_FIELD_NUMBER: _ClassVar[int]
    stacks: _containers.RepeatedCompositeFieldContainer[EBPFProfilingStackMetadata]
    dumpCount: int
    def __init__(self, stacks: _Optional[_Iterable[_Union[EBPFProfilingStackMetadata, _Mapping]]] = ..., dumpCount: _Optional[int] = ...) -> None: ...

class EBPFOffCPUProfiling(_message.Message):
    __slots__ = ("stacks", "switchCount", "duration")
    STACKS_FIELD_NUMBER: _ClassVar[int]
    SWITCHCOUNT_FIELD_NUMBER: _ClassVar[int]
    DURATION_FIELD_NUMBER: _ClassVar[int]
    stacks: _containers.RepeatedCompositeFieldContainer[EBPFProfilingStackMetadata]
    switchCount: int
    duration: int
    def __init__(self, stacks: _Optional[_Iterable[_Union[EBPFProfilingStackMetadata, _Mapping]]] = ..., switchCount: _Optional[int] = ..., duration: _Optional[int] = ...) -> None: ...
