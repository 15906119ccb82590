from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import pytest
from google.protobuf import text_format
from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import (
    ExportProfilesServiceRequest,
)

from offcpu_exporter import __version__
from offcpu_exporter.formats.otlp_profiles import (
    EncodeOptions,
    encode_profiles,
    encode_profiles_split,
    jit_runtime,
)
from offcpu_exporter.snapshot import Counter, Reason
from testkit import golden
from testkit.otlp_profiles import check_request, decode
from testkit.snapshots import (
    APP,
    DB,
    STACK_LOCK,
    STACK_PIPE,
    STACK_SLEEP,
    snapshot_of,
    two_process_snapshot,
)

GOLDEN = Path(__file__).parent / "golden" / "two_process.txtpb"
OPTIONS = EncodeOptions(host_name="node-1", extra_resource_attributes={"deployment.environment.name": "test"})


def _encode(snapshot, options=OPTIONS) -> ExportProfilesServiceRequest:
    request = encode_profiles(snapshot, options)
    assert request is not None
    check_request(request)
    # what a receiver sees: the bytes parsed back with the official schema
    return ExportProfilesServiceRequest.FromString(request.SerializeToString())


def test_request_is_valid_and_carries_the_interval_increases() -> None:
    snap = two_process_snapshot()
    samples = decode(_encode(snap))
    totals: dict[tuple[int, str], int] = defaultdict(int)
    for s in samples:
        totals[(s.resource["process.pid"], s.sample_type)] += s.value
    assert totals == {
        (4242, "off_cpu/nanoseconds"): 550_000_000,
        (4242, "off_cpu_switches/count"): 8,
        (777, "off_cpu/nanoseconds"): 120_000_000,
        (777, "off_cpu_switches/count"): 6,
    }
    for s in samples:
        assert s.time_unix_nano == snap.interval_start_ns
        assert s.duration_nano == 5_000_000_000


def test_no_period_and_one_value_per_sample() -> None:
    request = _encode(two_process_snapshot())
    for rp in request.resource_profiles:
        (sp,) = rp.scope_profiles
        assert sp.scope.name == "offcpu-exporter" and sp.scope.version == __version__
        assert [request.dictionary.string_table[p.sample_type.type_strindex] for p in sp.profiles] == [
            "off_cpu",
            "off_cpu_switches",
        ]
        for p in sp.profiles:
            assert not p.HasField("period_type") and p.period == 0
            assert all(len(s.values) == 1 for s in p.samples)


def test_stacks_are_leaf_first_kernel_then_user_with_frame_types() -> None:
    samples = [s for s in decode(_encode(two_process_snapshot())) if s.sample_type == "off_cpu/nanoseconds"]
    sleep = next(s for s in samples if "offcpu_sleep_ms" in s.functions)
    assert sleep.functions == (
        "finish_task_switch.isra.0",
        "__schedule",
        "schedule",
        "do_nanosleep",
        "entry_SYSCALL_64_after_hwframe",
        "offcpu_sleep_ms",
        "main",
        "__libc_start_call_main",
    )
    assert sleep.frame_types == ("kernel",) * 5 + ("native",) * 3
    assert sleep.mappings == ("[kernel]",) * 5 + ("/usr/bin/app",) * 2 + ("/usr/lib/x86_64-linux-gnu/libc.so.6",)
    assert sleep.value == 300_000_000
    assert sleep.attributes == {"thread.id": 4243, "thread.name": "worker-1", "offcpu.reason": "sleeping"}

    lock = next(s for s in samples if "futex_wait" in s.functions)
    assert lock.functions[-1] == "[unknown] libfoo.so+0x1a2b"
    assert lock.frame_types[-1] == "native" and lock.mappings[-1] == ""  # placeholder: no mapping
    assert lock.attributes == {"offcpu.reason": "sleeping"}  # per process: no thread attributes

    jit = next(s for s in samples if s.resource["process.pid"] == 777)
    assert jit.frame_types[-2:] == ("v8js", "native")


def test_resource_attributes() -> None:
    request = _encode(two_process_snapshot())
    resources = [{kv.key: kv.value for kv in rp.resource.attributes} for rp in request.resource_profiles]
    app = next(r for r in resources if r["process.pid"].int_value == APP.pid)
    as_str = {k: v.string_value for k, v in app.items() if k != "process.pid"}
    assert as_str == {
        "deployment.environment.name": "test",
        "process.executable.name": "app",
        "process.executable.path": "/usr/bin/app",
        "process.command": "/usr/bin/app",
        "host.name": "node-1",
        "container.id": APP.container_id,
        "k8s.namespace.name": "shop",
        "k8s.pod.name": "app-7d9f",
        "k8s.pod.uid": "0b9c-uid",
        "k8s.container.name": "app",
        "service.name": "app",
    }
    db = next(r for r in resources if r["process.pid"].int_value == DB.pid)
    assert "container.id" not in db and "k8s.pod.name" not in db
    assert db["service.name"].string_value == "node"


def test_service_name_template_and_env_service_name_ignored() -> None:
    options = EncodeOptions(service_name="{namespace}/{container}", extra_resource_attributes={"service.name": "x"})
    request = _encode(two_process_snapshot(), options)
    names = {
        kv.value.string_value
        for rp in request.resource_profiles
        for kv in rp.resource.attributes
        if kv.key == "service.name"
    }
    assert names == {"shop/app", "node"}  # outside Kubernetes: the executable name


def test_mappings_carry_build_ids() -> None:
    d = _encode(two_process_snapshot()).dictionary
    s = d.string_table
    build_ids = {}
    for m in d.mapping_table[1:]:
        attrs = {
            s[d.attribute_table[i].key_strindex]: d.attribute_table[i].value.string_value for i in m.attribute_indices
        }
        build_ids[s[m.filename_strindex]] = attrs.get("process.executable.build_id.gnu")
    assert build_ids["/usr/bin/app"] == "feedface" * 5
    assert build_ids["/usr/lib/x86_64-linux-gnu/libc.so.6"] == "0123456789abcdef0123456789abcdef01234567"
    assert build_ids["[kernel]"] is None
    assert len(set(s)) == len(s), "string table has duplicates"


def test_duplicate_identities_are_merged() -> None:
    c = Counter
    snap = snapshot_of(
        [
            # same stack, thread and reason twice (e.g. two kernel stack ids symbolized alike)
            (APP, 10, "t", Reason.SLEEPING, STACK_SLEEP, c(2, 20), c(1, 10)),
            (APP, 10, "t", Reason.SLEEPING, STACK_SLEEP, c(4, 40), c(2, 30)),
            # per-process rows differing only in a thread name the encoder does not emit
            (APP, 0, "a", Reason.SLEEPING, STACK_PIPE, c(1, 5), c(1, 5)),
            (APP, 0, "b", Reason.SLEEPING, STACK_PIPE, c(1, 7), c(1, 7)),
            # different reason: a different sample
            (APP, 10, "t", Reason.UNINTERRUPTIBLE, STACK_SLEEP, c(1, 100), c(1, 100)),
        ]
    )
    samples = [s for s in decode(_encode(snap)) if s.sample_type == "off_cpu/nanoseconds"]
    by = {
        (s.functions[-3] if len(s.functions) > 2 else "", s.attributes.get("offcpu.reason")): s.value for s in samples
    }
    assert len(samples) == 3
    assert sorted(s.value for s in samples) == [12, 40, 100]
    assert sum(by.values()) == 152


def test_zero_values_are_left_out() -> None:
    c = Counter
    # ns without a switch in this interval (a block that began before the previous flush)
    snap = snapshot_of([(APP, 1, "t", Reason.SLEEPING, STACK_LOCK, c(1, 99), c(0, 99))])
    request = _encode(snap)
    types = [
        request.dictionary.string_table[p.sample_type.type_strindex]
        for p in request.resource_profiles[0].scope_profiles[0].profiles
    ]
    assert types == ["off_cpu"]


def test_empty_intervals_produce_no_request() -> None:
    c = Counter
    idle = snapshot_of([(APP, 1, "t", Reason.SLEEPING, STACK_LOCK, c(5, 500), c(0, 0))])
    assert encode_profiles(idle) is None
    assert encode_profiles(two_process_snapshot(sequence=0)) is None
    assert encode_profiles_split(idle) == []


def test_switches_profile_can_be_turned_off() -> None:
    request = _encode(two_process_snapshot(), EncodeOptions(switches_profile=False))
    assert {len(rp.scope_profiles[0].profiles) for rp in request.resource_profiles} == {1}


def test_split_into_one_request_per_process_when_too_big() -> None:
    snap = two_process_snapshot()
    whole = encode_profiles(snap, OPTIONS)
    assert whole is not None
    parts = encode_profiles_split(snap, OPTIONS, max_bytes=whole.ByteSize() - 1)
    assert len(parts) == 2
    for part in parts:
        check_request(part)
    assert [s for p in parts for s in decode(p)] == decode(whole)
    assert encode_profiles_split(snap, OPTIONS) == [whole]


def test_profile_ids_are_unique_and_stable() -> None:
    a, b = _encode(two_process_snapshot()), _encode(two_process_snapshot())
    assert a.SerializeToString() == b.SerializeToString()
    ids = [p.profile_id for rp in a.resource_profiles for p in rp.scope_profiles[0].profiles]
    assert len(set(ids)) == len(ids) == 4
    later = _encode(two_process_snapshot(sequence=4))
    assert not set(ids) & {p.profile_id for rp in later.resource_profiles for p in rp.scope_profiles[0].profiles}


@pytest.mark.parametrize(
    ("exe", "runtime"),
    [
        ("node", "v8js"),
        ("java", "jvm"),
        ("python3.12", "cpython"),
        ("dotnet", "dotnet"),
        ("nodemon", "native"),
        ("app", "native"),
    ],
)
def test_jit_runtime_from_executable(exe: str, runtime: str) -> None:
    assert jit_runtime(exe) == runtime


def test_golden() -> None:
    """The whole request in text form. Regenerate with OFFCPU_UPDATE_GOLDEN=1 after a deliberate change."""
    text = text_format.MessageToString(_encode(two_process_snapshot()))
    text = text.replace(f'version: "{__version__}"', 'version: "VERSION"')
    golden.rewrite_if_requested(GOLDEN, text)
    assert text == GOLDEN.read_text()


def test_unresolved_frame_in_a_known_file_keeps_mapping_and_address() -> None:
    from offcpu_exporter.snapshot import Frame, FrameKind, Stack

    unresolved = Frame("[unknown] libfoo.so+0x1a2b", FrameKind.PLACEHOLDER, "/opt/lib/libfoo.so", 0x1A2B, "beef" * 10)
    stack = Stack(user=(unresolved,), kernel=STACK_LOCK.kernel)
    request = _encode(snapshot_of([(APP, 0, "", Reason.SLEEPING, stack, Counter(1, 9), Counter(1, 9))]))
    d = request.dictionary
    loc = d.location_table[d.stack_table[1].location_indices[-1]]
    mapping = d.mapping_table[loc.mapping_index]
    assert loc.address == 0x1A2B and d.string_table[mapping.filename_strindex] == "/opt/lib/libfoo.so"
    (attr,) = [d.attribute_table[i] for i in mapping.attribute_indices]
    assert d.string_table[attr.key_strindex] == "process.executable.build_id.gnu"
    assert attr.value.string_value == "beef" * 10


def test_sampled_stack_captures_are_said_on_every_profile() -> None:
    snap = two_process_snapshot()
    sampled = replace(snap, health=replace(snap.health, stack_sampling=True, stack_sampled_ratio=0.25))
    request = _encode(sampled)
    table = request.dictionary.attribute_table
    strings = request.dictionary.string_table
    profiles = [p for rp in request.resource_profiles for sp in rp.scope_profiles for p in sp.profiles]
    assert len(profiles) == 4
    for profile in profiles:
        attrs = {strings[table[i].key_strindex]: table[i].value.double_value for i in profile.attribute_indices}
        assert attrs == {"offcpu.stack_sampled_ratio": 0.25}
    # Every block's stacks captured: nothing to say.
    whole = _encode(replace(snap, health=replace(snap.health, stack_sampling=False)))
    assert not any(p.attribute_indices for rp in whole.resource_profiles for sp in rp.scope_profiles
                   for p in sp.profiles)
