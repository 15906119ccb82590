"""The protobuf and grpcio floors in pyproject.toml are real: in a throwaway virtualenv holding exactly
the lowest versions pyproject.toml allows (protobuf, grpcio, opentelemetry-proto,
googleapis-common-protos), the committed gencode (SkyWalking messages and gRPC stubs, pprof's profile)
imports without a version error or warning and round-trips messages, and so do the OpenTelemetry and
googleapis modules the OTLP sink uses. pip fetches the pinned versions from the package index."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FLOORED = ("protobuf", "grpcio", "opentelemetry-proto", "googleapis-common-protos")
GENCODE = "offcpu_exporter/formats/proto"  # pprof's and, below it, SkyWalking's

CHECK = """
import warnings
warnings.simplefilter("error")  # the gRPC stubs warn (or raise) when grpcio is older than their generator
from offcpu_exporter.formats.proto.skywalking.common import Common_pb2
from offcpu_exporter.formats.proto.skywalking.ebpf.profiling import Profile_pb2, Profile_pb2_grpc, Process_pb2_grpc
from offcpu_exporter.formats.proto import profile_pb2
from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from google.rpc import error_details_pb2
import grpc

data = Profile_pb2.EBPFProfilingData(offCPU=Profile_pb2.EBPFOffCPUProfiling(switchCount=3, duration=10**12))
data.offCPU.stacks.add(stackType=Profile_pb2.PROCESS_USER_SPACE, stackId=7, stackSymbols=["main"])
assert Profile_pb2.EBPFProfilingData.FromString(data.SerializeToString()) == data
commands = Common_pb2.Commands(commands=[Common_pb2.Command(command="EBPFProfilingTaskQuery")])
assert Common_pb2.Commands.FromString(commands.SerializeToString()) == commands
Profile_pb2_grpc.EBPFProfilingServiceStub(grpc.insecure_channel("127.0.0.1:1"))
Process_pb2_grpc.EBPFProcessServiceStub(grpc.insecure_channel("127.0.0.1:1"))
profile = profile_pb2.Profile(string_table=["", "off_cpu"], duration_nanos=5)
assert profile_pb2.Profile.FromString(profile.SerializeToString()) == profile
profiles_service_pb2.ExportProfilesServiceRequest()
metrics_service_pb2.ExportMetricsServiceRequest()
error_details_pb2.RetryInfo()
print("floors ok")
"""


def floors() -> dict[str, str]:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    found = {}
    for requirement in dependencies:
        m = re.match(r"^([A-Za-z0-9_.-]+)>=([0-9.]+)", requirement)
        if m and m.group(1) in FLOORED:
            found[m.group(1)] = m.group(2)
    assert set(found) == set(FLOORED), found
    return found


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_gencode_works_with_the_floor_versions(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", str(venv)], check=True, timeout=120)
    pins = [f"{name}=={version}" for name, version in floors().items()]
    install = subprocess.run([str(venv / "bin" / "pip"), "install", "--no-input", *pins], capture_output=True,
                             text=True, timeout=480)
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-2000:]
    # Only the generated modules, under their package path (the package itself needs more than these).
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "exporter" / GENCODE, tree / GENCODE, ignore=shutil.ignore_patterns("__pycache__"))
    for package in ("offcpu_exporter", "offcpu_exporter/formats"):
        (tree / package / "__init__.py").write_text("")
    result = subprocess.run([str(venv / "bin" / "python"), "-c", CHECK], cwd=tree, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0 and "floors ok" in result.stdout, result.stdout + result.stderr
