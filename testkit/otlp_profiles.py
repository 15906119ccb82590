"""Validating and decoding OTLP profiles requests (v1development, proto v1.10.0) in tests.

`check_request` asserts the rules every receiver relies on; `decode` flattens a request into
plain samples (resource attributes, sample type, function names leaf first, value, attributes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import (
    ExportProfilesServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

__all__ = ["DecodedSample", "check_request", "decode"]

_TABLES = (
    "mapping_table",
    "location_table",
    "function_table",
    "link_table",
    "attribute_table",
    "stack_table",
)


def _any(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


def check_request(request: ExportProfilesServiceRequest) -> None:
    """Raises AssertionError naming the first violated rule."""
    d = request.dictionary
    assert request.HasField("dictionary"), "no dictionary"
    assert d.string_table and d.string_table[0] == "", "string_table[0] must be empty"
    for name in _TABLES:
        table = getattr(d, name)
        assert len(table) >= 1, f"{name} has no index 0"
        assert table[0].ByteSize() == 0, f"{name}[0] is not the empty entry: {table[0]}"
    n_str, n_attr = len(d.string_table), len(d.attribute_table)

    def attrs_ok(indices: Any, where: str) -> None:
        for i in indices:
            assert 0 < i < n_attr, f"{where}: attribute index {i} out of range"

    for i, m in enumerate(d.mapping_table[1:], 1):
        assert 0 <= m.filename_strindex < n_str, f"mapping {i}: filename index"
        attrs_ok(m.attribute_indices, f"mapping {i}")
    for i, f in enumerate(d.function_table[1:], 1):
        for idx in (f.name_strindex, f.system_name_strindex, f.filename_strindex):
            assert 0 <= idx < n_str, f"function {i}: string index {idx}"
        assert f.name_strindex > 0, f"function {i} has no name"
    for i, loc in enumerate(d.location_table[1:], 1):
        assert 0 <= loc.mapping_index < len(d.mapping_table), f"location {i}: mapping index"
        assert loc.lines, f"location {i} has no line"
        for line in loc.lines:
            assert 0 < line.function_index < len(d.function_table), f"location {i}: function index"
        attrs_ok(loc.attribute_indices, f"location {i}")
    for i, st in enumerate(d.stack_table[1:], 1):
        assert st.location_indices, f"stack {i} is empty"
        for li in st.location_indices:
            assert 0 < li < len(d.location_table), f"stack {i}: location index {li}"
    for i, a in enumerate(d.attribute_table[1:], 1):
        assert 0 < a.key_strindex < n_str, f"attribute {i}: key index"
        assert 0 <= a.unit_strindex < n_str, f"attribute {i}: unit index"
    assert request.resource_profiles, "no resource_profiles"
    for rp in request.resource_profiles:
        assert rp.scope_profiles, "resource without scope_profiles"
        for sp in rp.scope_profiles:
            assert sp.profiles, "scope without profiles"
            for p in sp.profiles:
                assert 0 < p.sample_type.type_strindex < n_str and 0 < p.sample_type.unit_strindex < n_str
                assert not p.HasField("period_type"), "period_type must be unset (off-CPU convention)"
                assert p.period == 0, "period must be 0 (off-CPU convention)"
                assert p.samples, "profile without samples"
                assert len(p.profile_id) == 16 and any(p.profile_id), "profile_id must be 16 non-zero bytes"
                identities = set()
                for s in p.samples:
                    assert 0 < s.stack_index < len(d.stack_table), "sample: stack index"
                    assert 0 <= s.link_index < len(d.link_table), "sample: link index"
                    attrs_ok(s.attribute_indices, "sample")
                    assert len(s.values) == 1 and s.values[0] > 0, f"sample values {list(s.values)}"
                    assert not s.timestamps_unix_nano, "unexpected timestamps"
                    ident = (s.stack_index, frozenset(s.attribute_indices), s.link_index)
                    assert ident not in identities, "duplicate sample identity (not merged)"
                    identities.add(ident)


@dataclass(frozen=True)
class DecodedSample:
    resource: dict[str, Any]
    sample_type: str  # "type/unit"
    functions: tuple[str, ...]  # leaf first
    frame_types: tuple[str, ...]
    mappings: tuple[str, ...]
    value: int
    attributes: dict[str, Any]
    time_unix_nano: int
    duration_nano: int


def decode(request: ExportProfilesServiceRequest) -> list[DecodedSample]:
    d = request.dictionary
    s = d.string_table

    def attrs(indices: Any) -> dict[str, Any]:
        return {s[d.attribute_table[i].key_strindex]: _any(d.attribute_table[i].value) for i in indices}

    out = []
    for rp in request.resource_profiles:
        resource = {kv.key: _any(kv.value) for kv in rp.resource.attributes}
        for sp in rp.scope_profiles:
            for p in sp.profiles:
                st = f"{s[p.sample_type.type_strindex]}/{s[p.sample_type.unit_strindex]}"
                for sample in p.samples:
                    locs = [d.location_table[i] for i in d.stack_table[sample.stack_index].location_indices]
                    out.append(
                        DecodedSample(
                            resource=resource,
                            sample_type=st,
                            functions=tuple(
                                s[d.function_table[loc.lines[0].function_index].name_strindex] for loc in locs
                            ),
                            frame_types=tuple(
                                str(attrs(loc.attribute_indices).get("profile.frame.type")) for loc in locs
                            ),
                            mappings=tuple(
                                s[d.mapping_table[loc.mapping_index].filename_strindex] for loc in locs
                            ),
                            value=sum(sample.values),
                            attributes=attrs(sample.attribute_indices),
                            time_unix_nano=p.time_unix_nano,
                            duration_nano=p.duration_nano,
                        )
                    )
    return out
