"""A plain install, as a new user makes it: `pip install .` (not editable) into a fresh virtualenv on the
system interpreter (which sees Debian's bcc), then `offcpu-exporter record` from an unrelated folder.

The source tree is copied first, so the install reads nothing of the checkout but what a source
distribution would hold, and the build leaves no `build/` or `*.egg-info` in the checkout. pip fetches
the dependencies from the package index (or its local cache); the virtualenv is made once per session.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.exporter import ROOT, parse_folded
from testkit.source_tree import copy_of_the_project
from testkit.workloads import Workload

pytestmark = pytest.mark.kernel

def _run(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(args)}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="session")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The `offcpu-exporter` script of a fresh virtualenv holding a plain install of this checkout."""
    work = tmp_path_factory.mktemp("install")
    source = copy_of_the_project(work / "src")
    venv = work / "venv"
    _run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(venv)], work, 120)
    _run([str(venv / "bin" / "pip"), "wheel", "--no-deps", "-w", str(work / "dist"), str(source)], work, 300)
    wheels = list((work / "dist").glob("offcpu_exporter-*.whl"))
    assert len(wheels) == 1, wheels
    _run([str(venv / "bin" / "pip"), "install", str(wheels[0])], work, 600)
    yield venv / "bin" / "offcpu-exporter"
    shutil.rmtree(work, ignore_errors=True)


def test_the_wheel_is_self_contained(installed: Path) -> None:
    wheel = next((installed.parents[2] / "dist").glob("offcpu_exporter-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    # The kernel programs, from the top-level bpf/, inside the package.
    kernel_programs = {f"offcpu_exporter/bpf/{name}"
                       for name in ("offcpu.bpf.c", "offcpu.h", "unwind.h", "unwind_table.h")}
    assert kernel_programs | {"offcpu_exporter/py.typed", "offcpu_exporter/formats/flamegraph.js"} <= set(names)
    # One top-level package, and no stray `exporter`, `bpf` or `tests` beside it.
    tops = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert tops == {"offcpu_exporter"}, tops
    licences = {n.rsplit("/", 1)[-1] for n in names if ".dist-info/" in n and "/licenses/" in n}
    assert {"LICENSE", "NOTICE"} <= licences, names


def test_record_from_another_folder(installed: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with Workload("sleep", threads=1, iterations=40, interval_ms=20) as workload:
        proc = subprocess.Popen(
            [str(installed), "record", "--pid", str(workload.pid), "--duration", "2", "--format", "folded",
             "--kubernetes.metadata", "off", "--log.format", "json"],
            cwd=elsewhere, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        assert proc.stderr is not None
        log = []
        deadline = time.monotonic() + 120
        for line in proc.stderr:
            log.append(line)
            if "recording for" in line or time.monotonic() > deadline:
                break
        time.sleep(0.3)  # the first targets sync follows the attach
        workload.go()
        workload.wait()
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, "".join(log) + err
    # --log.format json: every line of the log is one JSON object.
    records = [json.loads(line) for line in [*log, *err.splitlines()] if line.strip()]
    assert any(r["msg"].startswith("probe attached") and r["level"] == "info" for r in records), records
    # The installed copy ran, not the checkout (whose folder is not on its path).
    assert str(ROOT) not in "".join(log) + err
    stacks = parse_folded(out)
    mine = [stack for stack in stacks if "offcpu_sleep_ms" in stack]
    assert mine and all(stack.startswith("offcpu_workload;") for stack in mine), out[:3000]
    assert any("do_nanosleep" in stack for stack in mine), out[:3000]
