"""Container id and pod UID of a process, from the cgroup path in ``/proc/PID/cgroup``.

The path shapes come from the container runtimes' and the kubelet's naming (fixtures with their
sources are in tests/unit/k8s/fixtures/cgroup/):

- kubelet, systemd cgroup driver: ``kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid>.slice``
  with the UID's dashes turned into underscores (systemd reserves ``-`` as the slice hierarchy separator);
  Guaranteed pods have no QoS level: ``kubepods-pod<uid>.slice``.
- kubelet, cgroupfs driver: ``/kubepods/<qos>/pod<uid>/<container id>``
  (Guaranteed: ``/kubepods/pod<uid>/...``).
- runc/crun scope units under the systemd driver: ``cri-containerd-<id>.scope`` (containerd),
  ``crio-<id>.scope`` (CRI-O; ``crio-conmon-<id>.scope`` is CRI-O's monitor process, not the container),
  ``docker-<id>.scope`` (Docker, cri-dockerd), ``libpod-<id>.scope`` (Podman).
- Docker with the cgroupfs driver: ``/docker/<id>``; nested (kind, docker-in-docker) paths repeat the
  pattern, and the innermost id is the process's own container.
- Static (mirror) pods carry the kubelet's 32-hex config hash instead of a UUID.

Paths may be relative to the reader's cgroup namespace (``0::/../../kubepods-...``) when the exporter
runs in its own cgroup namespace: only the path's segments matter, not where it is rooted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ContainerIdentity", "identify", "parse_cgroup"]

_HEX64 = r"[0-9a-f]{64}"
# A scope unit as runc/crun name it under the systemd driver: <prefix>-<id>.scope.
_SCOPE = re.compile(rf"^(?P<prefix>cri-containerd|crio|docker|libpod)-(?P<id>{_HEX64})\.scope$")
_BARE_ID = re.compile(rf"^{_HEX64}$")
# pod<uid>: a UUID with dashes (cgroupfs) or underscores (systemd; some hosts mix both), or a
# static pod's 32-hex config hash; as a whole segment or as the tail of a kubepods slice name.
_POD = re.compile(
    r"(?:^|-)pod(?P<uid>[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
    r"|[0-9a-f]{32})(?:\.slice)?$"
)
_RUNTIME_OF_PREFIX = {
    "cri-containerd": "containerd",
    "crio": "cri-o",
    "docker": "docker",
    "libpod": "podman",
}


@dataclass(frozen=True, slots=True)
class ContainerIdentity:
    """What the cgroup path tells about a process. Empty strings when it is not in a container
    (or the shape is unknown). `runtime` is ``containerd``, ``cri-o``, ``docker``, ``podman``, or
    ``""`` when the path does not say (the cgroupfs driver names containers by bare id)."""

    container_id: str = ""
    pod_uid: str = ""
    runtime: str = ""

    def __bool__(self) -> bool:
        return bool(self.container_id or self.pod_uid)


NO_CONTAINER = ContainerIdentity()


def _parse_path(path: str) -> ContainerIdentity:
    container_id = pod_uid = runtime = ""
    in_kubepods = False
    after_docker = False
    for segment in path.split("/"):
        if not segment or segment == "..":
            continue
        lowered = segment.lower()
        if "kubepods" in lowered:
            in_kubepods = True
        scope = _SCOPE.match(lowered)
        if scope:
            container_id, runtime = scope["id"], _RUNTIME_OF_PREFIX[scope["prefix"]]
        elif _BARE_ID.match(lowered) and (in_kubepods or after_docker):
            container_id = lowered
            runtime = "docker" if after_docker else ""
        elif in_kubepods:
            pod = _POD.search(lowered)
            if pod:
                pod_uid = pod["uid"].replace("_", "-")
                # A new pod level resets what an outer (node-level) container said.
                container_id = runtime = ""
        after_docker = lowered == "docker"
    return ContainerIdentity(container_id, pod_uid, runtime)


def parse_cgroup(text: str) -> ContainerIdentity:
    """Container id, pod UID and runtime from the text of ``/proc/PID/cgroup`` (v1 or v2).

    Lines are ``hierarchy-id:controllers:path``; on cgroup v2 there is one line ``0::path``. On v1
    every hierarchy normally has the same path; the first line that names a container wins, and a
    line that names one over a line that names only a pod."""
    best = NO_CONTAINER
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        found = _parse_path(parts[2])
        if found.container_id:
            return found
        if found.pod_uid and not best:
            best = found
    return best


def identify(pid: int, proc_root: str | Path = "/proc") -> ContainerIdentity:
    """The identity of a running process; empty when it has exited or its cgroup file is unreadable."""
    try:
        text = (Path(proc_root) / str(pid) / "cgroup").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return NO_CONTAINER
    return parse_cgroup(text)
