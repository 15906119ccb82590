"""Command-line options of the pprof and flame graph endpoints (on unless --pprof.disable)."""

from __future__ import annotations

import argparse

from offcpu_exporter.config import Duration, positive_int, seconds

__all__ = ["add_arguments", "enabled"]

PROFILE_PATH = "/debug/pprof/offcpu"
FLAMEGRAPH_PATH = "/flamegraph"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "pprof and flame graphs",
        f"HTTP endpoints on the web server: {PROFILE_PATH}?seconds=N (gzip pprof), "
        f"{FLAMEGRAPH_PATH}?minutes=N (HTML). They cost nothing until requested.",
    )
    group.add_argument(
        "--pprof.disable",
        dest="pprof_disable",
        action="store_true",
        help="do not serve the pprof and flame graph endpoints",
    )
    group.add_argument(
        "--pprof.max-seconds",
        dest="pprof_max_seconds",
        type=seconds,
        default=300.0,
        metavar="DURATION",
        help="longest profile a request may ask for with ?seconds= (default: 5m)",
    )
    group.add_argument(
        "--pprof.max-concurrent",
        dest="pprof_max_concurrent",
        type=positive_int,
        default=4,
        metavar="N",
        help="profile requests served at once; more get 429 Too Many Requests (default: %(default)d)",
    )
    group.add_argument(
        "--flamegraph.max-minutes",
        dest="flamegraph_max_minutes",
        type=Duration("m"),
        default=60.0,
        metavar="DURATION",
        help="longest history /flamegraph may show with ?minutes= (default: 1h; bare numbers are minutes); "
        "it can show no more than the snapshot history the exporter keeps",
    )


def enabled(options: argparse.Namespace) -> bool:
    return not getattr(options, "pprof_disable", False)
