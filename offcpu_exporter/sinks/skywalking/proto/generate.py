"""Regenerates the Python protobuf/gRPC modules beside the `.proto` files.

Run from anywhere: ``python offcpu_exporter/sinks/skywalking/proto/generate.py`` (needs grpcio-tools).
``--check`` regenerates into a temporary directory and exits 1 if a committed file differs.

protoc names imports after the proto path (``from common import Common_pb2``), which only works
with this directory on ``sys.path``; the generated import lines are rewritten to absolute imports
inside the ``exporter`` package, so the modules import like any other part of it. The `.proto`
import paths stay as upstream writes them (``common/Common.proto``), so descriptor names match.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGE = "offcpu_exporter.sinks.skywalking.proto"
PROTOS = (
    "common/Common.proto",
    "common/Command.proto",
    "ebpf/profiling/Profile.proto",
    "ebpf/profiling/Process.proto",
)
# `from common import Common_pb2 as ...` / `from ebpf.profiling import Profile_pb2 as ...`
_IMPORT = re.compile(r"^from (common|ebpf\.profiling) import (\w+_pb2)", re.MULTILINE)


def generated_names() -> list[str]:
    names = []
    for proto in PROTOS:
        stem = proto[: -len(".proto")]
        names += [f"{stem}_pb2.py", f"{stem}_pb2.pyi", f"{stem}_pb2_grpc.py"]
    return names


def generate(out: Path) -> None:
    from grpc_tools import protoc  # test dependency only

    include = Path(protoc.__file__).resolve().parent / "_proto"
    args = [
        "protoc",
        f"-I{HERE}",
        f"-I{include}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *PROTOS,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    for name in generated_names():
        path = out / name
        text = _IMPORT.sub(lambda m: f"from {PACKAGE}.{m.group(1)} import {m.group(2)}", path.read_text())
        path.write_text(text)


def differences(committed: Path = HERE) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        generate(out)
        stale = []
        for name in generated_names():
            path = committed / name
            if not path.is_file() or path.read_bytes() != (out / name).read_bytes():
                stale.append(name)
        return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report files that are not current")
    args = parser.parse_args(argv)
    if args.check:
        stale = differences()
        for name in stale:
            print(f"not current: {HERE / name}", file=sys.stderr)
        return 1 if stale else 0
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        for name in generated_names():
            shutil.copyfile(Path(tmp) / name, HERE / name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
