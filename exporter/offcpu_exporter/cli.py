"""offcpu-exporter: parses flags, wires the stages, runs. No logic of its own beyond that."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from offcpu_exporter import __version__, heap, logfmt
from offcpu_exporter.config import (
    ConfigError,
    Duration,
    apply_config_file,
    config_path,
    parse_regex,
    positive_int,
    seconds,
)
from offcpu_exporter.core import CoreConfig
from offcpu_exporter.k8s import selection as k8s_selection
from offcpu_exporter.probe.loader import Probe, ProbeConfig
from offcpu_exporter.sinks import OUTPUTS, OutputOptions
from offcpu_exporter.snapshot import ProcessInfo
from offcpu_exporter.targets import TargetRules

if TYPE_CHECKING:
    from offcpu_exporter.k8s import PodMetadata
    from offcpu_exporter.pipeline import Pipeline

__all__ = ["main"]

log = logging.getLogger("offcpu_exporter")

# --min-block/--max-block: nanoseconds for the probe; bare numbers in microseconds, as they always were.
BLOCK_DURATION = Duration("ns", bare_unit="us", allow_zero=True)

EXAMPLES = """\
examples:
  offcpu-exporter serve --all                       every process; /metrics on :9961
  offcpu-exporter serve --comm '^(nginx|postgres)$' --flush-interval 10
  offcpu-exporter serve --config.file /etc/offcpu-exporter.yml
  offcpu-exporter record --pid 1234 --duration 30 --format folded -o out.folded
  offcpu-exporter record --comm myapp --duration 10 --format text
  offcpu-exporter record --pid 1234 --duration 60 --format html -o offcpu.html
  offcpu-exporter record --pid 1234 --duration 30 --format pprof -o offcpu.pb.gz
  offcpu-exporter doctor                            what this kernel supports

flags: the options of a component or output are named --component.option, as node_exporter's
(--web.listen-address, --log.level, --otlp.endpoint, --skywalking.endpoint); those of the exporter
itself have no prefix (--pid, --flush-interval). Booleans are turned off with --no-, e.g.
--no-otlp.metrics. Durations are written as Go writes them: 500ms, 10s, 1m30s, 2h. A config file
(--config.file) takes the same names without the dashes: `otlp.endpoint: http://collector:4317`.
"""


DEFAULT_UNWIND_CACHE = "/var/cache/offcpu-exporter/unwind"
_CORE = CoreConfig()  # the core's defaults, which the options show
_PROBE = _CORE.probe


class StartupError(Exception):
    """Bad input found while wiring: one line on stderr, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """One-line errors and exit status 2, as the rest of the start-up checks."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"offcpu-exporter: error: {message}\n")


def _add_targets(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("targets (which processes to watch)")
    g.add_argument("--pid", type=positive_int, action="append", default=[], metavar="PID",
                   help="a process id (repeatable)")
    g.add_argument("--comm", type=parse_regex, metavar="REGEX", help="processes whose name (comm) matches")
    g.add_argument("--cmdline", type=parse_regex, metavar="REGEX", help="processes whose command line matches")
    g.add_argument("--all", action="store_true", help="every process but the exporter itself and the idle task")
    g.add_argument("--follow-children", action="store_true",
                   help="also watch processes forked by watched ones, from their first instruction")
    g.add_argument("--targets-interval", type=seconds, default=_CORE.targets_interval, metavar="DURATION",
                   help="how often /proc is scanned for new and exited processes (default 1s)")


def _add_probe(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("probe")
    g.add_argument("--attach", choices=("auto", "kprobe", "tracepoint"),
                   default=os.environ.get("OFFCPU_ATTACH", "auto"),
                   help="kprobe on finish_task_switch, the sched:sched_switch tracepoint, or auto (default)")
    g.add_argument("--per-thread", action="store_true", help="keep threads apart instead of summing per process")
    g.add_argument("--min-block", type=BLOCK_DURATION, default=_PROBE.min_block_ns, metavar="DURATION",
                   help="ignore blocks shorter than this (e.g. 100us; bare numbers are microseconds)")
    g.add_argument("--max-block", type=BLOCK_DURATION, default=_PROBE.max_block_ns, metavar="DURATION",
                   help="ignore blocks longer than this (bare numbers are microseconds)")
    g.add_argument("--stack-storage-size", type=positive_int, default=_PROBE.stack_storage, metavar="N",
                   help="distinct stacks the kernel can hold (default %(default)s; ~1 KiB each)")
    g.add_argument("--stack-sampling", choices=("on", "off"), default="on",
                   help="on (default): capture the stacks of a bounded sample of blocks (--stack-budget); switch "
                        "counts and off-CPU time per process, thread and reason stay exact, per-stack figures are "
                        "estimates scaled to them. off: capture every block's stacks (full fidelity, full cost)")
    g.add_argument("--stack-budget", type=positive_int, default=_PROBE.stack_budget_thread, metavar="N",
                   help="stack captures per second per thread with sampling on (default %(default)s): threads that "
                        "block less often have every block captured")
    g.add_argument("--stack-budget-cpu", type=positive_int, default=_PROBE.stack_budget_cpu, metavar="N",
                   help="stack captures per second per CPU with sampling on (default %(default)s)")
    g.add_argument("--wakers", choices=("on", "off"), default="off",
                   help="on: also record who woke each block (a sched_waking hook; needs BTF): folded stacks in "
                        "bcc offwaketime's layout, blocked stack -- waker's stack; wake-ups from interrupt context "
                        "are marked [timer], [softirq] or [interrupt], not charged to the interrupted task. off "
                        "(default): no hook, today's cost")
    g.add_argument("--unwind-tables", choices=("auto", "all", "off"), default=_CORE.unwind_tables,
                   help="user stacks through code without frame pointers (most distributions' libraries) are "
                        "walked from DWARF CFI tables built for each process: auto (default) for the selected "
                        "targets at once and, with --all, for processes whose stacks stop short; all: every "
                        "watched process at once; off: frame pointers only")
    g.add_argument("--unwind-cache-dir", default=DEFAULT_UNWIND_CACHE, metavar="DIR",
                   help=f"where tables are kept by build id across restarts (default {DEFAULT_UNWIND_CACHE}; "
                        "'' keeps none)")
    g.add_argument("--bpf-stats", choices=("on", "off"), default="off",
                   help="have the kernel time BPF programs (BPF_ENABLE_STATS, while the exporter runs) for "
                        "offcpu_exporter_probe_cpu_seconds_total; off by default: it times every BPF program on the "
                        "machine, ~30 ns per run of each (also read when kernel.bpf_stats_enabled is set)")
    g.add_argument("--max-counters", type=positive_int, default=_PROBE.max_counts, metavar="N",
                   help="distinct (process, thread, stack, reason) counters in the kernel (default %(default)s)")
    g.add_argument("--max-threads", type=positive_int, default=_PROBE.max_threads, metavar="N",
                   help="threads that can be switched out at once (default %(default)s)")


def _add_aggregate(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("aggregation")
    g.add_argument("--flush-interval", type=seconds, default=_CORE.flush_interval, metavar="DURATION",
                   help="how often the kernel counters are read (default 5s, as SkyWalking Rover)")
    g.add_argument("--exited-grace", type=seconds, default=_CORE.aggregate.exited_grace_seconds, metavar="DURATION",
                   help="how long an exited process stays in the outputs (default 1m)")
    g.add_argument("--history", type=seconds, default=_CORE.history_seconds, metavar="DURATION",
                   help="history kept in memory for /flamegraph, 1-minute buckets past the last minute (default 15m)")


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config.file", dest="config", metavar="FILE",
                   help="YAML file of options (flag names without the leading dashes)")
    logfmt.add_arguments(p)


def build_parser(outputs: Sequence[OutputOptions] | None = None) -> argparse.ArgumentParser:
    """The parser; `outputs`: the options modules of the outputs `serve` offers (default: all of them)."""
    if outputs is None:
        outputs = [output.options for output in OUTPUTS]
    parser = _Parser(prog="offcpu-exporter", description="Where threads wait: off-CPU time per stack.",
                     epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"offcpu-exporter {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    serve = sub.add_parser("serve", help="run until SIGTERM, serving /metrics and pushing to the outputs",
                           epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    for add in (_add_common, _add_targets, k8s_selection.add_arguments, _add_probe, _add_aggregate):
        add(serve)
    serve.add_argument("--drop-privileges", action="store_true",
                       help="once the probe is attached, keep only the capabilities still needed "
                       "(see SECURITY.md) and set no_new_privs")
    from offcpu_exporter.web import options as web_options

    web_options.add_arguments(serve)
    for output in outputs:
        output.add_arguments(serve)

    record = sub.add_parser("record", help="profile for a while and write one profile file",
                            epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    for add in (_add_common, _add_targets, k8s_selection.add_arguments, _add_probe):
        add(record)
    record.add_argument("--duration", type=seconds, default=10.0, metavar="DURATION",
                        help="how long to record (default 10s)")
    from offcpu_exporter.formats import FORMATS

    record.add_argument("--format", choices=FORMATS, default="folded",
                        help="pprof (gzip, for go tool pprof), folded (flamegraph.pl), html (an interactive "
                        "flame graph in one self-contained file) or text (like bcc's offcputime); default folded")
    record.add_argument("-o", "--output", default="-", metavar="FILE", help="default: standard output")

    doctor = sub.add_parser("doctor", help="what this kernel supports, and what to do about what it lacks")
    logfmt.add_arguments(doctor, level="warning")
    doctor.add_argument("--attach", choices=("auto", "kprobe", "tracepoint"),
                        default=os.environ.get("OFFCPU_ATTACH", "auto"))
    doctor.add_argument("--load", action="store_true", help="also compile and attach the probe, then detach")
    doctor.add_argument("--pid", type=positive_int, action="append", default=[], metavar="PID",
                        help="also say what the user stacks of this process rely on, per executable mapping: "
                        "DWARF CFI tables or frame pointers, and why (repeatable)")

    for output in outputs:
        extra = getattr(output, "add_subcommands", None)
        if extra is not None:
            extra(sub)
    return parser


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = build_parser()
    path = config_path(argv)
    if path is not None:
        try:
            # The config file fills defaults of the subcommand it is given to.
            command = next((a for a in argv if not a.startswith("-")), None)
            sub = _subparser(parser, command)
            apply_config_file(sub, path)
        except ConfigError as e:
            parser.error(str(e))
    options = parser.parse_args(argv)
    if options.command == "serve":
        from offcpu_exporter.web.config_file import WebConfigError
        from offcpu_exporter.web.options import parse_listen_address

        try:
            parse_listen_address(options.web_listen_address)  # before the probe is loaded
        except WebConfigError as e:
            parser.error(str(e))
    if options.command in ("serve", "record"):
        if options.min_block > options.max_block:
            parser.error("--min-block is larger than --max-block")
        if options.all and (options.pid or options.comm or options.cmdline):
            parser.error("--all watches everything: do not combine it with --pid/--comm/--cmdline")
        if options.all and _extra_selectors(options):
            parser.error("--all watches everything: do not combine it with --namespace/--pod-label/--container")
        if options.command == "record" and not (options.all or _selects(options)):
            parser.error("say what to record: --pid, --comm, --cmdline or --all")
    return options


def _watches_all(options: argparse.Namespace) -> bool:
    """--all, or serve given no target: its default is every process (parse_args refuses record
    without one). The core config carries the result; the namespace stays as the user wrote it."""
    return bool(options.all or not _selects(options))


def _selects(options: argparse.Namespace) -> bool:
    return bool(options.pid or options.comm or options.cmdline or _extra_selectors(options))


def _extra_selectors(options: argparse.Namespace) -> bool:
    return bool(getattr(options, "namespace", None) or getattr(options, "pod_label", None)
                or getattr(options, "container", None))


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    return [sub for action in parser._actions if isinstance(action, argparse._SubParsersAction)
            for sub in action.choices.values()]


def _subparser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command]  # type: ignore[no-any-return]
    raise ConfigError("--config.file goes after a subcommand (serve or record)")


# -- wiring ---------------------------------------------------------------------------------


def core_config(options: argparse.Namespace,
                predicate: Callable[[ProcessInfo], bool] | None = None,
                flush_interval: float | None = None) -> CoreConfig:
    """The core's configuration from `serve`'s or `record`'s options (`predicate`: the Kubernetes
    selection; `flush_interval`: record's, which has no flag for it)."""
    watch_all = _watches_all(options)
    probe = ProbeConfig(
        attach=options.attach,
        per_thread=options.per_thread,
        watch_all=watch_all,
        follow_children=options.follow_children,
        min_block_ns=options.min_block,
        max_block_ns=options.max_block,
        max_counts=options.max_counters,
        max_threads=options.max_threads,
        stack_storage=options.stack_storage_size,
        stack_sampling=options.stack_sampling == "on",
        stack_budget_thread=options.stack_budget,
        stack_budget_cpu=options.stack_budget_cpu,
        run_time_stats=options.bpf_stats == "on",
        unwind=options.unwind_tables != "off",
        unwind_cache_dir=options.unwind_cache_dir or None,
        wakers=options.wakers == "on",
    )
    rules = TargetRules(pids=tuple(options.pid), comm=options.comm, cmdline=options.cmdline,
                        watch_all=watch_all, follow_children=options.follow_children, predicate=predicate)
    return CoreConfig(
        probe=probe, rules=rules,
        aggregate=replace(_CORE.aggregate, exited_grace_seconds=getattr(options, "exited_grace",
                                                                        _CORE.aggregate.exited_grace_seconds)),
        flush_interval=(flush_interval if flush_interval is not None
                        else getattr(options, "flush_interval", _CORE.flush_interval)),
        targets_interval=options.targets_interval,
        history_seconds=getattr(options, "history", _CORE.history_seconds),
        unwind_tables=options.unwind_tables,
    )


def build_pipeline(options: argparse.Namespace,
                   flush_interval: float | None = None) -> tuple[Probe, Pipeline, PodMetadata]:
    """The probe, the pipeline and the pod metadata, none of them started: no thread runs yet (see
    privileges.py). `flush_interval` overrides the flag's (see `core_config`)."""
    from offcpu_exporter.core import build_core

    metadata, enrich, predicate = _kubernetes(options)
    config = core_config(options, predicate, flush_interval)
    core = build_core(config, enrich=enrich)
    rules = config.rules
    if core.problems and len(core.problems) == len(rules.pids) and not (rules.scans or rules.watch_all):
        raise StartupError("; ".join(core.problems))
    for problem in core.problems:
        log.error("%s; watching the other targets", problem)
    assert isinstance(core.probe, Probe)  # build_core makes one when given none
    return core.probe, core.pipeline, metadata


def _kubernetes(options: argparse.Namespace):  # type: ignore[no-untyped-def]
    """Pod metadata (listed once, its watch not started yet) and the --namespace/--pod-label/--container
    predicate."""
    from offcpu_exporter.k8s import PodMetadata, WorkloadSelector
    from offcpu_exporter.targets import kubernetes_enricher, kubernetes_predicate

    if options.kubernetes_metadata == "off":
        metadata = PodMetadata.disabled()
    else:
        metadata = PodMetadata.from_environment(service_account_dir=options.kubernetes_service_account_dir,
                                                watch_seconds=options.kubernetes_refresh_interval)
    selector = WorkloadSelector.from_args(options, metadata)
    if selector.needs_api and not metadata.enabled:
        raise StartupError("--namespace, --pod-label and --container NAME need the Kubernetes API (a pod with "
                           "a service account; see the log); --container also takes a container id")
    # The first list, on this thread, so that the processes found at start get their names (bounded:
    # the API may be down; the watch started later lists again until it succeeds).
    metadata.refresh()
    return metadata, kubernetes_enricher(metadata), kubernetes_predicate(selector)


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()

    def handler(signum: int, _frame: object) -> None:
        log.info("received %s, flushing and stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop


def cmd_serve(options: argparse.Namespace) -> int:
    from offcpu_exporter.probe.loader import ProbeError
    from offcpu_exporter.sinks import SinkContext
    from offcpu_exporter.sinks.prometheus.sink import PrometheusSink
    from offcpu_exporter.web import Routes
    from offcpu_exporter.web.metrics import WebCollector
    from offcpu_exporter.web.options import WebOptions
    from offcpu_exporter.web.server import WebServer

    stop = _stop_on_signals()
    probe, pipeline, metadata = build_pipeline(options)
    try:
        probe.start()
    except ProbeError as e:
        log.error("%s", e)
        return 1
    if options.drop_privileges:
        # Before any other thread starts: capset(2) changes only the calling thread.
        error = _drop_privileges(options)
        if error:
            log.error("%s", error)
            probe.close()
            return 1
    metadata.start()
    routes = Routes()
    context = SinkContext(latest=pipeline.latest, flush_now=pipeline.flush_now, routes=routes,
                          history=pipeline.history)
    try:
        for output in OUTPUTS:
            sink = output.create(options, context)
            if sink is not None:
                context.sinks.append(sink)
    except (ValueError, OSError) as e:
        log.error("%s", e)
        probe.close()
        return 2
    pipeline.sinks = context.sinks
    try:
        server = WebServer(routes, WebOptions.from_args(options), ready=lambda: probe.attached)
        server.start()
    except (OSError, ValueError) as e:
        log.error("cannot serve HTTP: %s", e)
        probe.close()
        return 2
    for sink in context.sinks:
        if isinstance(sink, PrometheusSink):
            sink.process_registry.register(WebCollector(server.counters))
    pipeline.start()
    log.info("offcpu-exporter %s serving; targets: %s", __version__, pipeline.processes.rules.describe())
    stop.wait()
    pipeline.stop()
    server.stop()
    metadata.close()
    probe.close()
    return 0


def _drop_privileges(options: argparse.Namespace) -> str | None:
    from offcpu_exporter.privileges import PrivilegeError, drop_capabilities, kept_after_attach
    from offcpu_exporter.web.config_file import WebConfigError
    from offcpu_exporter.web.options import parse_listen_address

    try:
        _, port = parse_listen_address(options.web_listen_address)
    except WebConfigError:
        port = None
    kept = kept_after_attach(port)
    for k in kept:
        log.debug("keeping %s: %s", k.name, k.why)
    try:
        drop_capabilities(k.capability for k in kept)
    except PrivilegeError as e:
        return f"--drop-privileges: {e}"
    return None


def cmd_record(options: argparse.Namespace) -> int:
    from offcpu_exporter import record

    settings = record.RecordOptions.from_args(options)
    # Fail before recording, not after, when the output cannot be written.
    try:
        output = sys.stdout.buffer if settings.output == "-" else open(settings.output, "wb")  # noqa: SIM115
    except OSError as e:
        raise StartupError(f"cannot write {settings.output}: {e.strerror}") from None
    try:
        stop = _stop_on_signals()
        probe, pipeline, metadata = build_pipeline(options, flush_interval=settings.flush_interval)
        return record.run(settings, probe, pipeline, metadata, stop, output)
    finally:
        if output is not sys.stdout.buffer:
            output.close()


def cmd_doctor(options: argparse.Namespace) -> int:
    from offcpu_exporter.doctor import run_doctor

    return run_doctor(attach=options.attach, load=options.load, pids=options.pid)


def main(argv: Sequence[str] | None = None) -> int:
    heap.limit_arenas()  # before any thread: see offcpu_exporter/heap.py
    args = list(sys.argv[1:] if argv is None else argv)
    options = parse_args(args)
    logfmt.configure_logging(options.log_level, options.log_format)
    commands = {"serve": cmd_serve, "record": cmd_record, "doctor": cmd_doctor}
    handler = commands.get(options.command) or getattr(options, "handler", None)
    if handler is None:
        return 2
    try:
        return int(handler(options) or 0)
    except StartupError as e:
        sys.stderr.write(f"offcpu-exporter: error: {e}\n")
        return 2
