"""Every metric the dashboard queries is one of the exporter's fixed metric names."""

from __future__ import annotations

import json
import re

from testkit.grafana_dashboard import FIXED_METRICS, apply_regex, base_name, load, metric_names, queries


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
    assert {"cluster", "job", "instance", "namespace", "pod", "container", "comm", "pid", "stack_id"} <= set(variables)
    for panel in load()["panels"]:
        if panel["type"] not in ("row", "flamegraph"):
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]


def test_every_prometheus_selector_is_scoped_by_cluster_and_job() -> None:
    # One Grafana over several clusters (or several exporter jobs in one Prometheus): every series selector
    # narrows by both, or a panel would mix clusters. `cluster` may be absent (one Prometheus per cluster):
    # its "All" is .*, which matches a missing label.
    variables = {v["name"]: v for v in load()["templating"]["list"]}
    assert variables["cluster"]["allValue"] == ".*" and variables["cluster"]["includeAll"]
    assert "allValue" not in variables["job"] and variables["job"]["includeAll"]
    selectors = 0
    for query in queries(load()):
        for selector in re.findall(r"\b[a-z_]+\{([^}]*)\}", query.expr):
            selectors += 1
            if query.where == "variable job":
                assert selector == 'cluster=~"$cluster"', selector
                continue
            assert (selector + ", ").startswith('cluster=~"$cluster", job=~"$job", '), (query.where, selector)
        if query.where not in ("variable cluster", "variable job"):
            assert "{" in query.expr, f"{query.where}: a selector without matchers: {query.expr}"
    assert selectors >= 35


def test_import_asks_for_the_prometheus_datasource() -> None:
    # As dashboards shared on grafana.com: __inputs names the datasource that Grafana's import asks for
    # and writes in for ${DS_PROMETHEUS}, here the datasource variable's default, so panels keep following
    # the variable. A provisioned copy (the chart's ConfigMap) is not imported: the unresolved default is
    # not a datasource and Grafana picks its default Prometheus instead.
    dashboard = load()
    assert dashboard["__inputs"] == [{"name": "DS_PROMETHEUS", "label": "Prometheus",
                                      "description": "The Prometheus that scrapes offcpu-exporter",
                                      "type": "datasource", "pluginId": "prometheus", "pluginName": "Prometheus"}]
    text = json.dumps({k: v for k, v in dashboard.items() if k != "__inputs"})
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["current"] == {"text": "${DS_PROMETHEUS}", "value": "${DS_PROMETHEUS}"}
    assert text.count("${DS_PROMETHEUS}") == 2  # nowhere else: panels and variables use ${datasource}


def test_every_metric_is_declared_by_the_prometheus_sink() -> None:
    # The sink's collector (offcpu_exporter/sinks/prometheus) declares its families up front (describe()):
    # the dashboard's metrics are among them, with the exposition's names (_total on counters, _info on infos).
    from offcpu_exporter.series.selection import Selection
    from offcpu_exporter.sinks.prometheus.collector import OffCPUCollector
    from offcpu_exporter.snapshot import Snapshot

    collector = OffCPUCollector(lambda: Snapshot.empty(), lambda: [], Selection(), bcc="x")
    suffix = {"counter": "_total", "info": "_info"}
    exposed = {m.name + suffix.get(m.type, "") for m in collector.describe()}
    used = {base_name(n) for q in queries(load()) for n in metric_names(q.expr)}
    assert used <= exposed, sorted(used - exposed)
    # And the sink exports exactly the names fixed for every output.
    assert exposed == FIXED_METRICS


def test_layout_has_no_overlapping_panels() -> None:
    # Grafana pushes overlapping panels down on load, silently changing the layout; keep it exact.
    # (Panels of a collapsed row take their place only when it is expanded: checked on their own.)
    dashboard = load()
    groups = [list(dashboard["panels"])] + [p["panels"] for p in dashboard["panels"] if p.get("panels")]
    for group in groups:
        cells: dict[tuple[int, int], str] = {}
        for panel in group:
            g = panel["gridPos"]
            assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24, panel["title"]
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[(x, y)]!r}"
                    cells[(x, y)] = panel["title"]
    ids = [p["id"] for group in groups for p in group]
    assert len(ids) == len(set(ids)), "panel ids must be unique"


def test_process_and_stack_panels_follow_the_identity_variables() -> None:
    # The stack series carry the process's namespace/pod/container: every panel of per-process and
    # per-stack metrics narrows by them, so that picking a pod narrows the stacks too.
    identity = ('namespace=~"$namespace"', 'pod=~"$pod"', 'container=~"$container"')
    per_process = ("offcpu_seconds_total", "offcpu_switches_total", "offcpu_stack_seconds_total",
                   "offcpu_stack_switches_total", "offcpu_block_duration_seconds_bucket")
    checked = 0
    for query in queries(load()):
        for selector in re.findall(r"\b(" + "|".join(per_process) + r")\{([^}]*)\}", query.expr):
            checked += 1
            missing = [m for m in identity if m not in selector[1]]
            if query.where in ("variable namespace", "variable pod", "variable container"):
                continue  # each asks for the values of its own label, narrowed by the ones before it
            assert not missing, f"{query.where}: {selector[0]} not narrowed by {missing}"
    assert checked >= 15


def test_variable_regex_as_grafana_applies_it() -> None:
    # query_result() lines in Grafana's format; a capture group keeps what it caught, lines it does not
    # match are dropped, duplicates go and the order stays (sort 0 leaves it to the query).
    lines = ['{stack_id="b2"} 7.5 1765134000123', '{stack_id="a1"} 0.25 1765134000123', "{} 3 1765134000123",
             '{stack_id="b2"} 1 1765134000123']
    assert apply_regex(lines, '/stack_id="([^"]+)"/') == ["b2", "a1"]
    assert apply_regex(lines, '/STACK_ID="(?P<value>a[^"]*)"/i') == ["a1"]
    assert apply_regex(["x", "x", "y"], "") == ["x", "y"]


def test_stack_variable_lists_the_busiest_stacks_of_the_range() -> None:
    # Not label_values() sorted alphabetically: its first value, the one the dashboard opens on, could be
    # a stack with no off-CPU time in the range (counted once at start-up), and the stack panels empty.
    var = {v["name"]: v for v in load()["templating"]["list"]}["stack_id"]
    query = var["query"]["query"]
    assert query.startswith("query_result(sort_desc(topk(") and "[$__range]" in query and "> 0" in query, query
    assert var["query"]["qryType"] == 3 and query == f"query_result({var['query']['varQuery']})"
    assert var["sort"] == 0 and var["regex"] == '/stack_id="([^"]+)"/' and not var["multi"]
    assert var["refresh"] == 2  # on time range change: $__range follows the dashboard
