"""Namespace, pod and container names of processes, from the Kubernetes API.

Optional at every level: outside a cluster (no ``KUBERNETES_SERVICE_HOST`` or no service-account
token), or while the API server is down, `PodMetadata.lookup` returns empty names and the exporter
goes on with pids and container ids.

The pods of this node (``spec.nodeName=$NODE_NAME``, set from the downward API by the Helm chart)
are listed once (`refresh`, on the caller's thread: start-up lists before any thread starts, see
privileges.py) and then watched on a background thread, so a new pod, or a container started in
one, gets its names as soon as the API server knows them. Lookups only read the last index: they
never wait for the API. Failures are counted, logged at most once a minute, retried with backoff,
and never raised into the exporter.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple

from offcpu_exporter.k8s.apiserver import SERVICE_ACCOUNT_DIR, ApiServer, InCluster
from offcpu_exporter.k8s.podwatch import NodePods, PodSource, WatchExpired

__all__ = ["PodIndex", "PodMetadata", "PodRecord", "WorkloadNames", "build_index", "in_cluster_source", "index_of",
           "pod_record", "strip_runtime"]

log = logging.getLogger(__name__)

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


def pod_record(pod: Mapping[str, Any]) -> tuple[PodRecord, str]:
    """A pod (the API's JSON, as a dict) as a record, and its static-pod config hash (or "")."""
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
    return record, (meta.get("annotations") or {}).get(_MIRROR_ANNOTATION) or ""


def index_of(pods: Iterable[tuple[PodRecord, str]]) -> PodIndex:
    """Index (record, config hash) pairs by pod UID (and static pods' hash) and by container id."""
    by_uid: dict[str, PodRecord] = {}
    by_container: dict[str, PodRecord] = {}
    for record, mirror in pods:
        if record.uid:
            by_uid[record.uid] = record
        if mirror:
            by_uid.setdefault(mirror, record)
        for cid in record.containers:
            by_container[cid] = record
    return PodIndex(MappingProxyType(by_uid), MappingProxyType(by_container))


def build_index(pod_list: Mapping[str, Any]) -> PodIndex:
    """Index a PodList (the API's JSON, as a dict) by pod UID and by container id."""
    return index_of(pod_record(pod) for pod in pod_list.get("items") or ())


def in_cluster_source(environ: Mapping[str, str], service_account_dir: str = SERVICE_ACCOUNT_DIR,
                      watch_seconds: float = 300.0) -> PodSource | None:
    """The pods of this node through the pod's service account, or None (with the reason logged)
    when this is not a pod with one."""
    config = InCluster.from_environment(environ, service_account_dir)
    if config is None:
        return None
    node_name = environ.get("NODE_NAME", "")
    if not node_name:
        log.warning("NODE_NAME is not set: watching the pods of the whole cluster for metadata")
    # 5 s to connect and for each read of a list: start-up waits no longer for an API that is down.
    return NodePods(ApiServer(config, timeout=5.0), node_name, watch_seconds)


class PodMetadata:
    """Pod UID / container id -> (namespace, pod, container), kept current by a watch."""

    def __init__(
        self,
        source: PodSource | None,
        clock: Callable[[], float] = time.monotonic,
        max_backoff_seconds: float = 60.0,
    ) -> None:
        self._source = source
        self._clock = clock
        self._max_backoff = max_backoff_seconds
        self._pods: dict[str, tuple[PodRecord, str]] = {}  # by pod UID
        self._index = EMPTY_INDEX
        self._resource_version = ""  # "" until a list succeeded: the watch needs one
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self.lists = 0  # successful lists
        self.events = 0  # watch events applied
        self.expired = 0  # watches too old for the server (410 Gone): listed again
        self.failures = 0  # failed lists and watches
        self._last_warning = float("-inf")

    @classmethod
    def disabled(cls) -> PodMetadata:
        return cls(None)

    @classmethod
    def from_environment(
        cls,
        environ: Mapping[str, str] | None = None,
        service_account_dir: str = SERVICE_ACCOUNT_DIR,
        watch_seconds: float = 300.0,
    ) -> PodMetadata:
        env = os.environ if environ is None else environ
        return cls(in_cluster_source(env, service_account_dir, watch_seconds))

    @property
    def enabled(self) -> bool:
        return self._source is not None

    def start(self) -> None:
        """Watch in the background. Call it after --drop-privileges: the thread keeps the
        capabilities it is started with."""
        if self._source is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="k8s-metadata", daemon=True)
        self._thread.start()

    def close(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._source is not None:
            self._source.interrupt()
        if self._thread is not None:
            self._thread.join(timeout)

    def wait_ready(self, timeout: float) -> bool:
        """True once a list completed (or at once when disabled: there is nothing to wait for)."""
        return self._source is None or self._ready.wait(timeout)

    def refresh(self) -> bool:
        """List the pods now (on the caller's thread); False when the list failed."""
        if self._source is None:
            return False
        try:
            items, resource_version = self._source.list()
        except Exception as exc:  # never into the exporter: counted, logged, retried
            self._failed("listing pods", exc)
            return False
        self._pods = {record.uid: (record, mirror) for record, mirror in map(pod_record, items) if record.uid}
        self._index = index_of(self._pods.values())
        self._resource_version = resource_version
        self.lists += 1
        self._ready.set()
        return True

    def _run(self) -> None:
        backoff = min(1.0, self._max_backoff)
        while not self._stop.is_set():
            if self._resource_version or self.refresh():
                try:
                    started = self._clock()
                    self._watch()
                    if self._clock() - started >= 1.0:
                        backoff = min(1.0, self._max_backoff)
                        continue
                    # Ended at once without an error (a proxy cutting it, say): not a tight loop.
                except WatchExpired:
                    self.expired += 1
                    self._resource_version = ""  # the server no longer has our place: list again
                except Exception as exc:
                    if self._stop.is_set():
                        return
                    self._failed("watching pods", exc)
            self._stop.wait(backoff)
            backoff = min(backoff * 2, self._max_backoff)

    def _watch(self) -> None:
        assert self._source is not None
        for kind, obj in self._source.watch(self._resource_version):
            if self._stop.is_set():
                return
            version = (obj.get("metadata") or {}).get("resourceVersion")
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                record, mirror = pod_record(obj)
                pods = dict(self._pods)
                if kind == "DELETED":
                    pods.pop(record.uid, None)
                elif record.uid:
                    pods[record.uid] = (record, mirror)
                # Readers hold the old index until this one is complete: swapped, never mutated.
                self._pods, self._index = pods, index_of(pods.values())
                self.events += 1
            if version:
                self._resource_version = str(version)

    def _failed(self, what: str, exc: Exception) -> None:
        self.failures += 1
        now = self._clock()
        if now - self._last_warning >= 60.0:
            self._last_warning = now
            log.warning("%s failed (%d failures so far; names stay as last known): %s", what, self.failures, exc)

    def record(self, container_id: str = "", pod_uid: str = "") -> PodRecord | None:
        index = self._index
        record = index.by_container.get(container_id) if container_id else None
        if record is None and pod_uid:
            record = index.by_uid.get(pod_uid)
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
