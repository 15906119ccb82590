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
from offcpu_exporter.series.selection import (
    FoldedProcesses,
    ProcessSeries,
    Selection,
    SelectionView,
    one_per_pid,
)
from offcpu_exporter.series.wait_site import CALL_PATH_FRAMES, wait_site
from offcpu_exporter.sinks import Sink
from offcpu_exporter.snapshot import HISTOGRAM_BUCKETS_US, SWITCH_REASONS, Counter, Health, Reason, Snapshot

__all__ = ["OffCPUCollector", "bcc_version"]

PROCESS_LABELS = ("pid", "comm", "reason", "namespace", "pod", "container")
THREAD_LABELS = ("tid", "thread")  # on the process counters with --per-thread
HISTOGRAM_LABELS = ("pid", "comm", "namespace", "pod", "container")  # --prometheus.histogram-by process
GROUP_HISTOGRAM_LABELS = ("namespace", "pod", "container")  # the default: per container
STACK_LABELS = (
    "pid",
    "comm",
    "namespace",
    "pod",
    "container",
    "stack_id",
    "app_function",
    "call_path",
    "user_function",
    "kernel_function",
)
OTHER = "other"
ZERO = Counter()

# `le` of slot i is 2^i microseconds (bpf/offcpu.h: slot i counts [2^(i-1), 2^i) us, slot 0 < 1 us);
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


# The exporter's own series, the same for every collector: (type, name, help, labels).
_SELF_FAMILIES: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("gauge", "offcpu_exporter_probe_attached",
     "1 when the BPF probe is attached.",
     ("mode",)),
    ("counter", "offcpu_exporter_lost_stacks",
     "Switches whose user or kernel stack could not be captured.",
     ("half", "reason")),
    ("gauge", "offcpu_exporter_map_entries",
     "Entries in a BPF map now.",
     ("map",)),
    ("gauge", "offcpu_exporter_map_capacity",
     "Maximum entries of a BPF map.",
     ("map",)),
    ("counter", "offcpu_exporter_map_dropped",
     "Updates a BPF map refused because it was full.",
     ("map",)),
    ("counter", "offcpu_exporter_dropped_seconds",
     "Off-CPU time measured but not stored (counter map full).",
     ()),
    ("counter", "offcpu_exporter_clamped_seconds",
     "Off-CPU time not credited because a thread would have had more than wall time (a bug: the log "
     "says which thread).",
     ()),
    ("counter", "offcpu_exporter_filtered_blocks",
     "Blocks left out by --min-block/--max-block.",
     ()),
    ("counter", "offcpu_exporter_filtered_seconds",
     "Off-CPU time of the blocks left out by --min-block/--max-block.",
     ()),
    ("counter", "offcpu_exporter_blocks",
     "Blocks (off-CPU periods) the probe counted.",
     ()),
    ("counter", "offcpu_exporter_missed_switch_ins",
     "Blocks ended by a switch-in the kernel did not report (counted up to when the thread was picked).",
     ()),
    ("counter", "offcpu_exporter_stack_captures",
     "Blocks whose stacks the probe captured.",
     ()),
    ("counter", "offcpu_exporter_seeded_stacks",
     "Blocks already going on when their thread became watched, by how their stacks were read from "
     "/proc: captured (complete), truncated (user stack stops short), placeholder (none).",
     ("result",)),
    ("gauge", "offcpu_exporter_stack_sampling_ratio",
     "Blocks whose stacks were captured / blocks, over the last flush interval (1 without sampling); "
     "per-stack figures are estimates scaled to the exact per-thread totals.",
     ()),
    ("counter", "offcpu_exporter_probe_cpu_seconds",
     "CPU time spent in the probe's BPF programs (0 while the kernel does not time them: "
     "kernel.bpf_stats_enabled).",
     ()),
    ("counter", "offcpu_exporter_probe_runs",
     "Runs of the probe's BPF programs (counted when timed, as above).",
     ()),
    ("counter", "offcpu_exporter_probe_skipped_runs",
     "Runs of the probe's BPF programs the kernel skipped (recursion_misses: a kprobe or perf-event tracepoint "
     "does not run on a CPU while a BPF system call there holds its guard): switches the probe did not see.",
     ()),
    ("counter", "offcpu_exporter_unwind_walks",
     "User stacks walked from DWARF CFI tables, by how the walk ended (root: complete).",
     ("end",)),
    ("counter", "offcpu_exporter_unwind_frames",
     "Frames of those walks, by how each was stepped (cfi, frame_pointer, unsupported_cfi, signal).",
     ("method",)),
    ("gauge", "offcpu_exporter_unwind_processes",
     "Processes with DWARF unwind tables now.",
     ()),
    ("counter", "offcpu_exporter_unwind_tables_no_space",
     "Unwind tables that did not fit in the BPF maps.",
     ()),
    ("counter", "offcpu_exporter_symbolization_failures",
     "Frames that could not be symbolized.",
     ()),
    ("gauge", "offcpu_exporter_last_flush_duration_seconds",
     "Duration of the flush that made the last snapshot.",
     ()),
    ("gauge", "offcpu_exporter_last_flush_timestamp_seconds",
     "Time (Unix seconds) up to which the current figures count: the counters are as of then.",
     ()),
    ("counter", "offcpu_exporter_flushes",
     "Flushes (snapshots) since start.",
     ()),
    ("gauge", "offcpu_exporter_targets",
     "Processes watched now.",
     ()),
    ("counter", "offcpu_exporter_sink_sent",
     "Items a sink delivered.",
     ("sink",)),
    ("counter", "offcpu_exporter_sink_dropped",
     "Items a sink dropped (queue full, gave up).",
     ("sink",)),
    ("counter", "offcpu_exporter_sink_retried",
     "Delivery attempts a sink retried.",
     ("sink",)),
    ("counter", "offcpu_exporter_sink_failed",
     "Delivery attempts of a sink that failed.",
     ("sink",)),
    ("counter", "offcpu_exporter_cardinality_overflow",
     'Items folded into an "other" series by a cardinality limit (processes: --prometheus.max-'
     "processes, stacks: --prometheus.top-stacks).",
     ("what",)),
)


class OffCPUCollector:
    def __init__(
        self,
        latest: Callable[[], Snapshot],
        sinks: Callable[[], Sequence[Sink]],
        selection: Selection,
        stack_label: bool = False,
        bcc: str | None = None,
        per_thread: bool = False,
        call_path_frames: int = CALL_PATH_FRAMES,
    ) -> None:
        self._latest = latest
        self._sinks = sinks
        self._selection = selection
        self._stack_label = stack_label
        self._stack_labels = (*STACK_LABELS, "stack") if stack_label else STACK_LABELS
        self._per_thread = per_thread
        self._process_labels = (*PROCESS_LABELS, *THREAD_LABELS) if per_thread else PROCESS_LABELS
        self._call_path_frames = call_path_frames
        # The selection accumulates per-container histograms only when asked: its choice decides the labels.
        self._histogram_labels = GROUP_HISTOGRAM_LABELS if selection.group_histograms else HISTOGRAM_LABELS
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
                labels=self._process_labels,
            ),
            c(
                "offcpu_switches",
                "Times threads of the process were switched out, by reason.",
                labels=self._process_labels,
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
            g(
                "offcpu_blocked_threads",
                "Threads of the process off CPU now (at the last flush), by reason.",
                labels=PROCESS_LABELS,
            ),
            g(
                "offcpu_blocked_longest_seconds",
                "How long the thread off CPU the longest has been so, by reason (0: none now).",
                labels=PROCESS_LABELS,
            ),
            *(
                (c if kind == "counter" else g)(name, doc, labels=labels)
                for kind, name, doc, labels in _SELF_FAMILIES
            ),
        ]
        hist = HistogramMetricFamily(
            "offcpu_block_duration_seconds", "How long each off-CPU period lasted.", labels=self._histogram_labels
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
        self._add_blocked(fams, view)
        self._add_health(fams, snapshot.health, view)
        if snapshot.sequence:
            fams["offcpu_exporter_last_flush_timestamp_seconds"].add_metric([], snapshot.time_ns / 1e9)
        self._add_sinks(fams, snapshot.health)
        mode = snapshot.health.attach_mode or "none"
        for symbol in snapshot.health.hooked_symbols:
            infos["offcpu_exporter_probe_hooked_symbol"].add_metric([mode, _text(symbol)], {})
        build = self._build
        infos["offcpu_exporter_build"].add_metric([build["version"], build["python"], build["bcc"]], {})
        return iter([*fams.values(), *infos.values(), hist])

    # ---- per process and stack ---------------------------------------------------------------------

    def _add_processes(self, fams: Mapping[str, _Family], hist: HistogramMetricFamily, view: SelectionView) -> None:
        st_seconds, st_switches = fams["offcpu_stack_seconds"], fams["offcpu_stack_switches"]
        for series in one_per_pid(view.processes):
            info = series.view.info
            pid, comm = str(info.pid), _text(info.comm)
            where = (_text(info.namespace), _text(info.pod), _text(info.container))
            self._add_process_counters(fams, series, pid, comm, where)
            for stack_series in series.stacks:
                stack = stack_series.stack
                site = wait_site(stack, self._call_path_frames)
                labels = [pid, comm, *where, stack.stack_id, _text(site.function), _text(site.call_path),
                          _text(stack.user_function), _text(stack.kernel_function)]
                if self._stack_label:
                    labels.append(_text(stack.folded()))
                st_seconds.add_metric(labels, stack_series.value.seconds)
                st_switches.add_metric(labels, stack_series.value.count)
            self._add_other_stack(st_seconds, st_switches, pid, comm, where, series.other)
            if not self._selection.group_histograms:
                _add_histogram(hist, [pid, comm, *where], series.view.histogram, series.view.total)
        if view.folded is not None:
            self._add_folded(fams, hist, view.folded)
        for group in view.groups:
            _add_histogram(hist, [_text(w) for w in group.where], group.histogram, group.total)

    def _add_blocked(self, fams: Mapping[str, _Family], view: SelectionView) -> None:
        threads, longest = fams["offcpu_blocked_threads"], fams["offcpu_blocked_longest_seconds"]
        for series in one_per_pid(view.processes):
            info = series.view.info
            where = (_text(info.namespace), _text(info.pod), _text(info.container))
            for reason in SWITCH_REASONS:
                labels = [str(info.pid), _text(info.comm), reason.label, *where]
                blocked = series.view.blocked.get(reason)
                threads.add_metric(labels, blocked.threads if blocked else 0)
                longest.add_metric(labels, blocked.longest_seconds if blocked else 0.0)

    def _add_process_counters(
        self, fams: Mapping[str, _Family], series: ProcessSeries, pid: str, comm: str, where: Sequence[str]
    ) -> None:
        """Per reason; with --per-thread per thread too: the top K threads and tid="other"."""
        rows: list[tuple[tuple[str, ...], Mapping[Reason, Counter]]]
        if self._per_thread:
            rows = [((str(t.thread.tid), _text(t.thread.name)), t.by_reason) for t in series.threads]
            rows.append(((OTHER, OTHER), series.other_threads))
        else:
            rows = [((), series.view.by_reason)]
        for thread, by_reason in rows:
            _add_reasons(fams, by_reason, [pid, comm], [*where, *thread])

    def _add_other_stack(
        self, st_seconds: _Family, st_switches: _Family, pid: str, comm: str, where: Sequence[str], other: Counter
    ) -> None:
        labels = [pid, comm, *where, OTHER, OTHER, OTHER, OTHER, OTHER]
        if self._stack_label:
            labels.append(OTHER)
        st_seconds.add_metric(labels, other.seconds)
        st_switches.add_metric(labels, other.count)

    def _add_folded(self, fams: Mapping[str, _Family], hist: HistogramMetricFamily, folded: FoldedProcesses) -> None:
        where = ("", "", "")
        thread = (OTHER, OTHER) if self._per_thread else ()
        _add_reasons(fams, folded.by_reason, [OTHER, OTHER], [*where, *thread])
        self._add_other_stack(
            fams["offcpu_stack_seconds"], fams["offcpu_stack_switches"], OTHER, OTHER, where, folded.total
        )
        if not self._selection.group_histograms:  # else the folded processes are in their containers' ones
            _add_histogram(hist, [OTHER, OTHER, *where], folded.histogram, folded.total)

    # ---- the exporter itself -------------------------------------------------------------------------

    def _add_health(self, fams: Mapping[str, _Family], h: Health, view: SelectionView) -> None:
        mode = h.attach_mode or "none"
        fams["offcpu_exporter_probe_attached"].add_metric([mode], 1 if h.probe_attached else 0)
        for (half, reason), n in sorted(h.lost_stacks.items()):
            fams["offcpu_exporter_lost_stacks"].add_metric([half, reason], n)
        for name, fam in (
            ("map_entries", "offcpu_exporter_map_entries"),
            ("map_capacity", "offcpu_exporter_map_capacity"),
            ("map_dropped", "offcpu_exporter_map_dropped"),
        ):
            for map_name, n in sorted(getattr(h, name).items()):
                fams[fam].add_metric([map_name], n)
        fams["offcpu_exporter_dropped_seconds"].add_metric([], h.dropped_ns / 1e9)
        fams["offcpu_exporter_clamped_seconds"].add_metric([], h.clamped_ns / 1e9)
        fams["offcpu_exporter_filtered_blocks"].add_metric([], h.filtered_blocks)
        fams["offcpu_exporter_filtered_seconds"].add_metric([], h.filtered_ns / 1e9)
        fams["offcpu_exporter_blocks"].add_metric([], h.blocks)
        fams["offcpu_exporter_missed_switch_ins"].add_metric([], h.missed_switch_ins)
        fams["offcpu_exporter_stack_captures"].add_metric([], h.stack_captures)
        for result, n in sorted(h.seeded_stacks.items()):
            fams["offcpu_exporter_seeded_stacks"].add_metric([result], n)
        fams["offcpu_exporter_stack_sampling_ratio"].add_metric([], h.stack_sampled_ratio)
        fams["offcpu_exporter_probe_cpu_seconds"].add_metric([], h.probe_run_ns / 1e9)
        fams["offcpu_exporter_probe_runs"].add_metric([], h.probe_runs)
        fams["offcpu_exporter_probe_skipped_runs"].add_metric([], h.probe_skipped_runs)
        for end, n in sorted(h.unwind_walks.items()):
            fams["offcpu_exporter_unwind_walks"].add_metric([end], n)
        for method, n in sorted(h.unwind_frames.items()):
            fams["offcpu_exporter_unwind_frames"].add_metric([method], n)
        fams["offcpu_exporter_unwind_processes"].add_metric([], h.unwind_processes)
        fams["offcpu_exporter_unwind_tables_no_space"].add_metric([], h.unwind_no_space)
        fams["offcpu_exporter_symbolization_failures"].add_metric([], h.symbolization_failures)
        fams["offcpu_exporter_last_flush_duration_seconds"].add_metric([], h.flush_duration_seconds)
        fams["offcpu_exporter_flushes"].add_metric([], h.flushes)
        fams["offcpu_exporter_targets"].add_metric([], h.targets)
        for what, n in sorted(view.overflow.items()):
            fams["offcpu_exporter_cardinality_overflow"].add_metric([what], n)

    def _add_sinks(self, fams: Mapping[str, _Family], h: Health) -> None:
        rows: dict[str, dict[str, int]] = {}
        for sink in self._sinks():
            rows[sink.name] = dict(sink.stats.values())
        for name in sorted(rows):
            for what in _SINK_STATS:
                fams[f"offcpu_exporter_sink_{what}"].add_metric([name], rows[name].get(what, 0))


def _add_reasons(fams: Mapping[str, _Family], by_reason: Mapping[Reason, Counter], before: Sequence[str],
                 after: Sequence[str]) -> None:
    """Seconds by every reason and switches by the reasons a switch has, zeros included: a series that
    exists from the start gives rate() a baseline when the reason first occurs."""
    for reason in Reason:
        counter = by_reason.get(reason, ZERO)
        labels = [*before, reason.label, *after]
        fams["offcpu_seconds"].add_metric(labels, counter.seconds)
        if reason in SWITCH_REASONS:
            fams["offcpu_switches"].add_metric(labels, counter.count)


def _add_histogram(fam: HistogramMetricFamily, labels: list[str], slots: Sequence[int], total: Counter) -> None:
    buckets: list[tuple[str, float]] = []
    running = 0
    for i, le in enumerate(_LE):
        running += slots[i] if i < len(slots) else 0
        buckets.append((le, running))
    running += sum(slots[len(_LE) :])
    buckets.append(("+Inf", running))
    # The sum is the off-CPU time of its processes: the histogram counts the same blocks
    # (bpf/offcpu.bpf.c, account()), so _sum/_count is the mean block duration.
    fam.add_metric(labels, buckets, total.seconds)


