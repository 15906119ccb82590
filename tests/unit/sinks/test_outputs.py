"""Outputs left off cost nothing: `serve` with its defaults (Prometheus and pprof) imports neither gRPC,
requests, the OpenTelemetry SDK nor the OTLP or SkyWalking generated code; an output's sink module is
imported only when its options turn it on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

# In a fresh interpreter, as `serve` does: parse the options, then create the outputs they enable.
SERVE_OUTPUTS = """
import json, sys
from offcpu_exporter import cli
from offcpu_exporter.sinks import OUTPUTS, SinkContext
from offcpu_exporter.snapshot import Snapshot
from offcpu_exporter.web import Routes

options = cli.parse_args(sys.argv[1:])
context = SinkContext(latest=Snapshot.empty, flush_now=lambda timeout: Snapshot.empty(), routes=Routes())
on = [output for output in OUTPUTS if output.options.enabled(options)]
if on == [output for output in OUTPUTS if output.package.endswith(("prometheus", "pprof"))]:
    sinks = [output.create(options, context) for output in on]  # the defaults: serve's own code path
else:
    sinks = [output.sink_module() for output in on]  # pushing outputs: imported, not connected
rss = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS:"))
print(json.dumps({"modules": sorted(sys.modules), "rss_kib": rss, "on": [o.package for o in on]}))
"""

HEAVY = ("grpc", "opentelemetry", "requests", "offcpu_exporter.formats.proto.skywalking",
         "offcpu_exporter.sinks.otlp.sink", "offcpu_exporter.sinks.skywalking.sink")


def _serve_imports(*args: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run([sys.executable, "-c", SERVE_OUTPUTS, "serve", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=True)
    return json.loads(done.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def _heavy(modules: object) -> list[str]:
    assert isinstance(modules, list)
    return [m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY)]


def test_serve_defaults_import_no_push_output() -> None:
    seen = _serve_imports()
    assert seen["on"] == ["offcpu_exporter.sinks.prometheus", "offcpu_exporter.sinks.pprof"]
    assert _heavy(seen["modules"]) == []


@pytest.mark.parametrize("args,expected", [
    (["--otlp.endpoint", "http://127.0.0.1:9"],
     ("grpc", "opentelemetry", "requests", "offcpu_exporter.sinks.otlp.sink")),
    (["--skywalking.file", "/tmp/offcpu-test.sw"], ("grpc", "offcpu_exporter.formats.proto.skywalking",
                                                   "offcpu_exporter.sinks.skywalking.sink")),
])
def test_an_output_turned_on_is_imported(args: list[str], expected: tuple[str, ...]) -> None:
    heavy = _heavy(_serve_imports(*args)["modules"])
    for name in expected:
        assert any(m == name or m.startswith(name + ".") for m in heavy), name
