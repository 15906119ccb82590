"""Regenerates profile_pb2.py and profile_pb2.pyi from profile.proto (google/pprof's, verbatim).

    python exporter/offcpu_exporter/formats/proto/regenerate.py [OUTPUT_DIR]

Run it with grpcio-tools 1.63.2 (protoc 26.1), as the SkyWalking modules are made
(offcpu_exporter/formats/proto/skywalking/generate.py says why: that version is the package's
protobuf floor). Without OUTPUT_DIR the files beside profile.proto are rewritten; the unit tests
generate into a temporary directory and compare the descriptors, so a stale module fails CI.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
GENERATED = ("profile_pb2.py", "profile_pb2.pyi")


def generate(output_dir: Path) -> list[Path]:
    from grpc_tools import protoc  # a test/development dependency only

    # The proto path is the source root (exporter/) so that the descriptor is registered as
    # "offcpu_exporter/formats/proto/profile.proto": a bare "profile.proto" could collide in the
    # process-wide descriptor pool with another package's file of that common name.
    root = HERE.parents[2]
    relative = HERE.relative_to(root)
    with tempfile.TemporaryDirectory() as tmp:
        status = protoc.main(
            [
                "grpc_tools.protoc",
                f"--proto_path={root}",
                f"--python_out={tmp}",
                f"--pyi_out={tmp}",
                str(relative / "profile.proto"),
            ]
        )
        if status != 0:
            raise RuntimeError(f"protoc failed with status {status}")
        output_dir.mkdir(parents=True, exist_ok=True)
        for name in GENERATED:
            shutil.copyfile(Path(tmp) / relative / name, output_dir / name)
    return [output_dir / name for name in GENERATED]


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else HERE
    for path in generate(out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
