from __future__ import annotations

import gzip
from dataclasses import replace
from pathlib import Path

import pytest

from offcpu_exporter.formats import Profile, render
from offcpu_exporter.formats import pprof as pprof_format
from offcpu_exporter.formats.proto import profile_pb2 as pb
from offcpu_exporter.snapshot import Snapshot
from testkit.gopprof import go_pprof, top_cum
from testkit.snapshots import BUILD_ID, EXE, T0, WORKLOAD_SLEEP


def decode(data: bytes) -> pb.Profile:
    message = pb.Profile()
    message.ParseFromString(gzip.decompress(data))
    return message


def test_structure_is_valid(before: Snapshot, after: Snapshot) -> None:
    data = render("pprof", Profile.between(before, after))
    assert data[:2] == b"\x1f\x8b"
    p = decode(data)
    st = p.string_table
    assert st[0] == ""
    assert len(set(st)) == len(st)
    assert [(st[t.type], st[t.unit]) for t in p.sample_type] == [
        ("off_cpu", "nanoseconds"),
        ("switches", "count"),
    ]
    assert st[p.default_sample_type] == "off_cpu"
    assert p.time_nanos == T0 + 5_000_000_000 and p.duration_nanos == 5_000_000_000
    for table in (p.mapping, p.location, p.function):
        ids = [x.id for x in table]
        assert 0 not in ids and len(set(ids)) == len(ids)
    mappings = {m.id: m for m in p.mapping}
    functions = {f.id for f in p.function}
    for loc in p.location:
        assert loc.mapping_id == 0 or loc.mapping_id in mappings
        if loc.mapping_id:
            m = mappings[loc.mapping_id]
            assert m.memory_start <= loc.address < m.memory_limit
        assert [line.function_id in functions for line in loc.line] == [True]
    locations = {loc.id for loc in p.location}
    for s in p.sample:
        assert len(s.value) == 2
        assert all(i in locations for i in s.location_id)
    # The watched executable is the first ("main") mapping, with its build id.
    assert st[p.mapping[0].filename] == EXE and st[p.mapping[0].build_id] == BUILD_ID
    assert all(m.has_functions for m in p.mapping)


def sample_rows(p: pb.Profile) -> list[tuple[list[str], list[int], dict[str, str]]]:
    st = p.string_table
    functions = {f.id: st[f.name] for f in p.function}
    names = {loc.id: functions[loc.line[0].function_id] for loc in p.location}
    rows = []
    for s in p.sample:
        labels = {st[label.key]: st[label.str] for label in s.label}
        rows.append(([names[i] for i in s.location_id], list(s.value), labels))
    return rows


def test_values_labels_and_frame_order(before: Snapshot, after: Snapshot) -> None:
    p = decode(render("pprof", Profile.between(before, after)))
    rows = sample_rows(p)
    # Four rows grew (sleep, pipe, a new lost stack, another process's new row); one did not.
    assert len(rows) == 4
    sleep = [r for r in rows if r[2]["tid"] == "4242"]
    assert len(sleep) == 1
    frames, values, labels = sleep[0]
    assert values == [1_500_000_000, 15]
    assert frames == [f.name for f in WORKLOAD_SLEEP.leaf_to_root()]  # leaf (kernel) first, user root last
    assert labels == {
        "pid": "4242",
        "comm": "offcpu_workload",
        "tid": "4242",
        "thread": "offcpu_workload",
        "reason": "sleeping",
    }
    assert sum(r[1][0] for r in rows) == 1_500_000_000 + 250_000_000 + 1_234_567 + 40_000_499
    assert sum(r[1][1] for r in rows) == 15 + 4 + 3 + 2
    lost = next(r for r in rows if r[2]["tid"] == "4244")
    assert lost[0] == ["__schedule", "schedule", "[lost user stack]"]
    assert lost[2]["reason"] == "runnable"


def test_deterministic_and_empty(before: Snapshot, after: Snapshot) -> None:
    profile = Profile.between(before, after)
    assert render("pprof", profile) == render("pprof", profile)
    empty = decode(render("pprof", Profile.between(after, after)))
    assert len(empty.sample) == 0 and empty.string_table[0] == ""
    assert len(empty.sample_type) == 2


def test_per_process_aggregation_has_no_thread_labels(after: Snapshot) -> None:
    from dataclasses import replace

    snap = replace(after, samples=tuple(replace(s, tid=0, thread_name="") for s in after.samples))
    rows = sample_rows(decode(render("pprof", Profile.since_previous(snap))))
    assert rows and all(set(r[2]) == {"pid", "comm", "reason"} for r in rows)


def test_go_tool_pprof_reads_it(tmp_path: Path, before: Snapshot, after: Snapshot) -> None:
    path = tmp_path / "offcpu.pb.gz"
    path.write_bytes(render("pprof", Profile.between(before, after)))
    out = go_pprof(tmp_path, "-top", "-unit=ms", "-nodefraction=0", "-tagfocus=pid=^4242$", str(path))
    assert "Type: off_cpu" in out
    cum = top_cum(out)
    assert cum["offcpu_sleep_ms"] == pytest.approx(1500.0)
    assert cum["offcpu_pipe_read"] == pytest.approx(250.0)
    assert cum["[lost user stack]"] == pytest.approx(1.234567, abs=0.01)
    switches = top_cum(go_pprof(tmp_path, "-top", "-sample_index=switches", "-nodefraction=0", str(path)))
    assert switches["offcpu_sleep_ms"] == 15 + 2  # both processes
    assert switches["offcpu_pipe_read"] == 4
    raw = go_pprof(tmp_path, "-raw", str(path))
    assert "off_cpu/nanoseconds[dflt] switches/count" in raw


def test_sample_types_are_exported() -> None:
    assert pprof_format.SAMPLE_TYPES[0] == ("off_cpu", "nanoseconds")


def _with_blocks(snapshot: Snapshot, blocks: int, captures: int, sampling: bool = True) -> Snapshot:
    health = replace(snapshot.health, stack_sampling=sampling, blocks=blocks, stack_captures=captures)
    return replace(snapshot, health=health)


def test_sampled_stack_captures_are_said_in_a_comment(before: Snapshot, after: Snapshot) -> None:
    # 400 of the 1,600 blocks of the interval had their stacks captured.
    profile = Profile.between(_with_blocks(before, 1000, 1000), _with_blocks(after, 2600, 1400))
    assert profile.stack_sampled_ratio == 0.25
    p = decode(render("pprof", profile))
    comments = [p.string_table[i] for i in p.comment]
    assert len(comments) == 2 and comments[1].startswith("stack captures sampled: 25.0% of blocks")
    # Every block's stacks captured: nothing to say.
    whole = Profile.between(_with_blocks(before, 1000, 1000, False), _with_blocks(after, 2600, 2600, False))
    assert whole.stack_sampled_ratio is None
    assert len(decode(render("pprof", whole)).comment) == 1
