"""Command-line options of the Prometheus output (`/metrics`, always on)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from offcpu_exporter.config import positive_int
from offcpu_exporter.series.selection import DEFAULT_LIMITS
from offcpu_exporter.series.wait_site import CALL_PATH_FRAMES

__all__ = ["DEFAULTS", "HISTOGRAM_BY", "PrometheusOptions", "add_arguments", "enabled"]

# What one offcpu_block_duration_seconds histogram covers. Per container by default: 29 series per
# process would be most of a node's series (docs/prometheus.md, Cardinality controls).
HISTOGRAM_BY = ("container", "process")


@dataclass(frozen=True, slots=True)
class PrometheusOptions:
    """The output's settings; the defaults here are the flags' defaults."""

    path: str = "/metrics"
    top_stacks: int = DEFAULT_LIMITS.top_stacks
    max_processes: int = DEFAULT_LIMITS.max_processes  # 0: no limit
    top_threads: int = DEFAULT_LIMITS.top_threads
    call_path_frames: int = CALL_PATH_FRAMES
    stack_label: bool = False
    per_thread: bool = False  # the core's --per-thread: per-thread series
    histogram_by: str = HISTOGRAM_BY[0]

    def __post_init__(self) -> None:
        if self.histogram_by not in HISTOGRAM_BY:
            raise ValueError(
                f"--prometheus.histogram-by must be one of {', '.join(HISTOGRAM_BY)}: {self.histogram_by!r}"
            )
        if not self.path.startswith("/"):
            raise ValueError(f"--web.telemetry-path must start with '/': {self.path!r}")
        if self.top_stacks < 0 or self.max_processes < 0 or self.top_threads < 0:
            raise ValueError(
                "--prometheus.top-stacks, --prometheus.top-threads and --prometheus.max-processes must not be negative"
            )

    @classmethod
    def from_args(cls, options: argparse.Namespace) -> PrometheusOptions:
        return cls(
            path=options.web_telemetry_path,
            top_stacks=options.prometheus_top_stacks,
            max_processes=options.prometheus_max_processes,
            top_threads=options.prometheus_top_threads,
            call_path_frames=options.prometheus_call_path_frames,
            stack_label=options.prometheus_stack_label,
            per_thread=getattr(options, "per_thread", False),
            histogram_by=options.prometheus_histogram_by,
        )


DEFAULTS = PrometheusOptions()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("Prometheus (/metrics)")
    g.add_argument(
        "--web.telemetry-path",
        dest="web_telemetry_path",
        default=DEFAULTS.path,
        metavar="PATH",
        help="path under which the metrics are served (default %(default)s)",
    )
    g.add_argument(
        "--prometheus.top-stacks",
        dest="prometheus_top_stacks",
        type=int,
        default=DEFAULTS.top_stacks,
        metavar="K",
        help="stacks per process with their own series, by off-CPU time; the rest are summed "
        'in stack_id="other" (default %(default)s)',
    )
    g.add_argument(
        "--prometheus.max-processes",
        dest="prometheus_max_processes",
        type=int,
        default=DEFAULTS.max_processes,
        metavar="N",
        help='processes with their own series; the rest are summed in pid="other" (0: no limit; default %(default)s)',
    )
    g.add_argument(
        "--prometheus.top-threads",
        dest="prometheus_top_threads",
        type=int,
        default=DEFAULTS.top_threads,
        metavar="K",
        help="with --per-thread: threads per process with their own series, by off-CPU time; the rest are "
        'summed in tid="other" (default %(default)s)',
    )
    g.add_argument(
        "--prometheus.call-path-frames",
        dest="prometheus_call_path_frames",
        type=positive_int,
        default=DEFAULTS.call_path_frames,
        metavar="N",
        help="frames in the call_path label of the per-stack series: the wait site and its callers "
        "(default %(default)s)",
    )
    g.add_argument(
        "--prometheus.stack-label",
        dest="prometheus_stack_label",
        action="store_true",
        help="add the whole folded stack as label `stack` to the per-stack series "
        "(long label values: mind Prometheus' memory)",
    )
    g.add_argument(
        "--prometheus.histogram-by",
        dest="prometheus_histogram_by",
        choices=HISTOGRAM_BY,
        default=DEFAULTS.histogram_by,
        help="one offcpu_block_duration_seconds histogram per container (namespace, pod, container; host "
        "processes share one) or per process (29 more series per process) (default %(default)s)",
    )


def enabled(options: argparse.Namespace) -> bool:
    return True
