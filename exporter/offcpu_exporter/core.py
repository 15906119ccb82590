"""The core, built in one place: probe, process table, aggregator, pipeline.

The CLI (`serve`, `record`), the in-process tests and the benchmarks all build it here from one
frozen `CoreConfig`, whose defaults are the only statement of the core's defaults (the CLI's options
read theirs from it).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from offcpu_exporter.aggregate import AggregateConfig, Aggregator
from offcpu_exporter.pipeline import Pipeline
from offcpu_exporter.probe.loader import Probe, ProbeConfig
from offcpu_exporter.probe.maps import KernelMaps
from offcpu_exporter.snapshot import ProcessInfo
from offcpu_exporter.stack_names import Symbolizer as SymbolizerProtocol
from offcpu_exporter.symbols import Symbolizer
from offcpu_exporter.targets import ProcessTable, TargetRules

__all__ = ["Core", "CoreConfig", "build_core"]


@dataclass(frozen=True)
class CoreConfig:
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    rules: TargetRules = field(default_factory=TargetRules)
    aggregate: AggregateConfig = field(default_factory=AggregateConfig)
    flush_interval: float = 5.0  # seconds between flushes (SkyWalking Rover's)
    targets_interval: float = 1.0  # seconds between /proc scans
    history_seconds: float = 900.0  # snapshots kept in memory (/flamegraph)
    unwind_tables: str = "auto"  # which processes get DWARF unwind tables: auto, all, off


@dataclass
class Core:
    probe: KernelMaps
    processes: ProcessTable
    aggregator: Aggregator
    pipeline: Pipeline
    problems: list[str]  # targets that could not be resolved (--pid of no process)


def build_core(config: CoreConfig, *, probe: KernelMaps | None = None,
               symbolizer: SymbolizerProtocol | None = None,
               enrich: Callable[[ProcessInfo], ProcessInfo] | None = None, proc_root: str = "/proc") -> Core:
    """The core, not started: `probe` (default: a Probe of config.probe, to be started by the caller)
    and `symbolizer` may be given (a probe shared by several tests, an in-memory one)."""
    own = os.getpid()
    kernel: KernelMaps = probe if probe is not None else Probe(config.probe)
    processes = ProcessTable(config.rules, proc_root=proc_root, exclude=(own,), enrich=enrich)
    problems = processes.start()
    aggregator = Aggregator(kernel, symbolizer or Symbolizer(), processes, config.aggregate, proc_root=proc_root)
    pipeline = Pipeline(kernel, aggregator, processes, flush_interval=config.flush_interval,
                        targets_interval=config.targets_interval, history_seconds=config.history_seconds,
                        exclude=(own,), unwind_tables=config.unwind_tables)
    return Core(kernel, processes, aggregator, pipeline, problems)
