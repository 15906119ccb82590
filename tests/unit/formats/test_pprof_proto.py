from __future__ import annotations

from pathlib import Path

import pytest

from exporter.formats.proto import regenerate


def test_generated_module_is_current(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    for fresh in regenerate.generate(tmp_path):
        committed = regenerate.HERE / fresh.name
        assert committed.read_bytes() == fresh.read_bytes(), (
            f"{committed} is stale: run python -m exporter.formats.proto.regenerate"
        )


def test_descriptor_name_is_qualified() -> None:
    from exporter.formats.proto import profile_pb2

    assert profile_pb2.DESCRIPTOR.name == "exporter/formats/proto/profile.proto"
    assert profile_pb2.DESCRIPTOR.package == "perftools.profiles"
