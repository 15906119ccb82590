"""``offcpu-exporter skywalking-dump PATH``: prints a file written by ``--skywalking.file`` (the
subcommand's flags are in `options`)."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

from google.protobuf import json_format

from offcpu_exporter.formats.delimited import CorruptFile, read_messages
from offcpu_exporter.formats.proto.skywalking.ebpf.profiling import Profile_pb2 as pb

__all__ = ["dump", "dump_main", "format_message"]

_STACK_TYPES = {pb.PROCESS_KERNEL_SPACE: "kernel", pb.PROCESS_USER_SPACE: "user"}


def _time(ms: int) -> str:
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def format_message(index: int, message: pb.EBPFProfilingData) -> str:
    lines = []
    if message.HasField("task"):
        t = message.task
        lines.append(
            f"== task {t.taskId or '-'} process {t.processId or '-'}"
            f" started {_time(t.profilingStartTime)} sent {_time(t.currentTime)}"
        )
    kind = message.WhichOneof("profiling")
    if kind == "offCPU":
        off = message.offCPU
        lines.append(
            f"#{index} off-CPU switches={off.switchCount} duration={off.duration / 1e9:.6f}s ({off.duration} ns)"
        )
        stacks = off.stacks
    elif kind == "onCPU":
        lines.append(f"#{index} on-CPU dumps={message.onCPU.dumpCount}")
        stacks = message.onCPU.stacks
    else:
        lines.append(f"#{index} (no profiling data)")
        stacks = []
    for stack in stacks:
        lines.append(f"  {_STACK_TYPES.get(stack.stackType, str(stack.stackType))} stack {stack.stackId}:")
        lines.extend(f"    {symbol}" for symbol in stack.stackSymbols)
    return "\n".join(lines)


def dump(stream: Any, out: TextIO, as_json: bool = False) -> int:
    count = 0
    for message in read_messages(stream):
        count += 1
        if as_json:
            out.write(json_format.MessageToJson(message, indent=None) + "\n")
        else:
            out.write(format_message(count, message) + "\n")
    return count


def dump_main(args: argparse.Namespace) -> int:
    try:
        stream = sys.stdin.buffer if args.path == "-" else open(args.path, "rb")  # noqa: SIM115
    except OSError as exc:
        print(f"offcpu-exporter: error: {args.path}: {exc.strerror}", file=sys.stderr)
        return 2
    try:
        with stream:
            dump(stream, sys.stdout, args.format == "json")
    except CorruptFile as exc:
        sys.stdout.flush()
        print(f"offcpu-exporter: error: {args.path}: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
    return 0
