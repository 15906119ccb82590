"""Command-line options of the SkyWalking output (light: the CLI imports this to build its parser;
the sink, with gRPC and the SkyWalking gencode, is imported only when these options turn it on)."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from offcpu_exporter import logfmt
from offcpu_exporter.config import format_duration, positive_int, seconds

__all__ = [
    "BUFFER",
    "POLL_INTERVAL",
    "RPC_TIMEOUT",
    "SkyWalkingOptions",
    "add_arguments",
    "add_subcommands",
    "enabled",
]

# Defaults stated once: the flags, the agent (agent.py), the retry policy (delivery.py) and the sink read them.
POLL_INTERVAL = 10.0  # seconds between queryTasks/keepAlive calls
RPC_TIMEOUT = 10.0  # seconds per gRPC call
BUFFER = 10_000  # messages kept per destination for re-sending


@dataclass(frozen=True)
class SkyWalkingOptions:
    """What the sink reads while it runs, taken from the flags once at start-up: its encoder thread
    then never looks at the argparse namespace. The connection and the agent get their own options
    (`OapConnection`, `AgentOptions`) when `create` builds them."""

    buffer: int = BUFFER
    task_id: str = ""  # names the records of every flush (with --skywalking.endpoint: the OAP's task)
    process_id: str = ""  # the OAP's process id; without it the file's records are named by pid
    task_start_time_ms: int = 0  # profilingStartTime; 0: each flush's own start

    @classmethod
    def from_args(cls, options: argparse.Namespace) -> SkyWalkingOptions:
        return cls(
            buffer=options.skywalking_buffer,
            task_id=options.skywalking_task_id,
            process_id=options.skywalking_process_id,
            task_start_time_ms=options.skywalking_task_start_time,
        )


def _endpoint(value: str) -> str:
    if not value:
        return ""  # argparse runs the default through this too: "" is "off"
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("SkyWalking output (EBPFProfilingData, off-CPU)")

    def add(name: str, **kwargs: Any) -> None:
        # Dotted flags (--skywalking.endpoint) keep the attribute names the sink reads (skywalking_endpoint).
        group.add_argument(name, dest=name[2:].replace(".", "_").replace("-", "_"), **kwargs)

    add("--skywalking.file", metavar="PATH", default="", help="append length-delimited EBPFProfilingData")
    add("--skywalking.endpoint", metavar="HOST:PORT", type=_endpoint, default="", help="SkyWalking OAP gRPC")
    add("--skywalking.tls", action="store_true", help="connect to the OAP with TLS")
    add(
        "--skywalking.ca-file",
        metavar="PEM",
        default="",
        help="CA certificates for TLS (system roots if unset)",
    )
    add(
        "--skywalking.authentication",
        metavar="TOKEN",
        default=os.environ.get("SW_AGENT_AUTHENTICATION", ""),
        help="token sent as the 'authentication' metadata (default: $SW_AGENT_AUTHENTICATION)",
    )
    add("--skywalking.task-id", metavar="ID", default="", help="stream every flush under this profiling task")
    add(
        "--skywalking.process-id",
        metavar="ID",
        default="",
        help="the OAP's process id for --skywalking.task-id",
    )
    add(
        "--skywalking.task-start-time",
        metavar="MS",
        type=int,
        default=0,
        help="profilingStartTime in ms since the epoch (default: when the probe started)",
    )
    add("--skywalking.agent", action="store_true", help="report processes and follow the OAP's OFF_CPU tasks")
    add(
        "--skywalking.agent-id",
        metavar="ID",
        default="",
        help="ebpfAgentID / roverInstanceId (default: random)",
    )
    add(
        "--skywalking.service-name",
        metavar="FMT",
        default="{exe}",
        help="fields: {comm} {exe} {pid} {hostname}",
    )
    add("--skywalking.instance-name", metavar="FMT", default="{hostname}", help="as --skywalking.service-name")
    add(
        "--skywalking.process-name",
        metavar="FMT",
        default="{comm}-{pid}",
        help="as --skywalking.service-name",
    )
    add("--skywalking.labels", metavar="L1,L2", default="", help="labels of the reported processes")
    add("--skywalking.report-cmdline", action="store_true", help="report command lines as a process property")
    add(
        "--skywalking.task-poll-interval",
        metavar="DURATION",
        type=seconds,
        default=POLL_INTERVAL,
        help=f"queryTasks and keepAlive period (default: {format_duration(POLL_INTERVAL)})",
    )
    add(
        "--skywalking.buffer",
        metavar="MESSAGES",
        type=positive_int,
        default=BUFFER,
        help="messages kept for re-sending while a destination fails (default: %(default)s)",
    )
    add("--skywalking.timeout", metavar="DURATION", type=seconds, default=RPC_TIMEOUT,
        help=f"per-RPC deadline (default: {format_duration(RPC_TIMEOUT)})")


def add_subcommands(subparsers: Any) -> argparse.ArgumentParser:
    """``offcpu-exporter skywalking-dump PATH``: prints a file written by ``--skywalking.file`` (the CLI
    calls this hook of every sink's options)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "skywalking-dump",
        help="print the EBPFProfilingData messages of a --skywalking.file",
        description="Prints length-delimited EBPFProfilingData messages (as --skywalking.file writes them).",
    )
    parser.add_argument("path", metavar="PATH", help="file written by --skywalking.file ('-' for stdin)")
    parser.add_argument(
        "--format", choices=("text", "json"), default="text", help="text (default) or one JSON object a line"
    )
    logfmt.add_arguments(parser, level="warning")
    parser.set_defaults(handler=_dump_main)
    return parser


def _dump_main(options: argparse.Namespace) -> int:
    from offcpu_exporter.sinks.skywalking.dump import dump_main

    return dump_main(options)


def _fail(message: str) -> None:
    # The CLI turns a ValueError from create() into one error line and exit status 2.
    raise ValueError(message)


def enabled(options: argparse.Namespace) -> bool:
    """Whether a file or an OAP is given. Raises ValueError (the CLI's one-line error, exit status 2)
    on contradictory options, whether the sink is on or not."""
    o = options
    if not o.skywalking_endpoint:
        for flag, value in (("agent", o.skywalking_agent), ("tls", o.skywalking_tls)):
            if value:
                _fail(f"--skywalking.{flag} needs --skywalking.endpoint")
        if o.skywalking_task_id and not o.skywalking_file:
            _fail("--skywalking.task-id needs --skywalking.endpoint (or names the records of --skywalking.file)")
    elif o.skywalking_agent:
        if o.skywalking_task_id:
            _fail("--skywalking.agent takes its tasks from the OAP: drop --skywalking.task-id")
    elif not o.skywalking_task_id or not o.skywalking_process_id:
        _fail("--skywalking.endpoint needs --skywalking.task-id and --skywalking.process-id, or --skywalking.agent")
    if o.skywalking_ca_file:
        if not o.skywalking_tls:
            _fail("--skywalking.ca-file needs --skywalking.tls")
        try:
            Path(o.skywalking_ca_file).read_bytes()
        except OSError as exc:
            _fail(f"--skywalking.ca-file: {exc.strerror}: {o.skywalking_ca_file}")
    if o.skywalking_file:
        parent = Path(o.skywalking_file).resolve().parent
        if not parent.is_dir() or not os.access(parent, os.W_OK):
            _fail(f"--skywalking.file: cannot write in {parent}")
    for flag in ("service", "instance", "process"):
        template = getattr(o, f"skywalking_{flag}_name")
        try:
            template.format(comm="c", exe="e", pid=1, hostname="h")
        except (KeyError, IndexError, ValueError) as exc:
            _fail(f"--skywalking.{flag}-name {template!r}: unknown field or bad format ({exc})")
    return bool(o.skywalking_file or o.skywalking_endpoint)
