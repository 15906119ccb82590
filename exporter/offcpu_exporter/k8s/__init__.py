"""Kubernetes identity of processes: container id and pod UID from cgroups, names from the API,
and target selection by them."""

from offcpu_exporter.k8s.cgroup import ContainerIdentity, identify, parse_cgroup
from offcpu_exporter.k8s.metadata import PodMetadata, WorkloadNames
from offcpu_exporter.k8s.selection import WorkloadSelector, add_arguments

__all__ = [
    "ContainerIdentity",
    "PodMetadata",
    "WorkloadNames",
    "WorkloadSelector",
    "add_arguments",
    "identify",
    "parse_cgroup",
]
