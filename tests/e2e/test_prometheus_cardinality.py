"""Cardinality limits on real data: more processes and stacks than allowed give bounded series, the
overflow metric and `other` series that keep the sums right.

Five sleeping workloads (one thread each, off CPU ~1 s/s) are watched with room for two processes
and one stack each. Between two scrapes in the middle of the run the increase over every pid label
(the two selected processes and pid="other") must be the five workloads' known rate.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import ExitStack

import pytest
from prometheus_client.parser import text_string_to_metric_families

from testkit.exporter import ExporterProcess
from testkit.workloads import Workload

pytestmark = pytest.mark.kernel


def parse(body: bytes) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            out[s.name].append((s.labels, s.value))
    return out


def per_pid(metrics: dict[str, list[tuple[dict[str, str], float]]], name: str) -> dict[str, float]:
    acc: dict[str, float] = defaultdict(float)
    for labels, value in metrics[name]:
        acc[labels["pid"]] += value
    return dict(acc)


def test_process_and_stack_limits_fold_into_other_with_exact_sums() -> None:
    with ExitStack() as stack:
        workloads = [
            stack.enter_context(Workload("sleep", threads=1, iterations=1000, interval_ms=20)) for _ in range(5)
        ]
        # By pid, not by name: other test runs on this machine may run the same workload binary.
        pids = [arg for w in workloads for arg in ("--pid", str(w.pid))]
        exporter = stack.enter_context(
            ExporterProcess(
                [
                    *pids,
                    "--flush-interval",
                    "0.25",
                    "--prometheus.max-processes",
                    "2",
                    "--prometheus.top-stacks",
                    "1",
                ]
            )
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if b"offcpu_exporter_targets 5.0" in exporter.get("/metrics"):
                break
            time.sleep(0.2)
        for w in workloads:
            w.go()
        time.sleep(5)  # past the main threads' wait for "go", charged when they wake
        t1, first = time.monotonic(), parse(exporter.get("/metrics"))
        time.sleep(8)
        t2, second = time.monotonic(), parse(exporter.get("/metrics"))
        results = [w.wait(timeout=120) for w in workloads]

    known = sum(t.blocked_ns / t.wall_ns for r in results for t in r.threads)
    assert known == pytest.approx(5.0, rel=0.05)
    before, after = per_pid(first, "offcpu_seconds_total"), per_pid(second, "offcpu_seconds_total")
    # Bounded: two processes and "other", however many are watched.
    assert len(after) == 3 and "other" in after
    selected = set(after) - {"other"}
    assert selected <= {str(w.pid) for w in workloads}
    # Each process: its sleeper, and its main thread waiting in pthread_join all along (a block in
    # progress, counted while it lasts).
    rate = sum(after[p] - before.get(p, 0.0) for p in after) / (t2 - t1)
    assert rate == pytest.approx(known + len(workloads), rel=0.05)
    other_rate = (after["other"] - before["other"]) / (t2 - t1)
    assert other_rate == pytest.approx(2 * 3.0, rel=0.05)  # the three folded workloads
    overflow = {labels["what"]: v for labels, v in second["offcpu_exporter_cardinality_overflow_total"]}
    assert overflow["processes"] == 3
    # One named stack per process plus "other", and they sum to the process totals.
    stacks = second["offcpu_stack_seconds_total"]
    for pid in selected:
        ids = [labels["stack_id"] for labels, _ in stacks if labels["pid"] == pid]
        assert len(ids) == 2 and "other" in ids
    stack_sums = per_pid(second, "offcpu_stack_seconds_total")
    assert stack_sums.keys() == after.keys()
    for pid, total in after.items():
        assert stack_sums[pid] == pytest.approx(total, rel=1e-9, abs=1e-9)


# Series of one process at the defaults (--prometheus.top-stacks 10, histogram per container): five
# reasons of offcpu_seconds_total, the four a switch can have of offcpu_switches_total,
# offcpu_blocked_threads and offcpu_blocked_longest_seconds, and its stacks' two counters (K named
# stacks and "other"). The per-process histogram (29 series) is opt-in. docs/prometheus.md has the
# arithmetic per node.
PER_PROCESS_FIXED = 5 + 3 * 4
SERIES_BUDGET_PER_PROCESS = 40


def test_series_per_process_at_defaults_stay_within_budget() -> None:
    with ExitStack() as stack:
        workloads = [stack.enter_context(Workload(mode, threads=2, iterations=1000, interval_ms=5))
                     for mode in ("sleep", "pipe", "mutex")]
        pids = [arg for w in workloads for arg in ("--pid", str(w.pid))]
        exporter = stack.enter_context(ExporterProcess([*pids, "--flush-interval", "0.25"]))
        for w in workloads:
            w.go()
        time.sleep(4)
        body = exporter.get("/metrics")
        for w in workloads:
            w.wait(timeout=120)

    per_pid: dict[str, int] = defaultdict(int)
    stack_ids: dict[str, set[str]] = defaultdict(set)
    histogram_groups = set()
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            if fam.name == "offcpu_block_duration_seconds":
                assert "pid" not in s.labels and "comm" not in s.labels, s
                histogram_groups.add((s.labels["namespace"], s.labels["pod"], s.labels["container"]))
            if "pid" in s.labels:
                per_pid[s.labels["pid"]] += 1
            if fam.name == "offcpu_stack_seconds":
                stack_ids[s.labels["pid"]].add(s.labels["stack_id"])
    counts = {str(w.pid): per_pid[str(w.pid)] for w in workloads}
    print(f"series per process at defaults: {counts}")
    for pid, n in counts.items():
        assert len(stack_ids[pid]) >= 2, (pid, stack_ids[pid])  # a named stack and "other" at least
        assert n == PER_PROCESS_FIXED + 2 * len(stack_ids[pid]), (pid, n, stack_ids[pid])
        assert n <= SERIES_BUDGET_PER_PROCESS, (pid, n)
    # The three host processes share one histogram: 26 finite buckets, +Inf, _sum and _count.
    assert histogram_groups == {("", "", "")}
    hist = sum(1 for line in body.decode().splitlines() if line.startswith("offcpu_block_duration_seconds"))
    assert hist == 29
