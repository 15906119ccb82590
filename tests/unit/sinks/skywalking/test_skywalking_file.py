"""--skywalking.file: the sink writes length-delimited messages; skywalking-dump reads them."""

from __future__ import annotations

import argparse
import io
import json

import pytest
from google.protobuf.internal.decoder import _DecodeVarint32
from google.protobuf.internal.encoder import _VarintBytes

from offcpu_exporter.formats.delimited import CorruptFile, encode_varint, frame, read_messages
from offcpu_exporter.formats.proto.skywalking.ebpf.profiling import Profile_pb2 as pb
from offcpu_exporter.sinks.skywalking.dump import dump, dump_main
from offcpu_exporter.sinks.skywalking.options import SkyWalkingOptions, add_subcommands
from offcpu_exporter.sinks.skywalking.sink import create
from testkit.skywalking_sink import context, parse
from testkit.snapshots import PIPE, SEC, SLEEP, T0, process, sample, snapshot

APP = process(4242, "app")


def test_varint_framing_is_protobufs() -> None:
    for n in (0, 1, 127, 128, 300, 16_383, 16_384, 2**31, 2**40):
        assert encode_varint(n) == _VarintBytes(n)
    message = pb.EBPFProfilingData(
        offCPU=pb.EBPFOffCPUProfiling(
            stacks=[pb.EBPFProfilingStackMetadata(stackSymbols=["f" * 200])], switchCount=1, duration=2
        )
    )
    data = frame(message)
    size, pos = _DecodeVarint32(data, 0)
    assert pos == 2 and size == len(data) - 2  # a two-byte length, as writeDelimitedTo writes
    assert pb.EBPFProfilingData.FromString(data[pos:]) == message


def test_file_round_trip(tmp_path) -> None:
    path = tmp_path / "out.swpb"
    sink = create(parse(["--skywalking.file", str(path), "--skywalking.task-id", "t-9"]), context())
    assert sink is not None
    sink.publish(snapshot([sample(APP, SLEEP, 10, 2 * SEC), sample(APP, PIPE, 3, SEC // 2)], [APP], sequence=1))
    assert sink.wait_idle(5)  # else both flushes may go out as one batch under one header
    sink.publish(snapshot([sample(APP, SLEEP, 0, 0)], [APP], sequence=2))  # nothing changed: nothing written
    sink.publish(snapshot([sample(APP, SLEEP, 1, SEC)], [APP], sequence=3))
    sink.close(5)
    with path.open("rb") as f:
        messages = list(read_messages(f))
    assert len(messages) == 3
    assert sink.stats.get("sent") == 3 and sink.stats.get("dropped") == 0

    first, second, third = messages
    assert first.task.taskId == "t-9" and first.task.processId == "4242"
    assert first.task.profilingStartTime == T0 // 1_000_000
    assert first.task.currentTime > 0
    assert not second.HasField("task")  # one task header per flush and process
    assert third.HasField("task")
    assert [s.stackType for s in first.offCPU.stacks] == [pb.PROCESS_KERNEL_SPACE, pb.PROCESS_USER_SPACE]
    assert first.offCPU.stacks[1].stackSymbols[0] == "offcpu_sleep_ms"
    assert (first.offCPU.switchCount, first.offCPU.duration) == (10, 2 * SEC)
    assert second.offCPU.stacks[1].stackSymbols[0] == "offcpu_pipe_read"
    assert (second.offCPU.switchCount, second.offCPU.duration) == (3, SEC // 2)
    assert (third.offCPU.switchCount, third.offCPU.duration) == (1, SEC)


def test_file_appends_across_runs(tmp_path) -> None:
    path = tmp_path / "out.swpb"
    for _ in range(2):
        sink = create(parse(["--skywalking.file", str(path)]), context())
        assert sink is not None
        sink.publish(snapshot([sample(APP, SLEEP, 1, 5)], [APP]))
        sink.close(5)
    with path.open("rb") as f:
        assert len(list(read_messages(f))) == 2


def test_dump_text_and_json(tmp_path, capsys) -> None:
    path = tmp_path / "out.swpb"
    sink = create(parse(["--skywalking.file", str(path)]), context())
    assert sink is not None
    sink.publish(snapshot([sample(APP, SLEEP, 10, 2 * SEC)], [APP]))
    sink.close(5)

    parser = argparse.ArgumentParser(prog="offcpu-exporter")
    add_subcommands(parser.add_subparsers())
    args = parser.parse_args(["skywalking-dump", str(path)])
    assert args.handler(args) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[0].startswith("== task - process 4242 started 2023-11-14T22:13:20.000Z sent ")
    assert lines[1] == "#1 off-CPU switches=10 duration=2.000000s (2000000000 ns)"
    assert lines[2] == f"  kernel stack {first_stack_id(path)}:"
    assert lines[3] == "    finish_task_switch.isra.0"
    assert "  user stack" in text and "    offcpu_sleep_ms" in text
    assert text.index("kernel stack") < text.index("user stack")

    args = parser.parse_args(["skywalking-dump", "--format", "json", str(path)])
    assert dump_main(args) == 0
    (line,) = capsys.readouterr().out.splitlines()
    record = json.loads(line)
    assert record["offCPU"]["switchCount"] == 10 and record["task"]["processId"] == "4242"


def first_stack_id(path) -> int:
    with path.open("rb") as f:
        return next(read_messages(f)).offCPU.stacks[0].stackId


def test_dump_bad_files(tmp_path, capsys) -> None:
    parser = argparse.ArgumentParser()
    add_subcommands(parser.add_subparsers())
    assert dump_main(parser.parse_args(["skywalking-dump", str(tmp_path / "missing")])) == 2
    assert "No such file or directory" in capsys.readouterr().err

    good = frame(pb.EBPFProfilingData(offCPU=pb.EBPFOffCPUProfiling(switchCount=1)))
    truncated = tmp_path / "truncated"
    truncated.write_bytes(good + good[:-1])
    assert dump_main(parser.parse_args(["skywalking-dump", str(truncated)])) == 1
    out = capsys.readouterr()
    assert "#1 off-CPU switches=1" in out.out
    assert f"truncated record at byte {len(good)}" in out.err

    with pytest.raises(CorruptFile, match="undecodable"):
        list(read_messages(io.BytesIO(b"\x02\xff\xff")))
    with pytest.raises(CorruptFile, match="truncated length"):
        list(read_messages(io.BytesIO(b"\x80")))
    assert dump(io.BytesIO(b""), io.StringIO()) == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--skywalking.agent"], "--skywalking.agent needs --skywalking.endpoint"),
        (["--skywalking.tls"], "--skywalking.tls needs --skywalking.endpoint"),
        (["--skywalking.task-id", "t"], "--skywalking.task-id needs --skywalking.endpoint"),
        (["--skywalking.endpoint", "h:1"], "needs --skywalking.task-id and --skywalking.process-id"),
        (["--skywalking.endpoint", "h:1", "--skywalking.task-id", "t"], "needs --skywalking.task-id and"),
        (
            ["--skywalking.endpoint", "h:1", "--skywalking.agent", "--skywalking.task-id", "t"],
            "drop --skywalking.task-id",
        ),
        (
            ["--skywalking.endpoint", "h:1", "--skywalking.agent", "--skywalking.ca-file", "/x"],
            "--skywalking.ca-file needs --skywalking.tls",
        ),
        (
            [
                "--skywalking.endpoint",
                "h:1",
                "--skywalking.agent",
                "--skywalking.tls",
                "--skywalking.ca-file",
                "/nx",
            ],
            "--skywalking.ca-file: No such file or directory: /nx",
        ),
        (["--skywalking.file", "/nonexistent-dir/x"], "--skywalking.file: cannot write in /nonexistent-dir"),
        (
            ["--skywalking.file", "/tmp/x", "--skywalking.process-name", "{nope}"],
            "--skywalking.process-name '{nope}': unknown field",
        ),
    ],
)
def test_bad_options_are_one_line_errors(argv, message) -> None:
    # The CLI prints a ValueError of create() as one line and exits with status 2 (see the e2e tests).
    with pytest.raises(ValueError) as error:
        create(parse(argv), context())
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("value", ["nohost", ":80", "h:0", "h:99999", "h:x"])
def test_bad_endpoint_is_an_argparse_error(value, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse(["--skywalking.endpoint", value])
    assert exit_info.value.code == 2
    assert "expected HOST:PORT" in capsys.readouterr().err


def test_off_by_default() -> None:
    assert create(parse([]), context()) is None


def test_the_sink_options_are_read_from_the_flags() -> None:
    assert SkyWalkingOptions.from_args(parse([])) == SkyWalkingOptions()
    options = SkyWalkingOptions.from_args(parse([
        "--skywalking.buffer", "50", "--skywalking.task-id", "t-1", "--skywalking.process-id", "p-1",
        "--skywalking.task-start-time", "1700000000000",
    ]))
    assert options == SkyWalkingOptions(buffer=50, task_id="t-1", process_id="p-1", task_start_time_ms=1700000000000)
