"""Reading the PromQL out of a Grafana dashboard JSON: panel targets and variable queries, the metric
names they use, and the dashboard variables replaced by concrete values for evaluation; and the
dashboard evaluated against a Prometheus server as Grafana would (variables, then panels)."""

from __future__ import annotations

import json
import re
import urllib.error
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testkit.prometheus_server import PrometheusServer

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "dashboards" / "offcpu-exporter.json"

# The names fixed for every output and dashboard (offcpu_exporter_* are the exporter's own metrics).
FIXED_METRICS = frozenset({
    "offcpu_seconds_total", "offcpu_switches_total",
    "offcpu_stack_seconds_total", "offcpu_stack_switches_total",
    "offcpu_block_duration_seconds", "offcpu_blocked_threads", "offcpu_blocked_longest_seconds",
    *(f"offcpu_exporter_{n}" for n in (
        "probe_attached", "probe_hooked_symbol_info", "lost_stacks_total", "map_entries", "map_capacity",
        "map_dropped_total", "dropped_seconds_total", "clamped_seconds_total", "symbolization_failures_total",
        "filtered_blocks_total", "filtered_seconds_total", "blocks_total", "missed_switch_ins_total",
        "stack_captures_total", "seeded_stacks_total", "probe_skipped_runs_total",
        "stack_sampling_ratio", "probe_cpu_seconds_total", "probe_runs_total", "unwind_walks_total",
        "unwind_frames_total", "unwind_processes", "unwind_tables_no_space_total",
        "last_flush_duration_seconds", "last_flush_timestamp_seconds", "flushes_total", "targets", "sink_sent_total",
        "sink_dropped_total",
        "sink_retried_total", "sink_failed_total", "cardinality_overflow_total", "build_info")),
})
HISTOGRAMS = frozenset({"offcpu_block_duration_seconds"})

_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
                       "unless", "offset", "inf", "nan", "atan2"})


@dataclass(frozen=True)
class Query:
    where: str  # panel title / refId, or variable name
    expr: str
    instant: bool
    is_variable: bool = False


def load(path: Path = DASHBOARD) -> dict[str, Any]:
    return json.loads(path.read_text())


def panels(dashboard: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def _is_prometheus(datasource: Any) -> bool:
    return isinstance(datasource, Mapping) and datasource.get("type") == "prometheus"


def queries(dashboard: Mapping[str, Any]) -> list[Query]:
    """Every PromQL expression: panel targets, and the series selectors of label_values() variables."""
    out = []
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            if _is_prometheus(target.get("datasource") or panel.get("datasource")) and target.get("expr"):
                out.append(Query(f"{panel['title']} / {target['refId']}", target["expr"],
                                 bool(target.get("instant")) and not target.get("range")))
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query" and _is_prometheus(var.get("datasource")):
            query = variable_query(var)
            if m := _QUERY_RESULT.fullmatch(query):
                out.append(Query(f"variable {var['name']}", m[1], True, True))
                continue
            m = _LABEL_VALUES.fullmatch(query)
            assert m, f"variable {var['name']}: unsupported query {query!r}"
            # label_values(selector, label) == the label's values among the selector's series.
            out.append(Query(f"variable {var['name']}", f"group by ({m[2]}) ({m[1]})", True, True))
    return out


# The two kinds of Prometheus variable query the dashboard uses, as Grafana's PrometheusMetricFindQuery
# recognizes them in the query string.
_LABEL_VALUES = re.compile(r"\s*label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)\s*")
_QUERY_RESULT = re.compile(r"\s*query_result\((.+)\)\s*", re.DOTALL)


def variable_query(var: Mapping[str, Any]) -> str:
    return str(var["query"]["query"] if isinstance(var["query"], Mapping) else var["query"])


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (strings, label matchers, ranges and grouping lists removed)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for m in re.finditer(r"(?<![\w$])([a-zA-Z_:][a-zA-Z0-9_:]*)\b(\s*\()?", text):
        if m[2] or m[1].lower() in _KEYWORDS:
            continue  # a function call or a keyword
        names.add(m[1])
    return names


def base_name(metric: str) -> str:
    for suffix in ("_bucket", "_sum", "_count"):
        if metric.endswith(suffix) and metric[: -len(suffix)] in HISTOGRAMS:
            return metric[: -len(suffix)]
    return metric


def substitute(expr: str, values: Mapping[str, str], rate_interval: str, range_: str) -> str:
    """Replace $var / ${var} as Grafana would (regex values for =~ matchers) and the built-in intervals."""
    expr = expr.replace("$__rate_interval", rate_interval).replace("$__range", range_)
    return re.sub(r"\$\{?(\w+)\}?", lambda m: values[m[1]], expr)


# -- evaluating a dashboard against a Prometheus server ---------------------------------------

RATE_INTERVAL = "10s"
VARIABLE_ORDER = ("cluster", "job", "instance", "namespace", "pod", "container", "comm", "pid", "stack_id")


def cgroup2_root() -> Path:
    """Where the cgroup v2 hierarchy is mounted (the tests make pod-like cgroups under it)."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _dev, where, kind, *_ = line.split()
        if kind == "cgroup2":
            return Path(where)
    raise RuntimeError("no cgroup2 mount")


def api(prom: PrometheusServer, path: str, **params: str) -> Any:
    """prom.api, with Prometheus' own error message (a bad expression is a 400 with a JSON body)."""
    try:
        return prom.api(path, **params)
    except urllib.error.HTTPError as e:
        raise AssertionError(f"{path} {params}: {e.code} {e.read().decode(errors='replace')}") from None


def grafana_regex_escape(value: str) -> str:
    # What Grafana's Prometheus datasource does to each value of a multi-value variable: regex-escape
    # with a doubled backslash, since the regex sits in a PromQL string literal.
    return re.sub(r"[$^*{}\[\]'+?.()|\\]", lambda m: "\\\\" + m[0], value)


def label_values(prom: PrometheusServer, selector: str, label: str, start: float, end: float) -> list[str]:
    data = api(prom, f"/api/v1/label/{label}/values", **{"match[]": selector, "start": f"{start:.3f}",
                                                       "end": f"{end:.3f}"})
    return sorted(v for v in data if v)


def query_result_lines(prom: PrometheusServer, expr: str, end: float) -> list[str]:
    """query_result(expr) as Grafana lists it: an instant query at the end of the dashboard's time range,
    each result one line `name{k="v",...} value timestamp_ms` in Prometheus' order (for the regex)."""
    data = api(prom, "/api/v1/query", query=expr, time=f"{end:.3f}")
    assert data["resultType"] == "vector", data
    lines = []
    for r in data["result"]:
        labels = dict(r["metric"])
        name = labels.pop("__name__", "")
        ts, value = r["value"]
        ms = float(ts) * 1000
        lines.append(name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
                     f" {value} {int(ms) if ms.is_integer() else ms}")
    return lines


def apply_regex(texts: list[str], regex: str) -> list[str]:
    """A variable's regex applied to its values as Grafana does (metricNamesToVariableValues): values it
    does not match are dropped, a capture group (or a group named `value`) replaces the value with what it
    caught, and duplicates go, the first kept. Grafana writes the regex as /pattern/flags (JavaScript)."""
    if not regex:
        return list(dict.fromkeys(texts))
    m = re.fullmatch(r"/(.*)/([a-z]*)", regex, re.DOTALL)
    assert m and set(m[2]) <= {"i"}, f"unsupported variable regex {regex!r}"  # no /g: one match a value
    pattern = re.compile(m[1], re.IGNORECASE if "i" in m[2] else 0)
    out = []
    for text in texts:
        found = pattern.search(text)
        if not found:
            continue
        if found.groupdict().get("value"):
            out.append(found["value"])
        else:
            out.append(found[1] if pattern.groups else found[0])
    return list(dict.fromkeys(out))


def resolve_variables(dashboard: Mapping[str, Any], prom: PrometheusServer, start: float, end: float,
                      chosen: Mapping[str, list[str]]) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Values as Grafana would substitute them, and each variable's options (as Prometheus listed them).

    start..end is the dashboard's time range: label_values() lists the series seen in it, query_result()
    is evaluated at its end with $__range its length. A variable that is neither chosen nor "All" takes
    its first option, as Grafana does when it has no current value among the options."""
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    values: dict[str, str] = {}
    options: dict[str, list[str]] = {}
    # Grafana's $__range in a variable query: the dashboard's time range in whole seconds.
    range_ = f"{round(end - start)}s"
    for name in VARIABLE_ORDER:
        var = variables[name]
        query = variable_query(var)
        if m := _QUERY_RESULT.fullmatch(query):
            found = apply_regex(query_result_lines(prom, substitute(m[1], values, RATE_INTERVAL, range_), end),
                                var.get("regex", ""))
            # sort 0 keeps the query's order (e.g. busiest first); 1 is alphabetical.
            assert var.get("sort", 0) in (0, 1), (name, var.get("sort"))
            if var.get("sort"):
                found.sort()
        else:
            m = _LABEL_VALUES.fullmatch(query)
            assert m, var["query"]
            found = label_values(prom, substitute(m[1], values, RATE_INTERVAL, "1m"), m[2], start, end)
        options[name] = found
        picked = chosen.get(name)
        if picked is not None:
            assert set(picked) <= set(found), (name, picked, found)
            values[name] = "(" + "|".join(grafana_regex_escape(v) for v in picked) + ")"
        elif var.get("includeAll"):
            values[name] = var.get("allValue") or "(" + "|".join(grafana_regex_escape(v) for v in found) + ")"
        else:
            assert found, f"variable {name} has no values"
            values[name] = found[0]
    return values, options


def evaluate_panels(dashboard: Mapping[str, Any], prom: PrometheusServer, values: Mapping[str, str],
                    at: float, range_s: int) -> dict[str, list[dict[str, Any]]]:
    results = {}
    for q in queries(dashboard):
        if q.is_variable:
            continue
        expr = substitute(q.expr, values, RATE_INTERVAL, f"{range_s}s")
        if q.instant:
            data = api(prom, "/api/v1/query", query=expr, time=f"{at:.3f}")
        else:
            data = api(prom, "/api/v1/query_range", query=expr, start=f"{at - 20:.3f}", end=f"{at:.3f}", step="2")
        results[q.where] = data["result"]
    return results
