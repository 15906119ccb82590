"""identify() on real cgroups: a process moved into kubelet-shaped cgroups of this kernel's v1 and v2
hierarchies reads back the container id and pod UID from its real /proc/PID/cgroup."""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from offcpu_exporter.k8s.cgroup import ContainerIdentity, identify
from testkit.exporter import SOURCE_ENV

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
    with contextlib.suppress(OSError):
        (root / "cgroup.procs").write_text(str(proc.pid))
    for path in sorted((root / top).glob("**/"), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            path.rmdir()


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


@contextlib.contextmanager
def _named_v1_hierarchy(where: Path) -> Iterator[Path]:
    """A cgroup v1 hierarchy of our own: a named one, with no controller, mounts on any kernel built
    with cgroup v1, also where every controller is bound to v2 (a pure v2 host has no v1 mount)."""
    where.mkdir()
    subprocess.run(["mount", "-t", "cgroup", "-o", f"none,name=offcpu-test-{os.getpid()}", "cgroup", str(where)],
                   check=True, timeout=30)  # fmt: skip
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True, timeout=30)


@pytest.fixture(params=["host", "own"])
def v1_root(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """The host's v1 pids hierarchy where it has one ("host"; else our own), and our own ("own")."""
    if os.geteuid() != 0:
        pytest.fail("needs root (kernel test)")
    host = _mount_of("cgroup", "pids")
    if request.param == "host" and host is not None:
        yield host
        return
    with _named_v1_hierarchy(tmp_path / "cgroup-v1") as root:
        yield root


def test_cgroup_v1_cgroupfs_shape(sleeper: subprocess.Popen[bytes], v1_root: Path) -> None:
    pod_uid = str(uuid.uuid4())
    cid = uuid.uuid4().hex + uuid.uuid4().hex
    top = f"kubepods-test-{os.getpid()}"
    try:
        _move(sleeper, v1_root, f"{top}/burstable/pod{pod_uid}/{cid}")
        assert identify(sleeper.pid) == ContainerIdentity(cid, pod_uid, "")
    finally:
        _cleanup(v1_root, top, sleeper)


def test_record_selects_a_container_by_id(tmp_path: Path) -> None:
    """The real exporter (record mode, real probe) watches only the process in the container it is told."""
    import sys
    import time

    from testkit.workloads import Workload

    root = _mount_of("cgroup2")
    assert root is not None, "no cgroup2 mount"
    cid = uuid.uuid4().hex + uuid.uuid4().hex
    pod_uid = str(uuid.uuid4())
    top = f"kubepods-test-{os.getpid()}-rec.slice"
    relative = f"{top}/kubepods-pod{pod_uid.replace('-', '_')}.slice/crio-{cid}.scope"
    out = tmp_path / "out.folded"
    with Workload("sleep", iterations=40, interval_ms=25) as inside, \
            Workload("pipe", iterations=40, interval_ms=25) as outside:
        try:
            _move(inside.proc, root, relative)  # type: ignore[arg-type]
            record = subprocess.Popen(
                [sys.executable, "-m", "offcpu_exporter", "record", "--container", cid[:12], "--duration", "6",
                 "--format", "folded", "-o", str(out), "--kubernetes.metadata", "off", "--targets-interval", "0.2"],
                env={**os.environ, **SOURCE_ENV},
                stderr=subprocess.PIPE, text=True,
            )
            assert record.stderr is not None
            log = []
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # until the probe is attached and the target found
                line = record.stderr.readline()
                log.append(line)
                if "watching 1 new process" in line or not line:
                    break
            assert f"[{inside.pid}]" in log[-1], "".join(log)
            time.sleep(0.5)  # the pid reaches the kernel's filter map just after that line
            inside.go()
            outside.go()
            known = inside.wait(30)
            outside.wait(30)
            rest = record.communicate(timeout=60)[1]
            assert record.returncode == 0, "".join(log) + rest
            assert "watching" not in rest, rest  # nothing else was picked up
        finally:
            _cleanup(root, top, inside.proc)  # type: ignore[arg-type]
    folded = out.read_text()
    # Told apart by their functions (both workloads have the same comm and binary). Not by the
    # kernel's pipe functions: the watched one waits for "go" in a read of its stdin pipe, a block
    # seeded with the stack /proc shows.
    assert "do_nanosleep" in folded and "sleep_worker" in folded
    assert "pipe_worker" not in folded and "offcpu_pipe_read" not in folded and "pipe_write" not in folded
    # Everything off CPU inside the sleeping function: the sleeps, and preemptions on the way back out
    # (the workload's clock around each call counts both).
    sleep_us = sum(int(line.rsplit(" ", 1)[1]) for line in folded.splitlines() if "offcpu_sleep_ms" in line)
    # The whole run fell inside the recording: the time matches the workload's own measure.
    assert abs(sleep_us * 1000 - known.blocked_ns) <= 0.05 * known.blocked_ns, (sleep_us, known.blocked_ns)
