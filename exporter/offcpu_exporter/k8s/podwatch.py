"""The pods of this node from the API server: one list, then a watch of their changes.

The list asks for ``resourceVersion=0``: the API server answers from its watch cache instead of
reading etcd, which is what a DaemonSet on every node must do not to load the control plane. The
watch then goes on from the list's resource version; when that version is too old for the server
(410 Gone, as an HTTP status or as an ERROR event), `WatchExpired` says to list again.
"""

from __future__ import annotations

import http.client
import json
import logging
from collections.abc import Iterator
from typing import Any, Protocol

from offcpu_exporter.k8s.apiserver import ApiError, ApiServer

__all__ = ["NodePods", "PodSource", "WatchExpired"]

log = logging.getLogger(__name__)

PODS_PATH = "/api/v1/pods"
# Past the server's timeoutSeconds, a silent connection is a dead one.
_READ_MARGIN = 30.0


class WatchExpired(Exception):
    """The watch's resource version is older than the server keeps: list again."""


class PodSource(Protocol):
    def list(self) -> tuple[list[dict[str, Any]], str]:
        """The pods, and the resource version to watch from."""
        ...

    def watch(self, resource_version: str) -> Iterator[tuple[str, dict[str, Any]]]:
        """(ADDED|MODIFIED|DELETED|BOOKMARK, object) events after `resource_version`, until the
        server ends the watch; raises WatchExpired, or ApiError for any other failure."""
        ...

    def interrupt(self) -> None:
        """End a watch in progress (from another thread)."""
        ...


class NodePods:
    """A `PodSource` of the pods of one node (all pods when the node name is unknown)."""

    def __init__(self, api: ApiServer, node_name: str, watch_seconds: float = 300.0) -> None:
        self._api = api
        self._selector = {"fieldSelector": f"spec.nodeName={node_name}"} if node_name else {}
        self._watch_seconds = max(1, round(watch_seconds))

    def list(self) -> tuple[list[dict[str, Any]], str]:
        pod_list = self._api.get(PODS_PATH, {**self._selector, "resourceVersion": "0"})
        if not isinstance(pod_list, dict):
            raise ApiError(200, f"GET {PODS_PATH}: not a PodList")
        return list(pod_list.get("items") or ()), str((pod_list.get("metadata") or {}).get("resourceVersion", ""))

    def watch(self, resource_version: str) -> Iterator[tuple[str, dict[str, Any]]]:
        query = {**self._selector, "watch": "1", "resourceVersion": resource_version,
                 "allowWatchBookmarks": "true", "timeoutSeconds": str(self._watch_seconds)}
        try:
            for line in self._api.lines(PODS_PATH, query, self._watch_seconds + _READ_MARGIN):
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event.get("type", ""), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise WatchExpired(obj.get("message", "resource version too old"))
                    raise ApiError(int(obj.get("code") or 0), f"watch: {obj.get('message', obj)}")
                yield kind, obj
        except ApiError as exc:
            if exc.status == 410:
                raise WatchExpired(str(exc)) from exc
            raise
        except (OSError, ValueError, http.client.HTTPException) as exc:  # timed out, cut, torn line
            raise ApiError(0, f"watch: {exc or type(exc).__name__}") from exc

    def interrupt(self) -> None:
        self._api.interrupt()
