"""Command-line options of the pprof and flame graph endpoints (on unless --pprof.disable)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from offcpu_exporter.config import Duration, format_duration, positive_int, seconds

__all__ = ["DEFAULTS", "PprofOptions", "add_arguments", "enabled"]

PROFILE_PATH = "/debug/pprof/offcpu"
FLAMEGRAPH_PATH = "/flamegraph"


@dataclass(frozen=True, slots=True)
class PprofOptions:
    """The endpoints' limits; the defaults here are the flags' defaults."""

    max_seconds: float = 300.0  # longest ?seconds= a profile request may ask for
    max_concurrent: int = 4  # profile requests served at once
    max_minutes: float = 60.0  # longest ?minutes= of history /flamegraph may show

    @classmethod
    def from_args(cls, options: argparse.Namespace) -> PprofOptions:
        return cls(
            max_seconds=options.pprof_max_seconds,
            max_concurrent=options.pprof_max_concurrent,
            max_minutes=options.flamegraph_max_minutes,
        )


DEFAULTS = PprofOptions()


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
        default=DEFAULTS.max_seconds,
        metavar="DURATION",
        help=f"longest profile a request may ask for with ?seconds= (default: {format_duration(DEFAULTS.max_seconds)})",
    )
    group.add_argument(
        "--pprof.max-concurrent",
        dest="pprof_max_concurrent",
        type=positive_int,
        default=DEFAULTS.max_concurrent,
        metavar="N",
        help="profile requests served at once; more get 429 Too Many Requests (default: %(default)d)",
    )
    group.add_argument(
        "--flamegraph.max-minutes",
        dest="flamegraph_max_minutes",
        type=Duration("m"),
        default=DEFAULTS.max_minutes,
        metavar="DURATION",
        help="longest history /flamegraph may show with ?minutes= "
        f"(default: {format_duration(DEFAULTS.max_minutes, 'm')}; bare numbers are minutes); "
        "it can show no more than the snapshot history the exporter keeps",
    )


def enabled(options: argparse.Namespace) -> bool:
    return not getattr(options, "pprof_disable", False)
