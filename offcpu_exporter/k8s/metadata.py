"""Namespace, pod and container names of processes, from the Kubernetes API.

Optional at every level: without the ``kubernetes`` client (the ``k8s`` extra), outside a cluster
(no ``KUBERNETES_SERVICE_HOST`` or no service-account token), or while the API server is down,
`PodMetadata.lookup` returns empty names and the exporter goes on with pids and container ids.

The pods of this node (``spec.nodeName=$NODE_NAME``, set from the downward API by the Helm chart)
are listed on a background thread every `refresh_seconds`, and earlier (rate-limited) when a
lookup meets a pod UID the last list did not have, so a new pod gets its names within seconds.
Lookups only read the last complete index: they never wait for the API.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple

__all__ = ["PodIndex", "PodMetadata", "PodRecord", "WorkloadNames", "build_index", "strip_runtime"]

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# Kubernetes marks a static pod's API (mirror) object with the kubelet's config hash, which is what
# the cgroup path carries instead of the mirror object's UID.
_MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


class WorkloadNames(NamedTuple):
    namespace: str
    pod: str
    container: str


EMPTY_NAMES = WorkloadNames("", "", "")


@dataclass(frozen=True, slots=True)
class PodRecord:
    uid: str
    namespace: str
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    containers: Mapping[str, str] = field(default_factory=dict)  # container id -> container name


@dataclass(frozen=True, slots=True)
class PodIndex:
    by_uid: Mapping[str, PodRecord]
    by_container: Mapping[str, PodRecord]


EMPTY_INDEX = PodIndex(MappingProxyType({}), MappingProxyType({}))


def strip_runtime(container_id: str) -> str:
    """``containerd://<id>`` (as in status.containerStatuses[].containerID) -> ``<id>``."""
    return container_id.rsplit("://", 1)[-1]


def build_index(pod_list: Mapping[str, Any]) -> PodIndex:
    """Index a PodList (the API's JSON, as a dict) by pod UID and by container id."""
    by_uid: dict[str, PodRecord] = {}
    by_container: dict[str, PodRecord] = {}
    for pod in pod_list.get("items") or ():
        meta = pod.get("metadata") or {}
        status = pod.get("status") or {}
        containers: dict[str, str] = {}
        for kind in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
            for cs in status.get(kind) or ():
                cid = strip_runtime(cs.get("containerID") or "")
                if cid and cs.get("name"):
                    containers[cid] = cs["name"]
        record = PodRecord(
            uid=meta.get("uid", ""),
            namespace=meta.get("namespace", ""),
            name=meta.get("name", ""),
            labels=MappingProxyType(dict(meta.get("labels") or {})),
            containers=MappingProxyType(containers),
        )
        if record.uid:
            by_uid[record.uid] = record
        mirror = (meta.get("annotations") or {}).get(_MIRROR_ANNOTATION)
        if mirror:
            by_uid.setdefault(mirror, record)
        for cid in containers:
            by_container[cid] = record
    return PodIndex(MappingProxyType(by_uid), MappingProxyType(by_container))


# Fetches one PodList as a dict; raises on failure. The seam that tests and the real client share.
PodLister = Callable[[], Mapping[str, Any]]


def kubernetes_lister(
    node_name: str,
    environ: Mapping[str, str] | None = None,
    service_account_dir: str = SERVICE_ACCOUNT_DIR,
    timeout: float = 10.0,
) -> PodLister | None:
    """A lister over the official client with the pod's service account, or None (with the reason
    logged) when the client is not installed or this is not a pod with a service account."""
    env = os.environ if environ is None else environ
    if not env.get("KUBERNETES_SERVICE_HOST"):
        log.info("kubernetes metadata off: not running in a cluster (no KUBERNETES_SERVICE_HOST)")
        return None
    token = os.path.join(service_account_dir, "token")
    if not os.path.exists(token):
        log.info("kubernetes metadata off: no service account token at %s", token)
        return None
    try:
        from kubernetes import client
        from kubernetes.config.incluster_config import InClusterConfigLoader
    except ImportError:
        log.warning("kubernetes metadata off: the kubernetes client is not installed (pip extra 'k8s')")
        return None
    configuration = client.Configuration()
    InClusterConfigLoader(
        token_filename=token,
        cert_filename=os.path.join(service_account_dir, "ca.crt"),
        environ=env,
    ).load_and_set(configuration)
    api = client.CoreV1Api(client.ApiClient(configuration))
    selector = f"spec.nodeName={node_name}" if node_name else ""
    if not node_name:
        log.warning("NODE_NAME is not set: listing the pods of the whole cluster for metadata")

    def list_pods() -> Mapping[str, Any]:
        # Raw JSON instead of the client's models: a node's PodList decodes ~50x faster this way.
        response: Any = api.list_pod_for_all_namespaces(
            field_selector=selector, _preload_content=False, _request_timeout=timeout
        )
        try:
            return json.loads(response.data)
        finally:
            response.release_conn()

    return list_pods


class PodMetadata:
    """Pod UID / container id -> (namespace, pod, container), refreshed in the background."""

    def __init__(
        self,
        lister: PodLister | None,
        refresh_seconds: float = 30.0,
        min_refresh_seconds: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lister = lister
        self._refresh_seconds = refresh_seconds
        self._min_refresh_seconds = min_refresh_seconds
        self._clock = clock
        self._index = EMPTY_INDEX
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_list = float("-inf")
        self._ready = threading.Event()
        self.lists = 0  # successful lists
        self.failures = 0  # failed lists
        self._last_warning = float("-inf")
        self._asked: set[str] = set()

    @classmethod
    def disabled(cls) -> PodMetadata:
        return cls(None)

    @classmethod
    def from_environment(
        cls,
        environ: Mapping[str, str] | None = None,
        service_account_dir: str = SERVICE_ACCOUNT_DIR,
        refresh_seconds: float = 30.0,
    ) -> PodMetadata:
        env = os.environ if environ is None else environ
        try:
            lister = kubernetes_lister(env.get("NODE_NAME", ""), env, service_account_dir)
        except Exception as exc:  # a broken in-cluster config must not stop the exporter
            log.warning("kubernetes metadata off: %s", exc)
            lister = None
        return cls(lister, refresh_seconds=refresh_seconds)

    @property
    def enabled(self) -> bool:
        return self._lister is not None

    def start(self) -> None:
        if self._lister is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="k8s-metadata", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 2.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def wait_ready(self, timeout: float) -> bool:
        """True once the first list completed (or at once when disabled: there is nothing to wait for)."""
        return self._lister is None or self._ready.wait(timeout)

    def refresh(self) -> bool:
        """List the pods now (on the caller's thread); False when the list failed."""
        if self._lister is None:
            return False
        self._last_list = self._clock()
        try:
            index = build_index(self._lister())
        except Exception as exc:
            self.failures += 1
            now = self._clock()
            if now - self._last_warning >= 60.0:
                self._last_warning = now
                log.warning("listing pods failed (%d failures so far; names stay as last known): %s",
                            self.failures, exc)
            return False
        self._index = index
        self.lists += 1
        self._ready.set()
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._wake.wait(self._refresh_seconds)
            self._wake.clear()
            # A burst of unknown UIDs asks for one list, not one each.
            wait = self._last_list + self._min_refresh_seconds - self._clock()
            if wait > 0:
                self._stop.wait(wait)

    def record(self, container_id: str = "", pod_uid: str = "") -> PodRecord | None:
        index = self._index
        record = index.by_container.get(container_id) if container_id else None
        if record is None and pod_uid:
            record = index.by_uid.get(pod_uid)
        if record is None and (container_id or pod_uid) and self._thread is not None:
            # Maybe a pod newer than the last list: ask for one early list per unknown key, not one
            # every few seconds for containers that are not pods (plain Docker, Podman).
            key = container_id or pod_uid
            if key not in self._asked:
                if len(self._asked) > 10_000:
                    self._asked.clear()
                self._asked.add(key)
                self._wake.set()
        return record

    def lookup(self, container_id: str = "", pod_uid: str = "") -> WorkloadNames:
        """(namespace, pod, container) of a process's container; empty strings when unknown."""
        record = self.record(container_id, pod_uid)
        if record is None:
            return EMPTY_NAMES
        return WorkloadNames(record.namespace, record.name, record.containers.get(container_id, ""))

    def labels(self, container_id: str = "", pod_uid: str = "") -> Mapping[str, str]:
        record = self.record(container_id, pod_uid)
        return record.labels if record is not None else MappingProxyType({})
