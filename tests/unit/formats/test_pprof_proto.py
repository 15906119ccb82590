from __future__ import annotations

import ast
from pathlib import Path

from google.protobuf.message import Message

from offcpu_exporter.formats.proto import regenerate


def serialized_descriptor(module: Path) -> bytes:
    """The FileDescriptorProto bytes a generated module registers: what the .proto compiles to,
    independent of the protoc version that wrote the surrounding code."""
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "AddSerializedFile":
            arg = node.args[0]
            assert isinstance(arg, ast.Constant) and isinstance(arg.value, bytes)
            return arg.value
    raise AssertionError(f"no AddSerializedFile call in {module}")


def test_generated_module_is_current(tmp_path: Path) -> None:
    fresh_py, fresh_pyi = regenerate.generate(tmp_path)
    committed = regenerate.HERE / fresh_py.name
    assert serialized_descriptor(committed) == serialized_descriptor(fresh_py), (
        f"{committed} is stale: run python -m offcpu_exporter.formats.proto.regenerate"
    )
    stub = (regenerate.HERE / fresh_pyi.name).read_text()
    for message in ("Profile", "ValueType", "Sample", "Label", "Mapping", "Location", "Line", "Function"):
        assert f"class {message}(_message.Message)" in stub


def test_the_proto_is_pprofs_with_its_licence() -> None:
    text = (regenerate.HERE / "profile.proto").read_text()
    assert text.startswith("// Copyright 2016 Google Inc. All Rights Reserved.\n//\n// Licensed under the Apache")
    assert "package perftools.profiles;" in text


def test_descriptor_name_is_qualified() -> None:
    from offcpu_exporter.formats.proto import profile_pb2

    assert profile_pb2.DESCRIPTOR.name == "offcpu_exporter/formats/proto/profile.proto"
    assert profile_pb2.DESCRIPTOR.package == "perftools.profiles"


def test_field_numbers_are_the_wire_contract() -> None:
    """The numbers from the pprof schema (specs/otlp-and-pprof.md); a renumbering breaks every reader."""
    from offcpu_exporter.formats.proto import profile_pb2 as pb

    expected: dict[type[Message], dict[str, int]] = {
        pb.Profile: {
            "sample_type": 1,
            "sample": 2,
            "mapping": 3,
            "location": 4,
            "function": 5,
            "string_table": 6,
            "drop_frames": 7,
            "keep_frames": 8,
            "time_nanos": 9,
            "duration_nanos": 10,
            "period_type": 11,
            "period": 12,
            "comment": 13,
            "default_sample_type": 14,
        },
        pb.ValueType: {"type": 1, "unit": 2},
        pb.Sample: {"location_id": 1, "value": 2, "label": 3},
        pb.Label: {"key": 1, "str": 2, "num": 3, "num_unit": 4},
        pb.Mapping: {
            "id": 1,
            "memory_start": 2,
            "memory_limit": 3,
            "file_offset": 4,
            "filename": 5,
            "build_id": 6,
            "has_functions": 7,
            "has_filenames": 8,
            "has_line_numbers": 9,
            "has_inline_frames": 10,
        },
        pb.Location: {"id": 1, "mapping_id": 2, "address": 3, "line": 4, "is_folded": 5},
        pb.Line: {"function_id": 1, "line": 2, "column": 3},
        pb.Function: {"id": 1, "name": 2, "system_name": 3, "filename": 4, "start_line": 5},
    }
    for message, fields in expected.items():
        assert {f.name: f.number for f in message.DESCRIPTOR.fields} == fields, message.DESCRIPTOR.name
