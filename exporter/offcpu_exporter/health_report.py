"""The health a snapshot carries: the probe's run-time figures (drops, lost stacks, maps' fill, the
unwinder's walks) as of a flush, for /metrics' offcpu_exporter_* series and `doctor`."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import MappingProxyType

from offcpu_exporter.in_progress import InProgress
from offcpu_exporter.probe import layout
from offcpu_exporter.probe.maps import KernelMaps
from offcpu_exporter.ratelimit import RateLimitedLog
from offcpu_exporter.snapshot import Health, LostHalf
from offcpu_exporter.stack_names import Symbolizer
from offcpu_exporter.targets import ProcessTable
from offcpu_exporter.wall_bound import WallTimeBound

__all__ = ["HealthReport"]

log = logging.getLogger(__name__)


class HealthReport:
    def __init__(self, probe: KernelMaps, symbolizer: Symbolizer, processes: ProcessTable,
                 in_progress: InProgress, wall_bound: WallTimeBound) -> None:
        self.probe = probe
        self.symbolizer = symbolizer
        self.processes = processes
        self.in_progress = in_progress
        self.wall_bound = wall_bound
        self._stats_read: list[int] = [0] * layout.STAT_MAX
        self._sampled_ratio = 1.0
        self._skipped_read = 0
        self._warn = RateLimitedLog(log, interval=300.0)

    def health(self, duration: float, *, flushes: int, lost_stacks: Mapping[LostHalf, int],
               **sizes_known: int) -> Health:
        """`sizes_known`: map name -> entries, for the maps whose size the flush knows already."""
        stats = self.probe.stats()
        sizes = self.probe.map_sizes(**sizes_known)
        blocks = stats[layout.STAT_BLOCKS] - self._stats_read[layout.STAT_BLOCKS]
        captures = stats[layout.STAT_CAPTURES] - self._stats_read[layout.STAT_CAPTURES]
        if blocks > 0:
            self._sampled_ratio = min(1.0, captures / blocks)
        missed = stats[layout.STAT_MISSED_SWITCH_INS] - self._stats_read[layout.STAT_MISSED_SWITCH_INS]
        if missed > 0:
            self._warn.log(logging.WARNING, "%d blocks ended by a switch-in the kernel did not report: counted up "
                           "to when the thread was picked to run (offcpu_exporter_missed_switch_ins_total)", missed)
        self._stats_read = stats
        programs = self.probe.program_runs()
        if programs.skipped > self._skipped_read:
            self._warn.log(logging.WARNING, "%d runs of the probe skipped by the kernel (a BPF system call held the "
                           "CPU's guard): the switches they would have seen went unseen "
                           "(offcpu_exporter_probe_skipped_runs_total; the raw tracepoint, --attach tracepoint, "
                           "has no such guard)", programs.skipped - self._skipped_read)
        self._skipped_read = programs.skipped
        walks: dict[str, int] = {}
        frames: dict[str, int] = {}
        unwinder = self.probe.unwinder
        if unwinder is not None:
            for name, n in unwinder.maps_stats().items():
                if name.startswith("frames_"):
                    frames[name.removeprefix("frames_")] = n
                elif name != "walks_without_tables":
                    walks[name] = n
        return Health(
            unwind_walks=MappingProxyType(walks),
            unwind_frames=MappingProxyType(frames),
            unwind_processes=unwinder.processes if unwinder is not None else 0,
            unwind_no_space=unwinder.no_space if unwinder is not None else 0,
            seeded_stacks=MappingProxyType(dict(self.in_progress.seeded_stacks)),
            attach_mode=self.probe.mode,
            hooked_symbols=self.probe.hooked,
            probe_attached=self.probe.attached,
            lost_stacks=MappingProxyType(dict(lost_stacks)),
            map_entries=MappingProxyType({k: v[0] for k, v in sizes.items()}),
            map_capacity=MappingProxyType({k: v[1] for k, v in sizes.items()}),
            map_dropped=MappingProxyType({
                layout.MAP_COUNTS: stats[layout.STAT_COUNTS_DROPPED],
                layout.MAP_START: stats[layout.STAT_START_DROPPED],
                layout.MAP_HIST: stats[layout.STAT_HIST_DROPPED],
                layout.MAP_STACKS: stats[layout.STAT_STACKS_DROPPED],
                layout.MAP_PROC_EVENTS: stats[layout.STAT_PROC_EVENTS_DROPPED],
                # With wakers on: wake-ups not kept (their blocks counted without a waker).
                **({layout.MAP_WAKERS: stats[layout.STAT_WAKERS_DROPPED]} if self.probe.config.wakers else {}),
            }),
            dropped_ns=stats[layout.STAT_COUNTS_DROPPED_NS],
            clamped_ns=self.wall_bound.clamped_ns,
            filtered_blocks=stats[layout.STAT_FILTERED],
            filtered_ns=stats[layout.STAT_FILTERED_NS],
            blocks=stats[layout.STAT_BLOCKS],
            missed_switch_ins=stats[layout.STAT_MISSED_SWITCH_INS],
            stack_captures=stats[layout.STAT_CAPTURES],
            stack_sampling=self.probe.config.stack_sampling,
            stack_sampled_ratio=self._sampled_ratio,
            probe_run_ns=programs.ns,
            probe_runs=programs.runs,
            probe_skipped_runs=programs.skipped,
            symbolization_failures=self.symbolizer.failures,
            flush_duration_seconds=duration,
            flushes=flushes,
            targets=len(self.processes),
        )
