from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DetectPoint(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    client: _ClassVar[DetectPoint]
    server: _ClassVar[DetectPoint]
    proxy: _ClassVar[DetectPoint]
client: DetectPoint
server: DetectPoint
proxy: DetectPoint

class KeyStringValuePair(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: str
    value: str
    def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class CPU(_message.Message):
    __slots__ = ("usagePercent",)
    USAGEPERCENT_FIELD_NUMBER: _ClassVar[int]
    usagePercent: float
    def __init__(self, usagePercent: _Optional[float] = ...) -> None: ...

class Commands(_message.Message):
    __slots__ = ("commands",)
    COMMANDS_FIELD_NUMBER: _ClassVar[int]
    commands: _containers.RepeatedCompositeFieldContainer[Command]
    def __init__(self, commands: _Optional[_Iterable[_Union[Command, _Mapping]]] = ...) -> None: ...

class Command(_message.Message):
    __slots__ = ("command", "args")
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    command: str
    args: _containers.RepeatedCompositeFieldContainer[KeyStringValuePair]
    def __init__(self, command: _Optional[str] = ..., args: _Optional[_Iterable[_Union[KeyStringValuePair, _Mapping]]] = ...) -> None: ...
