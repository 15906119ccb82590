"""Whether committed protobuf gencode is current: the descriptor a module registers equals what its
`.proto` compiles to now. Compared as descriptors, not as text, because the gencode is made with an
older grpcio-tools on purpose (its version is the package's protobuf/grpcio floor), while the test
environment has whatever grpcio-tools it has."""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import ModuleType

from google.protobuf import descriptor_pb2

__all__ = ["stale_descriptors"]


def _normalized(fd: descriptor_pb2.FileDescriptorProto) -> descriptor_pb2.FileDescriptorProto:
    # protoc fills json_name in descriptor sets but gencode leaves it out; neither is a schema change.
    fd.ClearField("source_code_info")
    pending = list(fd.message_type)
    while pending:
        message = pending.pop()
        for field in message.field:
            field.ClearField("json_name")
        pending.extend(message.nested_type)
    return fd


def stale_descriptors(modules: dict[str, ModuleType], include: Path) -> list[str]:
    """The `.proto` names (relative to `include`) whose module's descriptor differs from a fresh compile."""
    from grpc_tools import protoc  # a test dependency only

    well_known = Path(protoc.__file__).resolve().parent / "_proto"
    stale = []
    with tempfile.TemporaryDirectory() as tmp:
        for proto, module in modules.items():
            out = Path(tmp) / "set.pb"
            if protoc.main(["protoc", f"-I{include}", f"-I{well_known}", f"--descriptor_set_out={out}", proto]) != 0:
                raise RuntimeError(f"protoc failed on {proto}")
            fresh = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
            committed = descriptor_pb2.FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb)
            if _normalized(fresh) != _normalized(committed):
                stale.append(proto)
    return stale
