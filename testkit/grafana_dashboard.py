"""Reading the PromQL out of a Grafana dashboard JSON: panel targets and variable queries, the metric
names they use, and the dashboard variables replaced by concrete values for evaluation."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
        "stack_captures_total", "seeded_stacks_total",
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
            query = var["query"]["query"] if isinstance(var["query"], Mapping) else var["query"]
            m = re.fullmatch(r"\s*label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)\s*", query)
            assert m, f"variable {var['name']}: unsupported query {query!r}"
            # label_values(selector, label) == the label's values among the selector's series.
            out.append(Query(f"variable {var['name']}", f"group by ({m[2]}) ({m[1]})", True, True))
    return out


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
