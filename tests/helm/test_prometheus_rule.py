"""The chart's PrometheusRule: off by default; when on, its rules pass `promtool check rules` and each alert
fires on the series that should fire it, and stays quiet on its near miss (`promtool test rules`)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.helm_chart import by_kind, one, render

ON: dict[str, Any] = {"prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}}}
INSTANCE = {"instance": "node1:9961", "job": "offcpu-exporter"}
ALERTS = {"OffcpuExporterProbeNotAttached", "OffcpuExporterMapFilling", "OffcpuExporterMapDropping",
          "OffcpuExporterLostStacks", "OffcpuExporterSinkDropping", "OffcpuExporterStaleFlush"}


def _series(name: str, values: str, **labels: str) -> dict[str, str]:
    text = ",".join(f'{k}="{v}"' for k, v in {**INSTANCE, **labels}.items())
    return {"series": f"{name}{{{text}}}", "values": values}


def _fires(alert: str, at: str, severity: str = "warning", **labels: str) -> dict[str, Any]:
    return {"eval_time": at, "alertname": alert,
            "exp_alerts": [{"exp_labels": {**INSTANCE, **labels, "severity": severity}}]}


def _quiet(alert: str, at: str) -> dict[str, Any]:
    return {"eval_time": at, "alertname": alert, "exp_alerts": []}


# One promtool test per alert: (input series, expectations), with the series scraped every minute.
CASES: dict[str, tuple[list[dict[str, str]], list[dict[str, Any]]]] = {
    "OffcpuExporterProbeNotAttached": (
        [_series("offcpu_exporter_probe_attached", "0x10", mode="none"),
         _series("offcpu_exporter_probe_attached", "1x10", mode="tracepoint", instance="node2:9961")],
        [_quiet("OffcpuExporterProbeNotAttached", "4m"),  # `for: 5m`: not before
         _fires("OffcpuExporterProbeNotAttached", "6m", severity="critical", mode="none")],
    ),
    "OffcpuExporterMapFilling": (
        [_series("offcpu_exporter_map_entries", "9500x30", map="counts"),
         _series("offcpu_exporter_map_capacity", "10000x30", map="counts"),
         _series("offcpu_exporter_map_entries", "5000x30", map="stacks"),
         _series("offcpu_exporter_map_capacity", "10000x30", map="stacks")],
        [_quiet("OffcpuExporterMapFilling", "10m"),
         _fires("OffcpuExporterMapFilling", "20m", map="counts")],
    ),
    "OffcpuExporterMapDropping": (
        [_series("offcpu_exporter_map_dropped_total", "0 0 0 5 5 5 5", map="counts"),
         _series("offcpu_exporter_map_dropped_total", "0x6", map="stacks")],
        [_quiet("OffcpuExporterMapDropping", "2m"),
         _fires("OffcpuExporterMapDropping", "5m", map="counts")],
    ),
    "OffcpuExporterLostStacks": (
        [_series("offcpu_exporter_lost_stacks_total", "0+10x40", half="kernel", reason="ENOMEM"),
         _series("offcpu_exporter_lost_stacks_total", "0+100x40", half="user", reason="EFAULT")],
        [_quiet("OffcpuExporterLostStacks", "10m"),
         _fires("OffcpuExporterLostStacks", "30m", half="kernel", reason="ENOMEM")],
    ),
    "OffcpuExporterSinkDropping": (
        [_series("offcpu_exporter_sink_dropped_total", "0 0 0 0 3 3 3", sink="otlp"),
         _series("offcpu_exporter_sink_dropped_total", "0x6", sink="skywalking")],
        [_quiet("OffcpuExporterSinkDropping", "3m"),
         _fires("OffcpuExporterSinkDropping", "5m", sink="otlp")],
    ),
    "OffcpuExporterStaleFlush": (
        # Flushes every 5 s, i.e. +12 per one-minute scrape, until minute 5; then none.
        [_series("offcpu_exporter_flushes_total", "0+12x5 60x10"),
         _series("offcpu_exporter_probe_attached", "1x15", mode="tracepoint")],
        [_quiet("OffcpuExporterStaleFlush", "5m"),
         _quiet("OffcpuExporterStaleFlush", "6m"),  # 1 min without a flush: within the 2 min window
         _fires("OffcpuExporterStaleFlush", "8m")],
    ),
}


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool (Debian prometheus) is needed: scripts/setup --test"
    return path


def rules(values: dict[str, Any]) -> dict[str, Any]:
    return one(render(values), "PrometheusRule")


def test_off_by_default() -> None:
    assert not by_kind(render({}), "PrometheusRule")


def test_every_documented_alert_is_there() -> None:
    rule = rules(ON)
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    names = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert names == ALERTS == set(CASES)
    documented = (Path(__file__).resolve().parents[2] / "docs" / "prometheus.md").read_text()
    for name in names:
        assert f"`{name}`" in documented, f"{name} is not described in docs/prometheus.md"


def test_promtool_checks_the_rules(promtool: str, tmp_path: Path) -> None:
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rules(ON)["spec"]))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout, result.stdout


@pytest.mark.parametrize("alert", sorted(CASES))
def test_each_alert_fires_when_it_should(alert: str, promtool: str, tmp_path: Path) -> None:
    spec = rules(ON)["spec"]
    for group in spec["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)  # checked by `check rules`; here the expressions and labels
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(spec))
    series, expectations = CASES[alert]
    test = {"rule_files": ["rules.yml"], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": expectations}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test))
    result = subprocess.run([promtool, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_stale_window_follows_the_flush_interval() -> None:
    def stale_expr(values: dict[str, Any]) -> str:
        rule = rules(values)
        return next(r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]
                    if r["alert"] == "OffcpuExporterStaleFlush")

    assert "[120s]" in stale_expr(ON)  # 10 x 5 s is shorter than two scrapes: 2 minutes
    assert "[300s]" in stale_expr({**ON, "flushInterval": 30})
    assert "[90s]" not in stale_expr({**ON, "flushInterval": 30, "prometheusRule": {"enabled": True,
                                                                                     "staleFlushIntervals": 3}})
