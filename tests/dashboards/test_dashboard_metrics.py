"""Every metric the dashboard queries is one of the exporter's fixed metric names."""

from __future__ import annotations

from tests.support.grafana_dashboard import FIXED_METRICS, base_name, load, metric_names, queries


def test_every_metric_is_a_fixed_name() -> None:
    dashboard = load()
    found = set()
    for query in queries(dashboard):
        names = metric_names(query.expr)
        assert names, f"{query.where}: no metric in {query.expr!r}"
        unknown = {n for n in names if base_name(n) not in FIXED_METRICS}
        assert not unknown, f"{query.where}: unknown metric(s) {sorted(unknown)} in {query.expr!r}"
        found |= {base_name(n) for n in names}
    # The panels the dashboard promises are there: per-process, per-stack, histogram and health metrics.
    assert {"offcpu_seconds_total", "offcpu_switches_total", "offcpu_stack_seconds_total",
            "offcpu_block_duration_seconds", "offcpu_exporter_probe_attached",
            "offcpu_exporter_lost_stacks_total", "offcpu_exporter_map_entries", "offcpu_exporter_map_capacity",
            "offcpu_exporter_dropped_seconds_total", "offcpu_exporter_last_flush_duration_seconds"} <= found


def test_metric_name_extraction() -> None:
    expr = ('sum by (pid, comm) (rate(offcpu_seconds_total{comm=~"a|b", reason="sleeping"}[$__rate_interval]))'
            ' / on (instance) group_left(map) max(offcpu_exporter_map_capacity) or vector(0)')
    assert metric_names(expr) == {"offcpu_seconds_total", "offcpu_exporter_map_capacity"}
    assert metric_names("histogram_quantile(0.9, sum by (le) (rate(x_bucket[5m])))") == {"x_bucket"}
    assert metric_names("bogus_metric") == {"bogus_metric"}


def test_variables_cover_instance_namespace_pod_process_and_datasources() -> None:
    variables = {v["name"]: v for v in load()["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["pyroscope"]["query"] == "grafana-pyroscope-datasource"
    assert {"instance", "namespace", "pod", "comm", "pid", "stack_id"} <= set(variables)
    for panel in load()["panels"]:
        if panel["type"] not in ("row", "flamegraph"):
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
