"""Pod names from the Kubernetes API: the exporter's client against a small fake API server on
loopback (TLS with a CA file and a bearer token, as in a pod; a list from the watch cache, then a
watch), and the lookup being optional."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from offcpu_exporter.k8s.cgroup import ContainerIdentity, parse_cgroup
from offcpu_exporter.k8s.metadata import PodMetadata, WorkloadNames, build_index
from offcpu_exporter.k8s.selection import WorkloadSelector
from testkit.exporter import ROOT
from testkit.kubernetes_api import NODE, FakeApi, authorized, pod

CID_WEB = "40c03570b6f4c30bc8d69923d37ee698f5cfcced92c7b7df1c47f6f7887378a9"
CID_SIDECAR = "f33f47b0db740bb647cb3e7ac62d96c74966dbb99cbfaf4563bfd42d387e8b44"
CID_ETCD = "0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e"
CID_NEW = "1f2e3d4c5b6a79881f2e3d4c5b6a79881f2e3d4c5b6a79881f2e3d4c5b6a7988"
UID_WEB = "dde1244b-5bb5-4297-b544-85f3bc0d80bf"
UID_NEW = "6e0b1a2c-3d4e-4f5a-8b6c-7d8e9f0a1b2c"
STATIC_HASH = "b53dfa9e2dc9b890f7fadb2770857b03"


PODS = [
    pod(UID_WEB, "shop", "web-7d4b9c-x2x", {CID_WEB: "web", CID_SIDECAR: "envoy"},
        labels={"app": "web", "tier": "front"}),
    # A static pod: the API object is a mirror with its own UID; the cgroup has the config hash.
    pod("aaaaaaaa-0000-4000-8000-000000000001", "kube-system", "etcd-node-a", {CID_ETCD: "etcd"},
        annotations={"kubernetes.io/config.mirror": STATIC_HASH}),
]


@pytest.fixture
def api(tmp_path: Path) -> Iterator[FakeApi]:
    fake = FakeApi(tmp_path, PODS)
    yield fake
    fake.close()


def test_lookup_through_the_client(api: FakeApi) -> None:
    metadata = PodMetadata.from_environment(api.environ, str(api.service_account))
    assert metadata.enabled
    assert metadata.refresh()
    # Only this node's pods, from the API server's cache (resourceVersion=0), with the account's token.
    assert api.requests[-1]["query"] == {"fieldSelector": [f"spec.nodeName={NODE}"], "resourceVersion": ["0"]}
    assert authorized(api.requests[-1]["authorization"])

    web = parse_cgroup("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
                       f"{UID_WEB.replace('-', '_')}.slice/cri-containerd-{CID_WEB}.scope\n")
    assert metadata.lookup(web.container_id, web.pod_uid) == WorkloadNames("shop", "web-7d4b9c-x2x", "web")
    assert metadata.lookup(CID_SIDECAR, "") == WorkloadNames("shop", "web-7d4b9c-x2x", "envoy")
    # A process of the pod outside any of its containers (the pause/conmon level): pod, no container.
    assert metadata.lookup("", UID_WEB) == WorkloadNames("shop", "web-7d4b9c-x2x", "")
    static = parse_cgroup(f"0::/kubepods/burstable/pod{STATIC_HASH}/{CID_ETCD}\n")
    assert metadata.lookup(static.container_id, static.pod_uid) == WorkloadNames("kube-system", "etcd-node-a",
                                                                                  "etcd")
    assert metadata.lookup("ab" * 32, "") == WorkloadNames("", "", "")


def test_selector_by_namespace_label_and_container(api: FakeApi) -> None:
    metadata = PodMetadata.from_environment(api.environ, str(api.service_account))
    assert metadata.refresh()
    web = ContainerIdentity(CID_WEB, UID_WEB, "containerd")
    envoy = ContainerIdentity(CID_SIDECAR, UID_WEB, "containerd")
    etcd = ContainerIdentity(CID_ETCD, STATIC_HASH, "")
    host = ContainerIdentity()

    def select(**kw: Any) -> list[bool]:
        selector = WorkloadSelector.create(metadata, **kw)
        return [selector.matches(i) for i in (web, envoy, etcd, host)]

    assert select() == [True, True, True, True]
    assert select(namespaces=["shop"]) == [True, True, False, False]
    assert select(namespaces=["shop", "kube-system"]) == [True, True, True, False]
    assert select(pod_labels=[("app", "web"), ("tier", "front")]) == [True, True, False, False]
    assert select(pod_labels=[("app", "web"), ("tier", "back")]) == [False, False, False, False]
    assert select(containers=["envoy"]) == [False, True, False, False]
    assert select(containers=[CID_ETCD[:12]]) == [False, False, True, False]
    assert select(namespaces=["shop"], containers=["web"]) == [True, False, False, False]


def until(condition: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def watches(api: FakeApi) -> list[dict[str, Any]]:
    return [r for r in api.requests if r["query"].get("watch")]


def test_the_watch_follows_new_changed_and_deleted_pods(api: FakeApi) -> None:
    metadata = PodMetadata.from_environment(api.environ, str(api.service_account), watch_seconds=60)
    assert metadata.refresh()
    metadata.start()
    try:
        assert until(lambda: watches(api))
        watch = watches(api)[0]["query"]
        # From the list's version on, this node only; one list for all that follows.
        assert watch["resourceVersion"] == ["1"] and watch["fieldSelector"] == [f"spec.nodeName={NODE}"]
        new = pod(UID_NEW, "batch", "job-1", {})
        api.change("ADDED", new)
        assert until(lambda: metadata.lookup("", UID_NEW) == WorkloadNames("batch", "job-1", ""))
        # Its container started: the status update brings the container's name.
        api.change("MODIFIED", pod(UID_NEW, "batch", "job-1", {CID_NEW: "worker"}))
        assert until(lambda: metadata.lookup(CID_NEW, UID_NEW) == WorkloadNames("batch", "job-1", "worker"))
        api.change("DELETED", new)
        assert until(lambda: metadata.lookup(CID_NEW, UID_NEW) == WorkloadNames("", "", ""))
        assert metadata.lookup(CID_WEB, UID_WEB).pod == "web-7d4b9c-x2x"
        assert [r for r in api.requests if not r["query"].get("watch")] == api.requests[:1]
        assert metadata.events == 3 and metadata.failures == 0
        started = time.monotonic()
    finally:
        metadata.close()
    # close() ends the 60 s watch in progress at once.
    assert time.monotonic() - started < 2.0
    assert metadata._thread is not None and not metadata._thread.is_alive()


def test_a_watch_too_old_for_the_server_lists_again(api: FakeApi) -> None:
    metadata = PodMetadata(PodMetadata.from_environment(api.environ, str(api.service_account),
                                                        watch_seconds=1)._source, max_backoff_seconds=0.2)
    assert metadata.refresh()
    metadata.start()
    try:
        assert until(lambda: watches(api))
        api.fail = True  # the API server goes away for a while ...
        assert until(lambda: metadata.failures > 0)
        api.change("ADDED", pod(UID_NEW, "batch", "job-1", {CID_NEW: "worker"}))
        api.compact()  # ... and has forgotten what happened meanwhile when it is back: 410 Gone
        api.fail = False
        assert until(lambda: metadata.lookup(CID_NEW, UID_NEW) == WorkloadNames("batch", "job-1", "worker"))
        assert metadata.expired == 1 and metadata.lists == 2
        relist = [r for r in api.requests if r["query"].get("resourceVersion") == ["0"]]
        assert len(relist) >= 2
    finally:
        metadata.close()


def test_a_rotated_token_is_read_again(api: FakeApi) -> None:
    metadata = PodMetadata.from_environment(api.environ, str(api.service_account))
    assert metadata.refresh()
    api.rotate_token("test-token-2")  # the kubelet wrote a new token; the old one is refused
    assert metadata.refresh()
    assert [r["authorization"] for r in api.requests[-2:]] == ["Bearer test-token-1", "Bearer test-token-2"]
    assert metadata.failures == 0


def test_api_failure_keeps_the_last_names(api: FakeApi) -> None:
    metadata = PodMetadata.from_environment(api.environ, str(api.service_account))
    assert metadata.refresh()
    api.fail = True
    assert not metadata.refresh()
    assert metadata.failures == 1
    assert metadata.lookup(CID_WEB, UID_WEB).pod == "web-7d4b9c-x2x"


# --- optional: every way of not having the API gives empty names and no error -----------------------

def test_no_cluster_environment() -> None:
    metadata = PodMetadata.from_environment({})
    assert not metadata.enabled
    metadata.start()
    assert metadata.wait_ready(0)
    assert metadata.lookup(CID_WEB, UID_WEB) == WorkloadNames("", "", "")
    assert metadata.labels(CID_WEB, UID_WEB) == {}
    assert not metadata.refresh()
    metadata.close()


def test_no_service_account_token(tmp_path: Path) -> None:
    metadata = PodMetadata.from_environment({"KUBERNETES_SERVICE_HOST": "127.0.0.1",
                                             "KUBERNETES_SERVICE_PORT": "1"}, str(tmp_path))
    assert not metadata.enabled
    assert metadata.lookup(CID_WEB, UID_WEB) == WorkloadNames("", "", "")


def test_no_heavy_client_is_imported() -> None:
    """The official client costs ~23 MB resident, requests with urllib3 ~6 MB: neither is loaded."""
    code = ("import sys, offcpu_exporter.cli, offcpu_exporter.k8s.metadata; "
            "print(sorted(m for m in ('kubernetes', 'requests', 'urllib3') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_api_unreachable(api: FakeApi) -> None:
    env = dict(api.environ)
    api.close()  # nothing listens on that port any more
    metadata = PodMetadata.from_environment(env, str(api.service_account))
    assert metadata.enabled
    assert not metadata.refresh()
    metadata.start()  # the background thread keeps trying, quietly
    assert metadata.lookup(CID_WEB, UID_WEB) == WorkloadNames("", "", "")
    assert not WorkloadSelector.create(metadata, namespaces=["shop"]).matches(
        ContainerIdentity(CID_WEB, UID_WEB, "containerd"))
    metadata.close()
    assert metadata.failures >= 1 and metadata.lists == 0


def test_index_of_an_empty_or_sparse_pod_list() -> None:
    assert not build_index({}).by_uid
    index = build_index({"items": [{"metadata": {"uid": "u1", "name": "p", "namespace": "n"},
                                    "status": {"containerStatuses": [{"name": "c"}]}}]})  # not started yet
    assert index.by_uid["u1"].containers == {}
