"""The chart's ServiceMonitor and PodMonitor keep the series' own namespace/pod/container labels.

The Prometheus Operator turns each monitor endpoint into a scrape job whose relabeling sets the target
labels namespace, pod, container, service, job and endpoint from Kubernetes service discovery, with
`honor_labels` as the endpoint's `honorLabels` (false when unset). Here the chart is rendered by Helm's
engine, each monitor becomes that job (the Operator's relabeling rules, then the monitor's own), and the
target is a real `offcpu-exporter serve` on loopback whose discovery labels are given statically (as the
Operator would find the exporter's pod). A real Prometheus scrapes it. Without `honor_labels` the
exporter's labels would come back as exported_namespace/..., the pod's process would not be found by
namespace, and host processes would carry the exporter's own pod.

The dashboard's queries are then evaluated as Grafana would (tests/e2e/test_dashboard_queries.py) with
the cluster and job variables set: narrowed to the pod's namespace they return the pod's process with its
own labels; over everything, host processes appear without a pod.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.exporter import ExporterProcess
from testkit.grafana_dashboard import cgroup2_root, evaluate_panels, load, resolve_variables
from testkit.helm_chart import NAMESPACE, one, render
from testkit.kubernetes_api import FakeApi, pod
from testkit.prometheus_server import PrometheusServer
from testkit.workloads import Workload

pytestmark = pytest.mark.kernel

CLUSTER = "c1"
EXPORTER_POD = "oe-offcpu-exporter-x7k2p"
NODE_NAME = "node-1"
IDENTITY = ("namespace", "pod", "container")


@pytest.fixture
def pod_cgroup() -> Iterator[tuple[str, str, Path]]:
    """A kubelet-shaped cgroup (systemd driver, containerd): (pod uid, container id, its directory)."""
    uid, container_id = str(uuid.uuid4()), uuid.uuid4().hex + uuid.uuid4().hex
    root = cgroup2_root()
    top = root / f"kubepods-oplabels-{uuid.uuid4().hex[:8]}.slice"
    group = top / f"kubepods-pod{uid.replace('-', '_')}.slice" / f"cri-containerd-{container_id}.scope"
    group.mkdir(parents=True)
    yield uid, container_id, group
    for path in (group, group.parent, top):
        for pid in (path / "cgroup.procs").read_text().split():
            (root / "cgroup.procs").write_text(pid)
        path.rmdir()


def _relabel(rule: dict[str, Any]) -> dict[str, Any]:
    """A monitor's relabeling (camelCase, monitoring.coreos.com/v1) as Prometheus' relabel_config."""
    names = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return {names.get(k, k): v for k, v in rule.items()}


def operator_jobs(docs: list[dict[str, Any]], target: str) -> dict[str, dict[str, Any]]:
    """The scrape jobs the Operator generates for the rendered ServiceMonitor and PodMonitor
    (prometheus-operator pkg/prometheus/promcfg.go: its relabeling order and target labels), for a
    target whose Kubernetes discovery labels are set statically; by the `job` label each one gives."""
    service = one(docs, "Service")["metadata"]["name"]
    container = one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["name"]
    discovered = {"__meta_kubernetes_namespace": NAMESPACE, "__meta_kubernetes_pod_name": EXPORTER_POD,
                  "__meta_kubernetes_pod_container_name": container, "__meta_kubernetes_service_name": service,
                  "__meta_kubernetes_pod_node_name": NODE_NAME,
                  # What a central store sees from each cluster's Prometheus (external labels, remote write).
                  "cluster": CLUSTER}
    jobs = {}
    for kind, endpoints in (("ServiceMonitor", "endpoints"), ("PodMonitor", "podMetricsEndpoints")):
        monitor = one(docs, kind)
        endpoint = monitor["spec"][endpoints][0]
        name = f"{monitor['metadata']['namespace']}/{monitor['metadata']['name']}"
        common = [{"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"}]
        if kind == "ServiceMonitor":
            relabel = [*common,
                       {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
                       {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
                       {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
                       {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"}]
            job_name, job = f"serviceMonitor/{name}/0", service
        else:
            relabel = [*common,
                       {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
                       {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
                       {"target_label": "job", "replacement": name}]
            job_name, job = f"podMonitor/{name}/0", name
        relabel.append({"target_label": "endpoint", "replacement": endpoint["port"]})
        relabel.extend(_relabel(r) for r in endpoint.get("relabelings", []))
        jobs[job] = {"job_name": job_name, "honor_labels": bool(endpoint.get("honorLabels", False)),
                     "metrics_path": endpoint["path"], "scheme": endpoint["scheme"],
                     "static_configs": [{"targets": [target], "labels": discovered}],
                     "relabel_configs": relabel}
    return jobs


def _labels(result: list[dict[str, Any]]) -> list[dict[str, str]]:
    return [r["metric"] for r in result]


def test_monitors_keep_the_labels_of_pods_and_hosts(tmp_path: Path, pod_cgroup: tuple[str, str, Path]) -> None:
    uid, container_id, group = pod_cgroup
    docs = render({"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}})
    dashboard = load()
    api = FakeApi(tmp_path, [pod(uid, "shop", "web-0", {container_id: "app"})])
    try:
        with Workload("sleep", threads=2, iterations=1500, interval_ms=10) as web, \
                Workload("pipe", iterations=3000, interval_ms=5) as host:
            (group / "cgroup.procs").write_text(str(web.pid))
            args = ["--pid", str(web.pid), "--pid", str(host.pid), "--flush-interval", "0.5",
                    "--kubernetes.service-account-dir", str(api.service_account)]
            with ExporterProcess(args, env=api.environ) as exporter:
                jobs = operator_jobs(docs, f"127.0.0.1:{exporter.port}")
                config = yaml.safe_dump(list(jobs.values()), default_flow_style=False)
                prom = PrometheusServer(tmp_path, "".join(f"  {line}\n" for line in config.splitlines()))
                try:
                    prom.wait_targets(lambda ts: len(ts) == 2 and all(t["health"] == "up" for t in ts))
                    web.go()
                    host.go()
                    started = time.time()
                    time.sleep(10)
                    at = time.time()
                    series = {job: _series(prom, job, at) for job in jobs}
                    panels = {}
                    for job in jobs:
                        for scope, chosen in (("shop", {"namespace": ["shop"]}), ("all", {})):
                            values, _ = resolve_variables(dashboard, prom, started - 30, at,
                                                          {"cluster": [CLUSTER], "job": [job], **chosen})
                            panels[job, scope] = evaluate_panels(dashboard, prom, values, at, int(at - started) + 5)
                finally:
                    prom.stop()
    finally:
        api.close()

    assert len(jobs) == 2 and all(j["honor_labels"] for j in jobs.values()), "the monitors set honorLabels: true"
    for job_name, found in series.items():
        web_series = [s for s in found if s.get("pid") == str(web.pid)]
        host_series = [s for s in found if s.get("pid") == str(host.pid)]
        assert web_series and host_series, job_name
        # Nothing renamed: the Operator's target labels did not push ours aside.
        assert not [k for s in found for k in s if k.startswith("exported_")], job_name
        # The pod's process: its own pod, not the exporter's.
        for s in web_series:
            assert (s.get("namespace"), s.get("pod"), s.get("container")) == ("shop", "web-0", "app"), (job_name, s)
        # A host process: no pod at all (its empty labels were honored as absent, not filled with the exporter's).
        for s in host_series:
            assert not {k for k in IDENTITY if k in s}, (job_name, s)
        # The exporter's own metrics carry the exporter's pod, from the target.
        own = [s for s in found if s["__name__"] == "offcpu_exporter_build_info"]
        assert len(own) == 1 and (own[0]["namespace"], own[0]["pod"], own[0]["container"]) == (
            NAMESPACE, EXPORTER_POD, "offcpu-exporter"), own
        assert own[0]["node"] == NODE_NAME and own[0]["endpoint"] == "http-metrics" and own[0]["cluster"] == CLUSTER
    for (job, scope), results in panels.items():
        by_process = _labels(results["Off-CPU time by process / A"])
        pids = {s["pid"]: s for s in by_process}
        if scope == "shop":
            assert set(pids) == {str(web.pid)}, (job, by_process)
            assert _labels(results["Block duration / A"]), job
            assert {s["pid"] for s in _labels(results["Top stacks / A"])} == {str(web.pid)}, job
        else:
            assert set(pids) == {str(web.pid), str(host.pid)}, (job, by_process)
            assert "pod" not in pids[str(host.pid)], (job, pids)
        assert pids[str(web.pid)]["pod"] == "web-0" and pids[str(web.pid)]["namespace"] == "shop", (job, pids)
        assert all(s["instance"] == f"127.0.0.1:{exporter.port}" for s in by_process), job


def _series(prom: PrometheusServer, job: str, at: float) -> list[dict[str, str]]:
    data = prom.api("/api/v1/series", **{"match[]": f'{{__name__=~"offcpu_.+", job="{job}"}}',
                                          "start": f"{at - 5:.3f}", "end": f"{at:.3f}"})
    return list(data)
