"""Reading a real exporter's /metrics page and its /proc figures (reliability and e2e tests)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families


def samples(text: str, name: str, match: Callable[[dict[str, str]], bool] = lambda labels: True) -> list[float]:
    """Values of the samples called `name` whose labels pass `match`."""
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and match(s.labels):
                out.append(float(s.value))
    return out


def total(text: str, name: str, **labels: str) -> float:
    return sum(samples(text, name, lambda got: all(got.get(k) == v for k, v in labels.items())))


def label_sets(text: str, name: str) -> list[dict[str, str]]:
    return [dict(s.labels) for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == name]


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise LookupError(f"no VmRSS for pid {pid}")
