"""identify() on real cgroups: a process moved into kubelet-shaped cgroups of this kernel's v1 and v2
hierarchies reads back the container id and pod UID from its real /proc/PID/cgroup."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.k8s.cgroup import ContainerIdentity, identify

pytestmark = pytest.mark.kernel


def _mount_of(fstype: str, option: str = "") -> Path | None:
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _dev, where, kind, opts, *_ = line.split()
        if kind == fstype and (not option or option in opts.split(",")):
            return Path(where)
    return None


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait(10)


def _move(proc: subprocess.Popen[bytes], root: Path, relative: str) -> Path:
    group = root / relative
    group.mkdir(parents=True, exist_ok=True)
    (group / "cgroup.procs").write_text(str(proc.pid))
    return group


def _cleanup(root: Path, top: str, proc: subprocess.Popen[bytes]) -> None:
    # Move the process back to the root, then remove the cgroups leaf first.
    try:
        (root / "cgroup.procs").write_text(str(proc.pid))
    except OSError:
        pass
    for path in sorted((root / top).glob("**/"), key=lambda p: len(p.parts), reverse=True):
        try:
            path.rmdir()
        except OSError:
            pass


def test_cgroup_v2_systemd_containerd_shape(sleeper: subprocess.Popen[bytes]) -> None:
    if os.geteuid() != 0:
        pytest.fail("needs root (kernel test)")
    root = _mount_of("cgroup2")
    assert root is not None, "no cgroup2 mount"
    pod_uid = str(uuid.uuid4())
    cid = uuid.uuid4().hex + uuid.uuid4().hex
    top = f"kubepods-test-{os.getpid()}.slice"
    relative = (f"{top}/kubepods-burstable.slice/kubepods-burstable-pod{pod_uid.replace('-', '_')}.slice/"
                f"cri-containerd-{cid}.scope")
    try:
        _move(sleeper, root, relative)
        assert identify(sleeper.pid) == ContainerIdentity(cid, pod_uid, "containerd")
    finally:
        _cleanup(root, top, sleeper)


def test_cgroup_v1_cgroupfs_shape(sleeper: subprocess.Popen[bytes]) -> None:
    root = _mount_of("cgroup", "pids")
    if root is None:
        pytest.skip("no cgroup v1 pids hierarchy on this kernel (pure cgroup v2 host)")
    pod_uid = str(uuid.uuid4())
    cid = uuid.uuid4().hex + uuid.uuid4().hex
    top = f"kubepods-test-{os.getpid()}"
    try:
        _move(sleeper, root, f"{top}/burstable/pod{pod_uid}/{cid}")
        assert identify(sleeper.pid) == ContainerIdentity(cid, pod_uid, "")
    finally:
        _cleanup(root, top, sleeper)
