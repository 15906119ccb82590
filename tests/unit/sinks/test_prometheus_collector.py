"""The Prometheus collector on synthetic snapshots: sums, folding, histogram, escaping, describe()."""

from __future__ import annotations

import argparse
import gzip
import math
import random
import shutil
import subprocess
from collections import defaultdict

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from offcpu_exporter.series.selection import Selection
from offcpu_exporter.sinks import SinkContext, SinkStats
from offcpu_exporter.sinks.prometheus import options as prom_options
from offcpu_exporter.sinks.prometheus import sink as prom_sink
from offcpu_exporter.sinks.prometheus.collector import OffCPUCollector
from offcpu_exporter.sinks.prometheus.exposition import ExpositionCache
from offcpu_exporter.snapshot import (
    HISTOGRAM_BUCKETS_US,
    Frame,
    FrameKind,
    Health,
    LostHalf,
    ProcessInfo,
    ProcessKey,
    Reason,
    Snapshot,
    Stack,
)
from offcpu_exporter.web import Request, Routes
from testkit.snapshots import LIBC, SEC, Builder, kernel, many_stacks, process, stack


def render(
    builder_or_snapshot: Builder | Snapshot,
    top: int = 10,
    max_processes: int = 200,
    stack_label: bool = False,
    selection: Selection | None = None,
    per_thread: bool = False,
) -> str:
    snap = builder_or_snapshot.snapshot() if isinstance(builder_or_snapshot, Builder) else builder_or_snapshot
    sel = selection or Selection(max_processes=max_processes, top_stacks=top)
    reg = CollectorRegistry()
    reg.register(
        OffCPUCollector(lambda: snap, lambda: [], sel, stack_label=stack_label, bcc="0.26.0", per_thread=per_thread)
    )
    return generate_latest(reg).decode()


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                out.append((s.labels, s.value))
    return out


def by(text: str, name: str, label: str) -> dict[str, float]:
    acc: dict[str, float] = defaultdict(float)
    for labels, value in samples(text, name):
        acc[labels[label]] += value
    return dict(acc)


def test_process_series_by_reason_carry_identity_labels() -> None:
    b = Builder()
    p = process(42, "nginx", namespace="web", pod="nginx-1", container="nginx")
    b.add(p, stack("read"), 1.5, 3, Reason.SLEEPING)
    b.add(p, stack("fsync", "io_schedule"), 0.25, 2, Reason.UNINTERRUPTIBLE)
    b.add(p, stack("loop"), 0.125, 5, Reason.RUNNABLE)
    text = render(b)
    secs = {lab["reason"]: v for lab, v in samples(text, "offcpu_seconds_total")}
    assert secs == {"runnable": 0.125, "sleeping": 1.5, "uninterruptible": 0.25, "other": 0.0, "stolen": 0.0}
    sw = {lab["reason"]: v for lab, v in samples(text, "offcpu_switches_total")}
    assert sw == {"runnable": 5, "sleeping": 3, "uninterruptible": 2, "other": 0}
    labels = samples(text, "offcpu_seconds_total")[0][0]
    assert {k: labels[k] for k in ("pid", "comm", "namespace", "pod", "container")} == {
        "pid": "42",
        "comm": "nginx",
        "namespace": "web",
        "pod": "nginx-1",
        "container": "nginx",
    }


def test_top_k_folding_keeps_sums_exact() -> None:
    b = Builder()
    p = process(7, "db")
    for i, st in enumerate(many_stacks(25)):
        # Awkward values (thirds, primes) so that float slop would show.
        b.add(p, st, (i + 1) / 3, count=i + 2, reason=Reason.SLEEPING, tid=100)
        b.add(p, st, 0.017 * i, count=1, reason=Reason.RUNNABLE, tid=101)
    text = render(b, top=5)
    stacks = samples(text, "offcpu_stack_seconds_total")
    assert len(stacks) == 6  # 5 + other
    named = sorted((v, lab["stack_id"]) for lab, v in stacks if lab["stack_id"] != "other")
    other = [v for lab, v in stacks if lab["stack_id"] == "other"]
    assert len(other) == 1
    # The top 5 by off-CPU time are the last five (aggregated over both threads and reasons).
    top_ids = {st.stack_id for st in many_stacks(25)[20:]}
    assert {sid for _, sid in named} == top_ids
    process_total = sum(v for _, v in samples(text, "offcpu_seconds_total"))
    assert sum(v for _, v in stacks) == pytest.approx(process_total, rel=1e-12)
    # Exact in integers too: switch counts.
    st_sw = sum(v for _, v in samples(text, "offcpu_stack_switches_total"))
    assert st_sw == sum(v for _, v in samples(text, "offcpu_switches_total"))
    # Labels of a named stack.
    lab = next(lab for lab, _ in stacks if lab["stack_id"] != "other")
    assert lab["user_function"].startswith("fn_")
    assert lab["kernel_function"] in ("futex_wait", "do_nanosleep")
    assert "stack" not in lab


def test_stack_series_stay_monotonic_and_exact_when_a_new_stack_gets_hot() -> None:
    b = Builder()
    p = process(9, "svc")
    cold = many_stacks(3)
    for st in cold:
        b.add(p, st, 1.0)
    sel = Selection(top_stacks=2)
    first = render(b, selection=sel)
    hot = stack("hot_path", "ep_poll")
    previous = {lab["stack_id"]: v for lab, v in samples(first, "offcpu_stack_seconds_total")}
    for _ in range(6):
        b.add(p, hot, 10.0)
        b.add(p, cold[0], 0.001)
        text = render(b, selection=sel)
        now = {lab["stack_id"]: v for lab, v in samples(text, "offcpu_stack_seconds_total")}
        total = sum(v for _, v in samples(text, "offcpu_seconds_total"))
        assert sum(now.values()) == pytest.approx(total)
        assert now["other"] >= previous["other"] - 1e-9  # `other` never goes down
        for sid, v in now.items():
            if sid in previous:
                assert v >= previous[sid] - 1e-9
        previous = now
    assert hot.stack_id in previous  # the hot stack took a slot


def through_helper(caller: str, kernel_leaf: str) -> Stack:
    """The issue's stacks: a thread function calling one helper that makes the system call."""
    return Stack(
        user=(Frame("syscall", FrameKind.NATIVE, "/usr/bin/app"), Frame(caller, FrameKind.NATIVE, "/usr/bin/app"),
              Frame("thread_main", FrameKind.NATIVE, "/usr/bin/app"), Frame("start_thread", FrameKind.NATIVE, LIBC)),
        kernel=kernel("finish_task_switch.isra.0", "__schedule", "schedule", kernel_leaf),
    )


def test_stack_series_name_where_the_application_waited_and_differ_by_code_path() -> None:
    b = Builder()
    p = process(11, "waits")
    stacks = [through_helper("hold_in_nanosleep", "do_nanosleep"), through_helper("wait_for_pipe_message", "pipe_read"),
              through_helper("feed_pipe_periodically", "do_nanosleep")]
    for i, st in enumerate(stacks):
        b.add(p, st, 1.0 + i)
    labels = [lab for lab, _ in samples(render(b), "offcpu_stack_seconds_total") if lab["stack_id"] != "other"]
    by_function = {lab["app_function"]: lab for lab in labels}
    assert set(by_function) == {"hold_in_nanosleep", "wait_for_pipe_message", "feed_pipe_periodically"}
    assert by_function["hold_in_nanosleep"]["call_path"] == "thread_main;hold_in_nanosleep"
    # The old labels alone could not tell two of them apart; the new ones do.
    assert {lab["user_function"] for lab in labels} == {"syscall"}
    old = [tuple(lab[k] for k in ("pid", "comm", "user_function", "kernel_function")) for lab in labels]
    assert len(set(old)) == 2
    new = [tuple(v for k, v in sorted(lab.items()) if k != "stack_id") for lab in labels]
    assert len(set(new)) == 3


def test_stack_series_carry_the_process_identity() -> None:
    b = Builder()
    p = process(12, "api", namespace="shop", pod="api-7", container="server")
    b.add(p, stack("serve"), 2.0)
    for lab, _ in samples(render(b), "offcpu_stack_seconds_total"):
        assert (lab["namespace"], lab["pod"], lab["container"]) == ("shop", "api-7", "server")
    other = next(lab for lab, _ in samples(render(b), "offcpu_stack_switches_total") if lab["stack_id"] == "other")
    assert other["app_function"] == other["call_path"] == "other" and other["pod"] == "api-7"
    # The folded processes' stack series, like their process series, have an empty identity.
    b.add(process(13, "small"), stack("x"), 0.5)
    folded = samples(render(b, max_processes=1), "offcpu_stack_seconds_total")
    assert [(lab["namespace"], lab["stack_id"]) for lab, _ in folded if lab["pid"] == "other"] == [("", "other")]


def thread_series(text: str, name: str = "offcpu_seconds_total") -> dict[tuple[str, str], float]:
    acc: dict[tuple[str, str], float] = defaultdict(float)
    for lab, v in samples(text, name):
        acc[(lab["tid"], lab["thread"])] += v
    return dict(acc)


def test_per_thread_series_on_the_process_counters_with_a_limit_and_other() -> None:
    b = Builder()
    p = process(20, "pool")
    for tid in range(100, 106):
        b.add(p, stack("work"), (tid - 99) * 1.0, count=tid - 99, reason=Reason.SLEEPING, tid=tid)
        b.add(p, stack("spin"), 0.25, count=1, reason=Reason.RUNNABLE, tid=tid)
    sel = Selection(top_threads=3)
    text = render(b, selection=sel, per_thread=True)
    threads = thread_series(text)
    # The three busiest threads by name and id, the rest in tid="other"; every reason of each.
    assert threads == pytest.approx({("105", "t105"): 6.25, ("104", "t104"): 5.25, ("103", "t103"): 4.25,
                                     ("other", "other"): 3 * 0.25 + 1 + 2 + 3})
    assert len(samples(text, "offcpu_seconds_total")) == 4 * 5  # time by every reason
    assert len(samples(text, "offcpu_switches_total")) == 4 * 4  # switches: not Reason.STOLEN
    assert sum(thread_series(text, "offcpu_switches_total").values()) == sum(range(1, 7)) + 6
    reasons = {lab["reason"]: v for lab, v in samples(text, "offcpu_seconds_total") if lab["tid"] == "105"}
    assert reasons == {"sleeping": 6.0, "runnable": 0.25, "uninterruptible": 0.0, "other": 0.0, "stolen": 0.0}
    overflow = {lab["what"]: v for lab, v in samples(text, "offcpu_exporter_cardinality_overflow_total")}
    assert overflow["threads"] == 3
    # The stack series stay per process.
    assert all("tid" not in lab for lab, _ in samples(text, "offcpu_stack_seconds_total"))
    # A thread that becomes the hottest takes a slot; every series only goes up; sums stay exact.
    previous = threads
    for _ in range(5):
        b.add(p, stack("work"), 20.0, reason=Reason.SLEEPING, tid=100)
        text = render(b, selection=sel, per_thread=True)
        now = thread_series(text)
        assert now[("other", "other")] >= previous[("other", "other")] - 1e-9
        for key, v in now.items():
            assert v >= previous.get(key, 0.0) - 1e-9
        assert sum(now.values()) == pytest.approx(sum(v for _, v in samples(text, "offcpu_stack_seconds_total")))
        previous = now
    assert ("100", "t100") in previous


def test_per_thread_labels_only_with_per_thread() -> None:
    b = Builder()
    b.add(process(21, "one"), stack("x"), 1.0, tid=21)
    assert all("tid" not in lab for lab, _ in samples(render(b), "offcpu_seconds_total"))
    # Folded processes have tid="other" too when the series have thread labels.
    b.add(process(22, "two"), stack("x"), 0.5, tid=22)
    text = render(b, max_processes=1, per_thread=True)
    assert thread_series(text) == {("21", "t21"): 1.0, ("other", "other"): 0.5}
    assert {lab["pid"] for lab, _ in samples(text, "offcpu_seconds_total") if lab["tid"] == "other"} == {"21", "other"}
    promtool_check(text)


def test_per_thread_reaches_metrics_through_the_command_line() -> None:
    from offcpu_exporter.cli import build_parser

    b = Builder()
    for tid in (31, 32, 33):
        b.add(process(30, "cli"), stack("x"), tid / 10, tid=tid)
    options = build_parser([prom_options]).parse_args(
        ["serve", "--pid", "30", "--per-thread", "--prometheus.top-threads", "2"]
    )
    current = b.snapshot()
    sink = prom_sink.create(options, SinkContext(latest=lambda: current, flush_now=lambda t: current, routes=Routes()))
    text = generate_latest(sink.registry).decode()
    assert thread_series(text) == pytest.approx({("33", "t33"): 3.3, ("32", "t32"): 3.2, ("other", "other"): 3.1})


def test_bad_thread_and_call_path_limits_are_refused() -> None:
    from offcpu_exporter.cli import build_parser

    parser = build_parser([prom_options])
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["serve", "--prometheus.call-path-frames", "0"])
    assert exit_.value.code == 2
    options = parser.parse_args(["serve", "--prometheus.top-threads", "-1"])
    with pytest.raises(ValueError, match="must not be negative"):
        prom_sink.create(options, SinkContext(latest=Snapshot.empty, flush_now=lambda t: Snapshot.empty(),
                                              routes=Routes()))


def test_call_path_frames_option_bounds_the_label() -> None:
    b = Builder()
    deep = Stack(user=tuple(Frame(f"f{i}", FrameKind.NATIVE, "/usr/bin/app") for i in range(8)),
                 kernel=kernel("do_nanosleep"))
    b.add(process(40, "deep"), deep, 1.0)
    snap = b.snapshot()
    for frames, want in ((4, "f3;f2;f1;f0"), (2, "f1;f0")):
        reg = CollectorRegistry()
        reg.register(OffCPUCollector(lambda: snap, lambda: [], Selection(), bcc="x", call_path_frames=frames))
        paths = {lab["call_path"] for lab, _ in samples(generate_latest(reg).decode(), "offcpu_stack_seconds_total")}
        assert paths == {want, "other"}


def test_stack_label_is_the_folded_stack_when_enabled() -> None:
    b = Builder()
    st = stack("offcpu_sleep_ms")
    b.add(process(5, "w"), st, 1.0)
    text = render(b, stack_label=True)
    labs = [lab for lab, _ in samples(text, "offcpu_stack_seconds_total")]
    assert {lab["stack"] for lab in labs} == {st.folded(), "other"}


def test_cardinality_overflow_folds_processes_into_other_and_counts_them() -> None:
    b = Builder()
    for pid in range(1, 31):
        b.add(process(pid, f"p{pid}"), stack("wait"), pid * 0.1, count=pid)
    sel = Selection(max_processes=10, top_stacks=10)
    text = render(b, selection=sel)
    pids = set(by(text, "offcpu_seconds_total", "pid"))
    assert len(pids) == 11 and "other" in pids
    assert pids - {"other"} == {str(p) for p in range(21, 31)}  # the largest ones first
    expected_total = sum(pid * 0.1 for pid in range(1, 31))
    assert sum(by(text, "offcpu_seconds_total", "pid").values()) == pytest.approx(expected_total)
    stack_sums = by(text, "offcpu_stack_seconds_total", "pid")
    proc_sums = by(text, "offcpu_seconds_total", "pid")
    assert stack_sums.keys() == proc_sums.keys()
    for pid_label, v in proc_sums.items():
        assert stack_sums[pid_label] == pytest.approx(v)
    assert (
        samples(text, "offcpu_exporter_cardinality_overflow_total") == [({"what": "processes"}, 20.0)]
        or dict((lab["what"], v) for lab, v in samples(text, "offcpu_exporter_cardinality_overflow_total"))["processes"]
        == 20.0
    )
    # Bounded: series count does not grow with more processes.
    for pid in range(31, 300):
        b.add(process(pid, f"q{pid}"), stack("wait"), 0.01)
    text = render(b, selection=sel)
    assert len(set(by(text, "offcpu_seconds_total", "pid"))) == 11
    overflow = {lab["what"]: v for lab, v in samples(text, "offcpu_exporter_cardinality_overflow_total")}
    assert overflow["processes"] == 20 + 269


def test_folded_processes_counter_survives_their_exit_and_restart_is_a_new_series() -> None:
    b = Builder()
    big = process(1, "big")
    b.add(big, stack("a"), 100.0)
    small = [process(pid, "small") for pid in (2, 3)]
    for p in small:
        b.add(p, stack("a"), 1.0)
    sel = Selection(max_processes=1)
    text = render(b, selection=sel)
    other_before = by(text, "offcpu_seconds_total", "pid")["other"]
    assert other_before == pytest.approx(2.0)
    b.remove(small[0].key)  # exited, past its grace period
    text = render(b, selection=sel)
    assert by(text, "offcpu_seconds_total", "pid")["other"] == pytest.approx(2.0)
    # The selected process exits and restarts under a new pid: new series, its slot is free again.
    b.remove(big.key)
    again = process(11, "big", start_ticks=5000)
    b.add(again, stack("a"), 0.5)
    text = render(b, selection=sel)
    pids = by(text, "offcpu_seconds_total", "pid")
    assert "1" not in pids and pids["11"] == pytest.approx(0.5)


def test_exited_process_in_grace_period_is_still_exported() -> None:
    b = Builder()
    b.add(process(77, "gone", exited=True), stack("x"), 3.0)
    assert by(render(b), "offcpu_seconds_total", "pid") == {"77": 3.0}


def test_reused_pid_exports_the_live_process_only() -> None:
    b = Builder()
    b.add(process(50, "old", start_ticks=10, exited=True), stack("x"), 3.0)
    b.add(process(50, "new", start_ticks=99), stack("x"), 1.0)
    text = render(b)
    assert by(text, "offcpu_seconds_total", "comm") == {"new": 1.0}


def test_histogram_is_cumulative_with_le_in_seconds() -> None:
    b = Builder()
    p = process(3, "h")
    b.add(p, stack("x"), 12.0, count=111)
    b.add_blocks(p, {0: 1, 1: 2, 10: 4, 25: 8, 26: 96})
    text = render(b)
    buckets = {lab["le"]: v for lab, v in samples(text, "offcpu_block_duration_seconds_bucket")}
    assert len(buckets) == len(HISTOGRAM_BUCKETS_US) + 1
    assert buckets["1e-06"] == 1  # slot 0: < 1 us
    assert buckets["2e-06"] == 3
    assert buckets["0.000512"] == 3
    assert buckets["0.001024"] == 7  # slot 10: [512, 1024) us
    assert buckets["16.777216"] == 7
    assert buckets["33.554432"] == 15  # slot 25
    assert buckets["+Inf"] == 111  # slot 26: from 2^25 us on
    values = [buckets[k] for k in sorted(buckets, key=lambda k: math.inf if k == "+Inf" else float(k))]
    assert values == sorted(values)
    assert samples(text, "offcpu_block_duration_seconds_count")[0][1] == 111
    assert samples(text, "offcpu_block_duration_seconds_sum")[0][1] == 12.0


def test_histogram_per_container_sums_its_processes_and_survives_their_exit() -> None:
    """The default (--prometheus.histogram-by container): one histogram per (namespace, pod, container), host
    processes in the one with empty names, folded processes in their own container's; an exit never lowers it."""
    sel = Selection(max_processes=2, group_histograms=True)
    b = Builder()
    web1, web2 = (process(pid, "web", namespace="shop", pod="web-0", container="app") for pid in (10, 11))
    host = process(20, "sshd")
    for p, seconds, slots in ((web1, 1.0, {3: 2}), (web2, 2.0, {3: 1, 12: 4}), (host, 4.0, {20: 3})):
        b.add(p, stack("x"), seconds, count=sum(slots.values()))
        b.add_blocks(p, slots)
    text = render(b, selection=sel)
    hist = samples(text, "offcpu_block_duration_seconds_count")
    # No pid or comm: the three processes make two histograms, whatever their number.
    assert sorted((lab.get("pod", ""), v) for lab, v in hist) == [("", 3), ("web-0", 7)]
    assert all(set(lab) == {"namespace", "pod", "container"} for lab, _ in hist)
    sums = {lab["pod"]: v for lab, v in samples(text, "offcpu_block_duration_seconds_sum")}
    assert sums == {"": 4.0, "web-0": 3.0}
    buckets = {lab["le"]: v for lab, v in samples(text, "offcpu_block_duration_seconds_bucket")
               if lab["pod"] == "web-0"}
    assert buckets["8e-06"] == 3 and buckets["0.004096"] == 7 and buckets["+Inf"] == 7
    # max_processes=2 folded one process into pid="other": still in its container's histogram, and no
    # pid="other" histogram.
    assert "other" in by(text, "offcpu_seconds_total", "pid")
    # One of the pod's processes exits and leaves the snapshot: the pod's histogram keeps its blocks.
    b.add_blocks(web2, {12: 1})
    b.add(web2, stack("x"), 0.5)
    text = render(b, selection=sel)
    b.remove(web2.key)
    b.add_blocks(web1, {3: 1})
    b.add(web1, stack("x"), 0.25)
    text = render(b, selection=sel)
    counts = {lab["pod"]: v for lab, v in samples(text, "offcpu_block_duration_seconds_count")}
    assert counts == {"": 3, "web-0": 9}
    sums = {lab["pod"]: v for lab, v in samples(text, "offcpu_block_duration_seconds_sum")}
    assert sums["web-0"] == pytest.approx(3.75)
    # The last process of the pod gone: the pod's series end.
    b.remove(web1.key)
    text = render(b, selection=sel)
    assert [lab.get("pod", "") for lab, _ in samples(text, "offcpu_block_duration_seconds_count")] == [""]
    promtool_check(text)


def test_histogram_by_container_is_the_default_and_process_is_opt_in() -> None:
    parser = argparse.ArgumentParser()
    prom_options.add_arguments(parser)
    assert prom_options.PrometheusOptions.from_args(parser.parse_args([])).histogram_by == "container"
    assert prom_options.PrometheusOptions.from_args(
        parser.parse_args(["--prometheus.histogram-by", "process"])).histogram_by == "process"
    with pytest.raises(SystemExit):
        parser.parse_args(["--prometheus.histogram-by", "pid"])
    b = Builder()
    b.add(process(3, "h", namespace="ns", pod="p", container="c"), stack("x"), 1.0)
    snap = b.snapshot()
    for histogram_by, labels in (("container", {"namespace", "pod", "container"}),
                                 ("process", {"pid", "comm", "namespace", "pod", "container"})):
        context = SinkContext(latest=lambda: snap, flush_now=lambda t: snap, routes=Routes())
        sink = prom_sink.PrometheusSink(context, prom_options.PrometheusOptions(histogram_by=histogram_by), bcc="x")
        text = generate_latest(sink.registry).decode()
        assert [set(lab) for lab, _ in samples(text, "offcpu_block_duration_seconds_count")] == [labels]


@pytest.mark.parametrize("comm", ['a"b', "back\\slash", "new\nline", "bad\udcffutf8", "ünï{cödé}", 'x="y",z'])
def test_hostile_label_values_round_trip(comm: str) -> None:
    b = Builder()
    b.add(process(8, comm), stack(f"fn{comm}"), 1.0)
    text = render(b)
    want = comm.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    got = {lab["comm"] for lab, _ in samples(text, "offcpu_seconds_total")}
    assert got == {want}
    expected = {"user_function": "fn" + want, "app_function": "fn" + want, "call_path": "main;fn" + want}
    for label, value in expected.items():
        assert {lab[label] for lab, _ in samples(text, "offcpu_stack_seconds_total")} - {"other"} == {value}
    promtool_check(text)


def test_describe_lists_every_family_without_samples() -> None:
    sel = Selection()
    col = OffCPUCollector(lambda: Snapshot.empty(), lambda: [], sel, bcc="x")
    described = {m.name: m.type for m in col.describe()}
    assert all(not m.samples for m in col.describe())
    assert described["offcpu_seconds"] == "counter"
    assert described["offcpu_block_duration_seconds"] == "histogram"
    assert described["offcpu_exporter_probe_attached"] == "gauge"
    # Every constant-1 metric with descriptive labels is an info metric named ..._info.
    assert described["offcpu_exporter_build"] == described["offcpu_exporter_probe_hooked_symbol"] == "info"
    collected = {m.name for m in col.collect()}
    assert collected == set(described)
    reg = CollectorRegistry()
    reg.register(col)  # uses describe(); a second registration of the same names is refused
    with pytest.raises(ValueError):
        reg.register(OffCPUCollector(lambda: Snapshot.empty(), lambda: [], sel, bcc="x"))


def test_self_metrics_from_health_and_sink_stats() -> None:
    health = Health(
        attach_mode="tracepoint",
        hooked_symbols=("sched:sched_switch",),
        probe_attached=True,
        lost_stacks={LostHalf("user", "EFAULT"): 4, LostHalf("kernel", "ENOMEM"): 1},
        map_entries={"counts": 10},
        map_capacity={"counts": 10240},
        map_dropped={"counts": 3},
        dropped_ns=1_500_000_000,
        filtered_blocks=7,
        filtered_ns=250_000_000,
        blocks=1000,
        stack_captures=125,
        stack_sampling=True,
        stack_sampled_ratio=0.125,
        probe_run_ns=3_000_000_000,
        probe_runs=12_000,
        probe_skipped_runs=5,
        unwind_walks={"root": 90, "fault": 2},
        unwind_frames={"cfi": 1500, "frame_pointer": 40},
        unwind_processes=3,
        unwind_no_space=1,
        symbolization_failures=2,
        flush_duration_seconds=0.012,
        flushes=9,
        targets=4,
    )
    b = Builder()
    b.health = health

    class FakeSink:
        name = "skywalking"
        stats = SinkStats()

    FakeSink.stats.add("sent", 12)
    FakeSink.stats.add("retried", 2)
    snap = b.snapshot()
    reg = CollectorRegistry()
    reg.register(OffCPUCollector(lambda: snap, lambda: [FakeSink()], Selection(), bcc="0.26.0"))  # type: ignore[list-item]
    text = generate_latest(reg).decode()
    assert samples(text, "offcpu_exporter_probe_attached") == [({"mode": "tracepoint"}, 1.0)]
    assert samples(text, "offcpu_exporter_probe_hooked_symbol_info") == [
        ({"mode": "tracepoint", "symbol": "sched:sched_switch"}, 1.0)
    ]
    assert {(lab["half"], lab["reason"]): v for lab, v in samples(text, "offcpu_exporter_lost_stacks_total")} == {
        ("user", "EFAULT"): 4,
        ("kernel", "ENOMEM"): 1,
    }
    assert samples(text, "offcpu_exporter_map_capacity") == [({"map": "counts"}, 10240.0)]
    assert samples(text, "offcpu_exporter_map_dropped_total") == [({"map": "counts"}, 3.0)]
    assert samples(text, "offcpu_exporter_dropped_seconds_total")[0][1] == 1.5
    assert samples(text, "offcpu_exporter_filtered_blocks_total") == [({}, 7.0)]
    assert samples(text, "offcpu_exporter_filtered_seconds_total") == [({}, 0.25)]
    assert samples(text, "offcpu_exporter_blocks_total") == [({}, 1000.0)]
    assert samples(text, "offcpu_exporter_stack_captures_total") == [({}, 125.0)]
    assert samples(text, "offcpu_exporter_stack_sampling_ratio") == [({}, 0.125)]
    assert samples(text, "offcpu_exporter_probe_cpu_seconds_total") == [({}, 3.0)]
    assert samples(text, "offcpu_exporter_probe_runs_total") == [({}, 12000.0)]
    assert samples(text, "offcpu_exporter_probe_skipped_runs_total") == [({}, 5.0)]
    assert by(text, "offcpu_exporter_unwind_walks_total", "end") == {"fault": 2, "root": 90}
    assert by(text, "offcpu_exporter_unwind_frames_total", "method") == {"cfi": 1500, "frame_pointer": 40}
    assert samples(text, "offcpu_exporter_unwind_processes") == [({}, 3.0)]
    assert samples(text, "offcpu_exporter_unwind_tables_no_space_total") == [({}, 1.0)]
    assert samples(text, "offcpu_exporter_flushes_total")[0][1] == 9
    assert samples(text, "offcpu_exporter_targets")[0][1] == 4
    assert samples(text, "offcpu_exporter_last_flush_duration_seconds")[0][1] == 0.012
    assert by(text, "offcpu_exporter_sink_sent_total", "sink") == {"skywalking": 12}
    assert by(text, "offcpu_exporter_sink_dropped_total", "sink") == {"skywalking": 0}
    assert by(text, "offcpu_exporter_sink_retried_total", "sink")["skywalking"] == 2
    assert by(text, "offcpu_exporter_cardinality_overflow_total", "what") == {"processes": 0, "stacks": 0, "threads": 0}
    info = samples(text, "offcpu_exporter_build_info")[0][0]
    assert info["bcc"] == "0.26.0" and info["version"]


def _sink(builder: Builder) -> tuple[prom_sink.PrometheusSink, Routes, list[Snapshot]]:
    routes = Routes()
    current = [builder.snapshot()]
    ctx = SinkContext(latest=lambda: current[0], flush_now=lambda t: current[0], routes=routes)
    parser = argparse.ArgumentParser()
    prom_options.add_arguments(parser)
    sink = prom_sink.create(parser.parse_args(["--prometheus.top-stacks", "3"]), ctx)
    ctx.sinks.append(sink)
    return sink, routes, current


def test_metrics_route_caches_per_snapshot_and_negotiates_openmetrics_and_gzip() -> None:
    b = Builder()
    for st in many_stacks(8):
        b.add(process(1, "a"), st, 1.0)
    sink, routes, current = _sink(b)
    sink.cache._process_max_age = 3600.0  # the process metrics part stays the same during the test
    handler = routes.get("/metrics")
    assert handler is not None
    plain = handler(Request("GET", "/metrics", {}, {}))
    assert plain.content_type.startswith("text/plain; version=0.0.4")
    assert "Content-Encoding" not in plain.headers
    renders = sink.cache.renders
    for _ in range(20):
        again = handler(Request("GET", "/metrics", {}, {"accept-encoding": "gzip"}))
    assert sink.cache.renders == renders  # one render serves them all
    assert again.headers["Content-Encoding"] == "gzip"
    assert gzip.decompress(again.body) == plain.body
    current[0] = b.snapshot()  # a new flush: a new render
    handler(Request("GET", "/metrics", {}, {}))
    assert sink.cache.renders == renders + 1
    om = handler(Request("GET", "/metrics", {}, {"accept": "application/openmetrics-text; version=1.0.0"}))
    assert om.content_type.startswith("application/openmetrics-text")
    fams = {f.name: f for f in parse_openmetrics(om.body.decode())}
    assert fams["offcpu_seconds"].type == "counter"
    assert fams["offcpu_block_duration_seconds"].type == "histogram"
    assert "process_cpu_seconds" in fams  # the exporter's own process metrics
    assert om.body.count(b"# EOF") == 1 and om.body.endswith(b"# EOF\n")
    assert sink.stats.get("sent") == 23


def promtool_check(text: str) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found: scripts/setup --test installs Debian's prometheus package")
    r = subprocess.run([promtool, "check", "metrics"], input=text.encode(), capture_output=True, timeout=60)
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), (r.stdout + r.stderr).decode()


def test_promtool_accepts_a_full_exposition() -> None:
    b = Builder()
    for pid in range(1, 6):
        p = process(pid, f"proc{pid}", namespace="ns", pod=f"pod{pid}", container="c")
        for i, st in enumerate(many_stacks(15)):
            b.add(p, st, 0.1 * (i + 1), count=i + 1, reason=Reason(i % 4))
        b.add_blocks(p, {3: 5, 12: 7, 26: 1})
    _, routes, _ = _sink(b)
    handler = routes.get("/metrics")
    assert handler is not None
    promtool_check(handler(Request("GET", "/metrics", {}, {})).body.decode())


def test_stack_seconds_sum_uses_exact_nanoseconds() -> None:
    b = Builder()
    p = process(1, "n")
    for i, st in enumerate(many_stacks(40)):
        b.add(p, st, (i * 7919 % 1000 + 1) / 1e9 * 1_000_003)
    text = render(b, top=3)
    stack_ns = round(sum(v for _, v in samples(text, "offcpu_stack_seconds_total")) * SEC)
    proc_ns = round(sum(v for _, v in samples(text, "offcpu_seconds_total")) * SEC)
    assert abs(stack_ns - proc_ns) <= 1


def test_gzip_stream_continues_correctly_when_the_process_part_changes() -> None:
    main, tail = CollectorRegistry(), CollectorRegistry()
    ticks = [0]

    class Ticking:
        def collect(self):  # type: ignore[no-untyped-def]
            from prometheus_client.metrics_core import GaugeMetricFamily

            yield GaugeMetricFamily("tick", "changes every render", value=ticks[0])

    b = Builder()
    for st in many_stacks(30):
        b.add(process(1, "a"), st, 1.0)
    snap = b.snapshot()
    main.register(OffCPUCollector(lambda: snap, lambda: [], Selection(), bcc="x"))
    tail.register(Ticking())
    cache = ExpositionCache(main, tail, lambda: snap.sequence, process_max_age_s=0.0)
    for tick in range(3):
        ticks[0] = tick
        body, _, gz = cache.get("", True)
        plain, _, _ = cache.get("", False)
        assert gz and gzip.decompress(body).decode().endswith(f"tick {float(tick)}\n")
        assert gzip.decompress(body).replace(f"tick {float(tick)}".encode(), b"") == plain.replace(
            f"tick {float(tick)}".encode(), b""
        )
    assert cache.renders == 1


def test_threads_blocked_now_per_process_and_reason() -> None:
    from dataclasses import replace
    from types import MappingProxyType

    from offcpu_exporter.snapshot import Blocked

    b = Builder()
    b.add(process(1, "a"), stack("wait"), 1.0)
    snap = b.snapshot()
    key = next(iter(snap.processes))
    view = replace(snap.processes[key], blocked=MappingProxyType({Reason.UNINTERRUPTIBLE: Blocked(3, 95_500_000_000)}))
    snap = replace(snap, processes=MappingProxyType({key: view}))
    reg = CollectorRegistry()
    reg.register(OffCPUCollector(lambda: snap, lambda: [], Selection(), bcc="x"))
    text = generate_latest(reg).decode()
    assert by(text, "offcpu_blocked_threads", "reason") == {"runnable": 0, "sleeping": 0, "uninterruptible": 3,
                                                           "other": 0}
    assert by(text, "offcpu_blocked_longest_seconds", "reason")["uninterruptible"] == 95.5


def test_telemetry_path_is_node_exporters_flag() -> None:
    routes = Routes()
    snap = Builder().snapshot()
    ctx = SinkContext(latest=lambda: snap, flush_now=lambda t: snap, routes=routes)
    parser = argparse.ArgumentParser()
    prom_options.add_arguments(parser)
    assert parser.parse_args([]).web_telemetry_path == "/metrics"
    sink = prom_sink.create(parser.parse_args(["--web.telemetry-path", "/offcpu/metrics"]), ctx)
    ctx.sinks.append(sink)
    assert routes.get("/metrics") is None
    handler = routes.get("/offcpu/metrics")
    assert handler is not None
    assert b"offcpu_exporter_build_info" in handler(Request("GET", "/offcpu/metrics", {}, {})).body
    with pytest.raises(ValueError, match="must start with '/'"):
        prom_sink.create(parser.parse_args(["--web.telemetry-path", "metrics"]), SinkContext(
            latest=lambda: snap, flush_now=lambda t: snap, routes=Routes()))


def test_other_is_the_folded_processes_sum_as_processes_come_and_go() -> None:
    """pid="other" is read from the snapshot's sums less the processes shown on their own rather
    than summed over every process at every scrape: over random arrivals, exits and growth it still
    equals the sum of the processes never shown (each is shown for its whole life or never), exits
    never lower it, and the per-container histograms count every block of their processes."""
    rng = random.Random(28)
    b = Builder()
    sel = Selection(max_processes=4, group_histograms=True)
    live: list[ProcessInfo] = []
    totals: dict[ProcessKey, float] = {}
    blocks: dict[tuple[str, str, str], int] = defaultdict(int)
    ever_shown: set[int] = set()
    last_other = 0.0
    next_pid = 100
    for _ in range(60):
        for _ in range(rng.randrange(3)):
            pod = rng.choice(("", "web-0", "db-0"))
            info = process(next_pid, f"p{next_pid}", namespace="shop" if pod else "", pod=pod,
                           container="app" if pod else "")
            next_pid += 1
            live.append(info)
            totals[info.key] = 0.0
        for info in rng.sample(live, k=min(len(live), 3)):
            seconds, count = rng.randrange(1, 50) / 10, rng.randrange(1, 5)
            b.add(info, stack(rng.choice(("a", "b"))), seconds, count=count)
            b.add_blocks(info, {rng.randrange(27): count})
            totals[info.key] += seconds
            blocks[info.where] += count
        text = render(b, selection=sel)
        shown = {int(p) for p in by(text, "offcpu_seconds_total", "pid") if p != "other"}
        assert not (ever_shown - shown) & {i.pid for i in live}, "a live process left its own series"
        ever_shown |= shown
        other = by(text, "offcpu_seconds_total", "pid").get("other", 0.0)
        assert other == pytest.approx(sum(t for k, t in totals.items() if k.pid not in ever_shown))
        assert other >= last_other - 1e-9
        last_other = other
        for where in [w for w in blocks if not any(i.where == w for i in live)]:
            del blocks[where]  # none of its processes left: its series end, and start from 0 again
        counts = {lab["pod"]: v for lab, v in samples(text, "offcpu_block_duration_seconds_count")}
        assert counts == {w[1]: n for w, n in blocks.items()}
        # Exits right after a scrape, so that every increase was seen by one.
        for info in rng.sample(live, k=min(len(live), rng.randrange(2))):
            live.remove(info)
            b.remove(info.key)
    assert len(ever_shown) < next_pid - 100, "no process was folded"
