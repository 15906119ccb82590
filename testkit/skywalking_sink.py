"""What the SkyWalking output's tests build it from: the flags parsed as the CLI parses them, and an
empty sink context."""

from __future__ import annotations

import argparse

from offcpu_exporter.sinks import SinkContext
from offcpu_exporter.sinks.skywalking.options import add_arguments
from offcpu_exporter.snapshot import Snapshot
from offcpu_exporter.web import Routes


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def context() -> SinkContext:
    return SinkContext(latest=lambda: Snapshot.empty(), flush_now=lambda t: Snapshot.empty(), routes=Routes())
