"""The Helm chart rendered as `helm template` would (the Helm SDK through helm_python), and the
objects picked out of it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "offcpu-exporter"
NAMESPACE = "monitoring"


def render(values: Mapping[str, Any]) -> list[dict[str, Any]]:
    chart = helm.Chart.load(CHART)
    rendered = chart.render(dict(values), name="oe", namespace=NAMESPACE, is_install=True)
    docs: list[dict[str, Any]] = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"{len(found)} {kind}"
    return found[0]


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
