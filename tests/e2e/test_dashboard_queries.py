"""Every PromQL expression of the Grafana dashboard, evaluated by a real Prometheus server (Debian's
package) that scraped a real `offcpu-exporter serve` watching workloads, returns data.

The dashboard variables are resolved the way Grafana does: each variable is asked of Prometheus in order
(instance, namespace, pod, container, comm, pid: label_values(); stack_id: query_result() of the busiest
stacks, its regex applied), multi-value "All" becomes the regex of the values (or the variable's allValue),
a single-value variable takes its first value, and $__rate_interval / $__range become windows.
One workload runs in a kubelet-shaped cgroup of a pod that a fake Kubernetes API (TLS, token) knows,
so the namespace/pod/container variables and labels are real too; the others are plain host processes.
The exporter runs with --per-thread, so the per-thread panel has threads to show.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.exporter import ExporterProcess
from testkit.grafana_dashboard import (
    RATE_INTERVAL,
    base_name,
    cgroup2_root,
    evaluate_panels,
    load,
    metric_names,
    queries,
    resolve_variables,
)
from testkit.kubernetes_api import NODE, FakeApi, pod
from testkit.prometheus_server import PrometheusServer, scrape_config
from testkit.workloads import Workload

pytestmark = pytest.mark.kernel

POD_UID = str(uuid.uuid4())
CONTAINER_ID = uuid.uuid4().hex + uuid.uuid4().hex


@pytest.fixture
def pod_cgroup() -> Iterator[Path]:
    root = cgroup2_root()
    top = root / f"kubepods-dash-{uuid.uuid4().hex[:8]}.slice"
    group = top / f"kubepods-pod{POD_UID.replace('-', '_')}.slice" / f"cri-containerd-{CONTAINER_ID}.scope"
    group.mkdir(parents=True)
    yield group
    for path in (group, group.parent, top):
        for pid in (path / "cgroup.procs").read_text().split():
            (root / "cgroup.procs").write_text(pid)
        path.rmdir()


def test_every_dashboard_query_returns_data(tmp_path: Path, pod_cgroup: Path) -> None:
    dashboard = load()
    api = FakeApi(tmp_path, [pod(POD_UID, "shop", "web-0", {CONTAINER_ID: "app"}, labels={"app": "web"})])
    try:
        with Workload("sleep", threads=2, iterations=1500, interval_ms=10) as web, \
                Workload("pipe", iterations=3000, interval_ms=5) as piper, \
                Workload("mutex", threads=2, iterations=3000, interval_ms=5) as locker:
            (pod_cgroup / "cgroup.procs").write_text(str(web.pid))
            args = ["--pid", str(web.pid), "--pid", str(piper.pid), "--pid", str(locker.pid),
                    "--flush-interval", "0.5", "--per-thread",
                    "--kubernetes.service-account-dir", str(api.service_account)]
            with ExporterProcess(args, env=api.environ) as exporter:
                prom = PrometheusServer(tmp_path, scrape_config("offcpu", f"127.0.0.1:{exporter.port}"))
                try:
                    prom.wait_target_up()
                    for w in (web, piper, locker):
                        w.go()
                    started = time.time()
                    time.sleep(14)
                    at = time.time()
                    everything, options = resolve_variables(dashboard, prom, started - 30, at, {})
                    results = evaluate_panels(dashboard, prom, everything, at, int(at - started) + 5)
                    # Narrowed to the pod's namespace: only the pod's process is left.
                    shop, shop_options = resolve_variables(dashboard, prom, started - 30, at, {"namespace": ["shop"]})
                    shop_results = evaluate_panels(dashboard, prom, shop, at, int(at - started) + 5)
                    # The flushes that the scrapes of the rate windows read (see below).
                    (flushes,) = prom.query(f"offcpu_exporter_last_flush_timestamp_seconds[{RATE_INTERVAL}]", at)
                    scrape = exporter.get("/metrics").decode()
                finally:
                    prom.stop()
    finally:
        api.close()

    empty = [where for where, result in results.items() if not result]
    assert not empty, f"panels without data: {empty}"
    assert len(results) >= 20
    # The variables list what runs: the three workloads, their stacks, and the pod's names from the API.
    assert {str(web.pid), str(piper.pid), str(locker.pid)} <= set(options["pid"])
    assert options["namespace"] == ["shop"] and options["pod"] == ["web-0"] and options["container"] == ["app"]
    assert options["stack_id"] and options["instance"] == [f"127.0.0.1:{exporter.port}"]
    assert shop_options["pid"] == [str(web.pid)]
    by_process = shop_results["Off-CPU time by process / A"]
    assert [r["metric"]["pid"] for r in by_process] == [str(web.pid)]
    assert by_process[0]["metric"]["namespace"] == "shop" and by_process[0]["metric"]["pod"] == "web-0"
    # The stack panels follow the identity variables too: only the pod's process, with its pod's labels,
    # and the workload's own function as where it waited.
    shop_stacks = shop_results["Top stacks / A"]
    assert {r["metric"]["pid"] for r in shop_stacks} == {str(web.pid)}
    assert all(r["metric"]["pod"] == "web-0" for r in shop_stacks)
    waited = {r["metric"]["app_function"] for r in shop_results["Where the application waited / A"]}
    assert "offcpu_sleep_ms" in waited
    assert any(r["metric"]["call_path"].endswith(";sleep_worker;offcpu_sleep_ms")
               for r in shop_results["Call paths / A"])
    assert shop_options["stack_id"] and set(shop_options["stack_id"]) < set(options["stack_id"])
    # The rates below are figures over the time the counters counted. rate() divides the increase
    # between a window's first and last scrapes by the time between those scrapes, but a scrape reads
    # the counters of the newest flush, which count up to that flush. The two spans are equal when both
    # scrapes read a flush made the same time before them (the flushes' 0.5 s schedule divides the 1 s
    # scrapes), but not when one of them reads a flush that is more or less stale than the other's: a
    # flush published in the very moment of a scrape, or late, or a scrape answered late, all of which
    # CPU contention makes (lags from -0.2 s to 1 s were stored), and a flush interval is 5.6% of the
    # 9 s between the first and last scrape. So each figure expected is the one over the flushes' span,
    # divided by the scrapes' span as Prometheus divides it.
    (first_scrape, first_flush), *_, (last_scrape, last_flush) = [(t, float(v)) for t, v in flushes["values"]]
    counted = (last_flush - first_flush) / (last_scrape - first_scrape)
    # Per thread: the pod's two sleeping threads by id and name, each off CPU nearly all the time.
    by_thread = {r["metric"].get("tid"): float(r["values"][-1][1]) for r in shop_results["Off-CPU time by thread / A"]}
    workers = {tid: v for tid, v in by_thread.items() if tid not in ("other", str(web.pid))}
    assert len(workers) == 2 and all(v == pytest.approx(counted, rel=0.10) for v in workers.values()), \
        (by_thread, counted)
    # A figure, not only data: the pod's two threads sleep nearly all the time and its main thread waits
    # in pthread_join all along (counted while it lasts), so the "blocked threads" stat shows about 3
    # (Prometheus' rate() over the last 10 s of a 14 s run).
    blocked = float(shop_results["Blocked threads (average) / A"][0]["values"][-1][1])
    print(f"blocked threads of the pod's process: {blocked:.3f} (expected {3.0 * counted:.3f})")
    assert blocked == pytest.approx(3.0 * counted, rel=0.05)
    # The pod's process has a container label from containerStatuses too.
    assert 'container="app"' in scrape and 'pod="web-0"' in scrape
    # Every metric the dashboard uses is in the real exposition: with samples, or (lost stacks, before any
    # was lost) declared by its TYPE line.
    sampled = {base_name(line.split("{", 1)[0].split(" ", 1)[0]) for line in scrape.splitlines()
               if line and not line.startswith("#")}
    declared = {line.split()[2] for line in scrape.splitlines() if line.startswith("# TYPE ")}
    used = {base_name(n) for q in queries(dashboard) for n in metric_names(q.expr)}
    assert not used - declared, f"dashboard metrics the exporter does not declare: {sorted(used - declared)}"
    assert used - sampled <= {"offcpu_exporter_lost_stacks_total"}, sorted(used - sampled)
    # The exporter listed only this node's pods.
    assert any(r["query"].get("fieldSelector") == [f"spec.nodeName={NODE}"] for r in api.requests)
