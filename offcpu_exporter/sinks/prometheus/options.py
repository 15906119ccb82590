"""Command-line options of the Prometheus output (`/metrics`, always on)."""

from __future__ import annotations

import argparse

from offcpu_exporter.config import positive_int
from offcpu_exporter.waitsite import CALL_PATH_FRAMES

__all__ = ["add_arguments", "enabled"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("Prometheus (/metrics)")
    g.add_argument(
        "--web.telemetry-path",
        dest="web_telemetry_path",
        default="/metrics",
        metavar="PATH",
        help="path under which the metrics are served (default %(default)s)",
    )
    g.add_argument(
        "--prometheus.top-stacks",
        dest="prometheus_top_stacks",
        type=int,
        default=10,
        metavar="K",
        help="stacks per process with their own series, by off-CPU time; the rest are summed "
        'in stack_id="other" (default %(default)s)',
    )
    g.add_argument(
        "--prometheus.max-processes",
        dest="prometheus_max_processes",
        type=int,
        default=200,
        metavar="N",
        help='processes with their own series; the rest are summed in pid="other" (0: no limit; default %(default)s)',
    )
    g.add_argument(
        "--prometheus.top-threads",
        dest="prometheus_top_threads",
        type=int,
        default=10,
        metavar="K",
        help="with --per-thread: threads per process with their own series, by off-CPU time; the rest are "
        'summed in tid="other" (default %(default)s)',
    )
    g.add_argument(
        "--prometheus.call-path-frames",
        dest="prometheus_call_path_frames",
        type=positive_int,
        default=CALL_PATH_FRAMES,
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


def enabled(options: argparse.Namespace) -> bool:
    return True
