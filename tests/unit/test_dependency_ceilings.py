"""The ceilings in pyproject.toml are real: in a throwaway virtualenv holding the NEWEST versions of the
runtime dependencies that pyproject.toml allows (what `pip install offcpu-exporter` gets on the day, not
constraints.txt), the package imports, and its encoders and the Prometheus and OTLP metric outputs
work on a synthetic snapshot: the committed gencode loads, OTLP profiles (opentelemetry-proto's
v1development) encode and round-trip, and so do pprof, SkyWalking, folded and flame graphs.
test_dependency_floors.py does the same for the lowest versions. pip fetches from the package index."""

from __future__ import annotations

import os
import subprocess
import tomllib
from pathlib import Path

import pytest

from testkit.source_tree import ROOT, copy_of_the_project

CHECK = """
import warnings
warnings.simplefilter("error")  # the gRPC stubs warn (or raise) on grpcio/protobuf they were not made for
import importlib.metadata as md
from prometheus_client import CollectorRegistry, generate_latest

import offcpu_exporter.cli  # every option module: what `offcpu-exporter serve` imports at start
from offcpu_exporter.formats import flamegraph, folded, pprof, skywalking
from offcpu_exporter.formats.otlp_profiles import encode_profiles
from offcpu_exporter.formats.profile import Profile
from offcpu_exporter.formats.proto import profile_pb2
from offcpu_exporter.sinks.otlp.metrics import OffcpuMetrics
from offcpu_exporter.sinks.prometheus.collector import OffCPUCollector
from offcpu_exporter.series.selection import Selection
from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import ExportProfilesServiceRequest
from testkit.snapshots import make_after, make_before

before, after = make_before(), make_after()
request = encode_profiles(after)
assert request is not None and request.resource_profiles
assert ExportProfilesServiceRequest.FromString(request.SerializeToString()) == request
profile = Profile.between(before, after)
assert profile_pb2.Profile.FromString(pprof.encode_message(profile).SerializeToString()).sample
assert pprof.encode(profile) and folded.encode(profile) and flamegraph.encode(profile)
assert skywalking.encode_snapshot(after)
registry = CollectorRegistry()
registry.register(OffCPUCollector(lambda: after, lambda: [], Selection(), bcc="x"))
assert b"offcpu_seconds_total{" in generate_latest(registry)
# OTLP metrics: the SDK reads the observable counters, the exporters' encoder makes the protobuf request.
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as OTLPHttpMetricExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
reader = InMemoryMetricReader()
OffcpuMetrics(lambda: after, top_stacks=10).register(MeterProvider(metric_readers=[reader]))
encoded = encode_metrics(reader.get_metrics_data())
names = {m.name for rm in encoded.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
assert "offcpu.time" in names, names
for name in ("opentelemetry-proto", "opentelemetry-sdk", "protobuf", "grpcio", "prometheus-client"):
    print(name, md.version(name))
print("ceilings ok")
"""


def runtime_requirements() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return list(project["dependencies"])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_package_works_with_the_newest_allowed_versions(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", str(venv)], check=True, timeout=120)
    # Only pyproject.toml's ranges: a constraint file in the environment would pin the tested versions.
    env = {k: v for k, v in os.environ.items() if k not in ("PIP_CONSTRAINT", "PIP_REQUIRE_VIRTUALENV")}
    install = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--no-input", "--disable-pip-version-check", "--only-binary", ":all:",
         *runtime_requirements()], capture_output=True, text=True, timeout=240, env=env)
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-2000:]
    # The package itself, built from a copy of the checkout (pip builds in the tree it is given).
    package = subprocess.run([str(venv / "bin" / "pip"), "install", "--no-input", "--disable-pip-version-check",
                              "--no-deps", str(copy_of_the_project(tmp_path / "src"))],
                             capture_output=True, text=True, timeout=240, env=env)
    assert package.returncode == 0, package.stdout[-2000:] + package.stderr[-2000:]
    result = subprocess.run([str(venv / "bin" / "python"), "-c", CHECK], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120,
                            # testkit from the checkout (its synthetic snapshot); the package is the install.
                            env={**env, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"})
    print(result.stdout)
    assert result.returncode == 0 and "ceilings ok" in result.stdout, result.stdout + result.stderr
