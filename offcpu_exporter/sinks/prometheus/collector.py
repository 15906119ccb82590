"""The custom collector: fresh metric families built from the latest snapshot in every collect()."""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

import offcpu_exporter
from offcpu_exporter.sinks import Sink
from offcpu_exporter.sinks.prometheus.selection import FoldedProcesses, Selection, SelectionView, one_per_pid
from offcpu_exporter.snapshot import HISTOGRAM_BUCKETS_US, Counter, Health, Reason, Snapshot

__all__ = ["OffCPUCollector", "bcc_version"]

PROCESS_LABELS = ("pid", "comm", "reason", "namespace", "pod", "container")
HISTOGRAM_LABELS = ("pid", "comm", "namespace", "pod", "container")
STACK_LABELS = ("pid", "comm", "stack_id", "user_function", "kernel_function")
OTHER = "other"
ZERO = Counter()

# `le` of slot i is 2^i microseconds (offcpu_exporter/bpf/offcpu.h: slot i counts [2^(i-1), 2^i) us, slot 0 < 1 us);
# the last slot (from 2^25 us on) only reaches +Inf.
_LE = tuple(floatToGoString(us / 1e6) for us in HISTOGRAM_BUCKETS_US)
_SINK_STATS = ("sent", "dropped", "retried", "failed")
_Family = CounterMetricFamily | GaugeMetricFamily


def bcc_version() -> str:
    try:
        import bcc  # type: ignore[import-not-found]
    except Exception:  # not installed, or libbcc missing: offcpu_exporter_build_info still answers
        return "unknown"
    return str(getattr(bcc, "__version__", "unknown"))


def _text(value: str) -> str:
    # comm and symbol names come from the kernel and from ELF files: any bytes. Invalid UTF-8
    # (surrogate escapes) would make the exposition unencodable; prometheus_client escapes the rest.
    return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


class OffCPUCollector:
    def __init__(
        self,
        latest: Callable[[], Snapshot],
        sinks: Callable[[], Sequence[Sink]],
        selection: Selection,
        stack_label: bool = False,
        bcc: str | None = None,
    ) -> None:
        self._latest = latest
        self._sinks = sinks
        self._selection = selection
        self._stack_label = stack_label
        self._stack_labels = (*STACK_LABELS, "stack") if stack_label else STACK_LABELS
        self._build = {
            "version": offcpu_exporter.__version__,
            "python": platform.python_version(),
            "bcc": bcc if bcc is not None else bcc_version(),
        }

    # ---- families --------------------------------------------------------------------------------

    def _families(self) -> tuple[dict[str, _Family], HistogramMetricFamily]:
        c, g = CounterMetricFamily, GaugeMetricFamily
        s = self._stack_labels
        fams: list[_Family] = [
            c(
                "offcpu_seconds",
                "Time threads of the process spent off CPU, by reason.",
                labels=PROCESS_LABELS,
            ),
            c(
                "offcpu_switches",
                "Times threads of the process were switched out, by reason.",
                labels=PROCESS_LABELS,
            ),
            c(
                "offcpu_stack_seconds",
                'Off-CPU time per stack (top K per process, the rest in stack_id="other"), over threads and reasons.',
                labels=s,
            ),
            c(
                "offcpu_stack_switches",
                'Switch-outs per stack (top K per process, the rest in stack_id="other"), over threads and reasons.',
                labels=s,
            ),
            g("offcpu_exporter_probe_attached", "1 when the BPF probe is attached.", labels=("mode",)),
            c(
                "offcpu_exporter_lost_stacks",
                "Switches whose user or kernel stack could not be captured.",
                labels=("half", "reason"),
            ),
            g("offcpu_exporter_map_entries", "Entries in a BPF map now.", labels=("map",)),
            g("offcpu_exporter_map_capacity", "Maximum entries of a BPF map.", labels=("map",)),
            c(
                "offcpu_exporter_map_dropped",
                "Updates a BPF map refused because it was full.",
                labels=("map",),
            ),
            c("offcpu_exporter_dropped_seconds", "Off-CPU time measured but not stored (counter map full)."),
            c(
                "offcpu_exporter_spilled_stacks",
                "Stack captures that collided in the stack map and were kept in its spill map.",
            ),
            c("offcpu_exporter_symbolization_failures", "Frames that could not be symbolized."),
            g(
                "offcpu_exporter_last_flush_duration_seconds",
                "Duration of the flush that made the last snapshot.",
            ),
            c("offcpu_exporter_flushes", "Flushes (snapshots) since start."),
            g("offcpu_exporter_targets", "Processes watched now."),
            c("offcpu_exporter_sink_sent", "Items a sink delivered.", labels=("sink",)),
            c(
                "offcpu_exporter_sink_dropped",
                "Items a sink dropped (queue full, gave up).",
                labels=("sink",),
            ),
            c("offcpu_exporter_sink_retried", "Delivery attempts a sink retried.", labels=("sink",)),
            c("offcpu_exporter_sink_failed", "Delivery attempts of a sink that failed.", labels=("sink",)),
            c(
                "offcpu_exporter_cardinality_overflow",
                'Items folded into an "other" series by a cardinality '
                "limit (processes: --prometheus.max-processes, stacks: --prometheus.top-stacks).",
                labels=("what",),
            ),
        ]
        hist = HistogramMetricFamily(
            "offcpu_block_duration_seconds", "How long each off-CPU period lasted.", labels=HISTOGRAM_LABELS
        )
        return {f.name: f for f in fams}, hist

    @staticmethod
    def _info_families() -> dict[str, InfoMetricFamily]:
        # Info metrics (constant 1, descriptive labels): InfoMetricFamily names the samples `..._info`
        # (Prometheus' and OpenMetrics' convention), and OpenMetrics scrapes see the `info` type.
        fams = [
            InfoMetricFamily(
                "offcpu_exporter_probe_hooked_symbol",
                "Kernel symbols or tracepoints the probe is attached to, with the attach mode.",
                labels=("mode", "symbol"),
            ),
            InfoMetricFamily(
                "offcpu_exporter_build",
                "Versions of the exporter, Python and bcc.",
                labels=("version", "python", "bcc"),
            ),
        ]
        return {f.name: f for f in fams}

    def describe(self) -> Iterable[Metric]:
        fams, hist = self._families()
        return [*fams.values(), *self._info_families().values(), hist]

    def collect(self) -> Iterator[Metric]:
        snapshot = self._latest()
        view = self._selection.view(snapshot)
        fams, hist = self._families()
        infos = self._info_families()
        self._add_processes(fams, hist, view)
        self._add_health(fams, snapshot.health, view)
        self._add_sinks(fams, snapshot.health)
        mode = snapshot.health.attach_mode or "none"
        for symbol in snapshot.health.hooked_symbols:
            infos["offcpu_exporter_probe_hooked_symbol"].add_metric([mode, _text(symbol)], {})
        build = self._build
        infos["offcpu_exporter_build"].add_metric([build["version"], build["python"], build["bcc"]], {})
        return iter([*fams.values(), *infos.values(), hist])

    # ---- per process and stack ---------------------------------------------------------------------

    def _add_processes(self, fams: Mapping[str, _Family], hist: HistogramMetricFamily, view: SelectionView) -> None:
        seconds, switches = fams["offcpu_seconds"], fams["offcpu_switches"]
        st_seconds, st_switches = fams["offcpu_stack_seconds"], fams["offcpu_stack_switches"]
        for series in one_per_pid(view.processes):
            info = series.view.info
            pid, comm = str(info.pid), _text(info.comm)
            where = (_text(info.namespace), _text(info.pod), _text(info.container))
            for reason in Reason:
                counter = series.view.by_reason.get(reason, ZERO)
                labels = [pid, comm, reason.label, *where]
                seconds.add_metric(labels, counter.seconds)
                switches.add_metric(labels, counter.count)
            for stack_series in series.stacks:
                stack = stack_series.stack
                labels = [pid, comm, stack.stack_id, _text(stack.user_function), _text(stack.kernel_function)]
                if self._stack_label:
                    labels.append(_text(stack.folded()))
                st_seconds.add_metric(labels, stack_series.value.seconds)
                st_switches.add_metric(labels, stack_series.value.count)
            self._add_other_stack(st_seconds, st_switches, pid, comm, series.other)
            _add_histogram(hist, [pid, comm, *where], series.view.histogram, series.view.total)
        if view.folded is not None:
            self._add_folded(fams, hist, view.folded)

    def _add_other_stack(self, st_seconds: _Family, st_switches: _Family, pid: str, comm: str, other: Counter) -> None:
        labels = [pid, comm, OTHER, OTHER, OTHER]
        if self._stack_label:
            labels.append(OTHER)
        st_seconds.add_metric(labels, other.seconds)
        st_switches.add_metric(labels, other.count)

    def _add_folded(self, fams: Mapping[str, _Family], hist: HistogramMetricFamily, folded: FoldedProcesses) -> None:
        where = ("", "", "")
        for reason in Reason:
            counter = folded.by_reason.get(reason, ZERO)
            labels = [OTHER, OTHER, reason.label, *where]
            fams["offcpu_seconds"].add_metric(labels, counter.seconds)
            fams["offcpu_switches"].add_metric(labels, counter.count)
        self._add_other_stack(fams["offcpu_stack_seconds"], fams["offcpu_stack_switches"], OTHER, OTHER, folded.total)
        _add_histogram(hist, [OTHER, OTHER, *where], folded.histogram, folded.total)

    # ---- the exporter itself -------------------------------------------------------------------------

    def _add_health(self, fams: Mapping[str, _Family], h: Health, view: SelectionView) -> None:
        mode = h.attach_mode or "none"
        fams["offcpu_exporter_probe_attached"].add_metric([mode], 1 if h.probe_attached else 0)
        for key, n in sorted(h.lost_stacks.items()):
            fams["offcpu_exporter_lost_stacks"].add_metric(list(_lost_stack_labels(key)), n)
        for name, fam in (
            ("map_entries", "offcpu_exporter_map_entries"),
            ("map_capacity", "offcpu_exporter_map_capacity"),
            ("map_dropped", "offcpu_exporter_map_dropped"),
        ):
            for map_name, n in sorted(getattr(h, name).items()):
                fams[fam].add_metric([map_name], n)
        fams["offcpu_exporter_dropped_seconds"].add_metric([], h.dropped_ns / 1e9)
        fams["offcpu_exporter_spilled_stacks"].add_metric([], h.spilled_stacks)
        fams["offcpu_exporter_symbolization_failures"].add_metric([], h.symbolization_failures)
        fams["offcpu_exporter_last_flush_duration_seconds"].add_metric([], h.flush_duration_seconds)
        fams["offcpu_exporter_flushes"].add_metric([], h.flushes)
        fams["offcpu_exporter_targets"].add_metric([], h.targets)
        overflow = dict(h.cardinality_overflow)
        for what, n in view.overflow.items():
            overflow[what] = overflow.get(what, 0) + n
        for what, n in sorted(overflow.items()):
            fams["offcpu_exporter_cardinality_overflow"].add_metric([what], n)

    def _add_sinks(self, fams: Mapping[str, _Family], h: Health) -> None:
        rows: dict[str, dict[str, int]] = {}
        for sink in self._sinks():
            rows[sink.name] = dict(sink.stats.values())
        for name, n in h.sink_dropped.items():
            row = rows.setdefault(name, {})
            row["dropped"] = max(row.get("dropped", 0), n)
        for name in sorted(rows):
            for what in _SINK_STATS:
                fams[f"offcpu_exporter_sink_{what}"].add_metric([name], rows[name].get(what, 0))


def _add_histogram(fam: HistogramMetricFamily, labels: list[str], slots: Sequence[int], total: Counter) -> None:
    buckets: list[tuple[str, float]] = []
    running = 0
    for i, le in enumerate(_LE):
        running += slots[i] if i < len(slots) else 0
        buckets.append((le, running))
    running += sum(slots[len(_LE) :])
    buckets.append(("+Inf", running))
    # The sum is the process's off-CPU time: the histogram counts the same blocks (offcpu_exporter/bpf/offcpu.bpf.c,
    # account()), so _sum/_count is the mean block duration.
    fam.add_metric(labels, buckets, total.seconds)


def _lost_stack_labels(key: str) -> tuple[str, str]:
    """Health.lost_stacks keys are ``half:reason`` (``user:efault``); a bare key is a reason."""
    for sep in (":", "/"):
        half, found, reason = key.partition(sep)
        if found:
            return half, reason
    return "", key


