"""Building the OTLP sink from command-line arguments the way the CLI does, for tests."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping, Sequence

from offcpu_exporter.sinks import SinkContext
from offcpu_exporter.sinks.otlp.endpoints import OtlpConfig
from offcpu_exporter.sinks.otlp.options import add_arguments
from offcpu_exporter.sinks.otlp.sink import OtlpSink
from offcpu_exporter.snapshot import Snapshot
from offcpu_exporter.web import Routes

__all__ = ["config_from_args", "context_of", "sink_from_args"]


def config_from_args(args: Sequence[str], environ: Mapping[str, str] | None = None) -> OtlpConfig | None:
    env = environ or {}
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser, env)
    return OtlpConfig.from_args(parser.parse_args(list(args)), env)


def context_of(latest: Callable[[], Snapshot]) -> SinkContext:
    return SinkContext(latest=latest, flush_now=lambda timeout: latest(), routes=Routes())


def sink_from_args(
    args: Sequence[str], latest: Callable[[], Snapshot] | None = None, host_name: str = "test-host"
) -> OtlpSink:
    config = config_from_args(args)
    assert config is not None, "sink is off"
    return OtlpSink(config, context_of(latest or (lambda: Snapshot.empty())), host_name=host_name)
