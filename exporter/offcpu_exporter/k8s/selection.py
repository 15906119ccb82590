"""Target selection by Kubernetes identity: ``--namespace``, ``--pod-label``, ``--container``.

Within one option the values are alternatives (``--namespace a --namespace b``: either); different
options must all hold, and so must every ``--pod-label`` (like a label selector). Namespace and labels
need the API (`PodMetadata`); ``--container`` takes a container name (API) or a container id or its
prefix of at least 12 hex digits (as ``docker ps`` and ``crictl ps`` print it), which works without it.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from offcpu_exporter.config import seconds
from offcpu_exporter.k8s.cgroup import ContainerIdentity
from offcpu_exporter.k8s.metadata import SERVICE_ACCOUNT_DIR, PodMetadata

__all__ = ["WorkloadSelector", "add_arguments", "parse_label"]

# Label keys: an optional DNS-subdomain prefix and a name; values may be empty (Kubernetes' own rules).
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = re.compile(rf"^([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_LABEL_NAME}$")
_LABEL_VALUE = re.compile(rf"^({_LABEL_NAME})?$")
_ID_PREFIX = re.compile(r"^[0-9a-f]{12,64}$")


def parse_label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value):
        raise argparse.ArgumentTypeError(
            f"expected KEY=VALUE with a Kubernetes label key and value, got {text!r}"
        )
    return key, value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "Kubernetes",
        "Select processes by their pod and add namespace/pod/container labels. Names come from the "
        "Kubernetes API when running in a cluster with a service account (NODE_NAME from the downward API).",
    )
    group.add_argument("--namespace", action="append", default=[], metavar="NAMESPACE",
                       help="watch processes of pods in this namespace (repeatable: any of them)")
    group.add_argument("--pod-label", action="append", default=[], type=parse_label, metavar="KEY=VALUE",
                       help="watch processes of pods with this label (repeatable: all of them)")
    group.add_argument("--container", action="append", default=[], metavar="NAME|ID",
                       help="watch processes of containers with this name, or this container id or "
                            "id prefix of 12+ hex digits (repeatable: any of them)")
    group.add_argument("--kubernetes.metadata", dest="kubernetes_metadata", choices=("auto", "off"),
                       default="auto",
                       help="auto: ask the Kubernetes API for pod names when in a cluster; off: never "
                            "(default: %(default)s)")
    group.add_argument("--kubernetes.refresh-interval", dest="kubernetes_refresh_interval", type=seconds,
                       default=30.0, metavar="DURATION",
                       help="how long one watch of this node's pods lasts before it is renewed (default: 30s)")
    group.add_argument("--kubernetes.service-account-dir", dest="kubernetes_service_account_dir",
                       default=SERVICE_ACCOUNT_DIR, metavar="DIR",
                       help="where the service account's token and ca.crt are (default: %(default)s)")


@dataclass(frozen=True)
class WorkloadSelector:
    namespaces: frozenset[str]
    pod_labels: tuple[tuple[str, str], ...]
    containers: frozenset[str]
    metadata: PodMetadata

    @classmethod
    def create(
        cls,
        metadata: PodMetadata,
        namespaces: Iterable[str] = (),
        pod_labels: Iterable[tuple[str, str]] = (),
        containers: Iterable[str] = (),
    ) -> WorkloadSelector:
        return cls(frozenset(namespaces), tuple(pod_labels), frozenset(containers), metadata)

    @classmethod
    def from_args(cls, options: argparse.Namespace, metadata: PodMetadata) -> WorkloadSelector:
        return cls.create(metadata, options.namespace, options.pod_label, options.container)

    @property
    def active(self) -> bool:
        """Whether any Kubernetes criterion was given (if not, every process matches)."""
        return bool(self.namespaces or self.pod_labels or self.containers)

    @property
    def needs_api(self) -> bool:
        by_name = any(not _ID_PREFIX.match(c) for c in self.containers)
        return bool(self.namespaces or self.pod_labels or by_name)

    def matches(self, identity: ContainerIdentity) -> bool:
        if not self.active:
            return True
        if not identity:
            return False
        names = self.metadata.lookup(identity.container_id, identity.pod_uid)
        if self.namespaces and names.namespace not in self.namespaces:
            return False
        if self.pod_labels and not _has_labels(
            self.metadata.labels(identity.container_id, identity.pod_uid), self.pod_labels
        ):
            return False
        return not self.containers or any(
            c == names.container
            or bool(identity.container_id and _ID_PREFIX.match(c) and identity.container_id.startswith(c))
            for c in self.containers
        )


def _has_labels(labels: Mapping[str, str], wanted: Iterable[tuple[str, str]]) -> bool:
    return all(labels.get(key) == value for key, value in wanted)
