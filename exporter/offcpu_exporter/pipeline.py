"""The loop that owns the probe: keeps targets current, flushes on a timer or on request, and hands
each snapshot to every sink. Exactly one thread drains the kernel maps."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from offcpu_exporter import heap
from offcpu_exporter.aggregate import Aggregator
from offcpu_exporter.clock import ktime_ns
from offcpu_exporter.cycles import CyclePacer
from offcpu_exporter.history import History
from offcpu_exporter.probe import layout
from offcpu_exporter.probe.maps import KernelMaps
from offcpu_exporter.ratelimit import RateLimitedLog
from offcpu_exporter.sinks import Sink
from offcpu_exporter.snapshot import ProcessKey, Snapshot
from offcpu_exporter.targets import Exec, ProcessEvent, ProcessTable, Replaced
from offcpu_exporter.unwind.describer import Describer

__all__ = ["Pipeline", "next_flush_slot"]

log = logging.getLogger(__name__)


class Pipeline:
    def __init__(self, probe: KernelMaps, aggregator: Aggregator, processes: ProcessTable, *,
                 flush_interval: float = 5.0, targets_interval: float = 1.0, resync_interval: float = 60.0,
                 history_seconds: float = 900.0, exclude: Sequence[int] = (),
                 unwind_tables: str = "auto") -> None:
        self.probe = probe
        self.aggregator = aggregator
        self.processes = processes
        self.flush_interval = flush_interval
        self.targets_interval = targets_interval
        # Between two rescans of /proc, targets follow the kernel's process events alone.
        self.resync_interval = resync_interval
        self._next_resync = 0.0
        self._process_events_dropped = 0
        self.sinks: list[Sink] = []
        self._exclude = tuple(exclude)
        self._history = History(history_seconds)
        self._latest = Snapshot.empty()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._flushed = threading.Condition(self._lock)
        self._flush_requests = 0
        self._flushes_started = 0
        self._flushes_done = 0
        self._thread: threading.Thread | None = None
        self._sink_errors = RateLimitedLog(log, interval=60)
        self._prepared: dict[int, ProcessKey] = {}  # pid -> the process whose maps were read
        self._prepared_version = -1  # the process table's version _prepared follows
        self._seeded_all = False
        # Which processes get DWARF unwind tables (see describe()): "all" watched ones at once, or
        # "auto": selected targets at once, and with --all those whose stacks stop short.
        self.unwind_tables = unwind_tables
        self.describer: Describer | None = None
        self._final_until_ns: int | None = None
        self.cycles = CyclePacer()  # the loop's (run()): flushes called directly leave the collector alone

    # -- what sinks and handlers call (any thread) ----------------------------------------

    def latest(self) -> Snapshot:
        with self._lock:
            return self._latest

    def history(self, seconds: float) -> list[Snapshot]:
        return self._history.since(time.time_ns() - int(seconds * 1e9))

    def flush_now(self, timeout: float = 10.0) -> Snapshot:
        """Ask the loop for a flush and wait for its snapshot: one that *started* after this call,
        so it holds everything the kernel counted before it (a flush already under way may have
        read the maps earlier)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            wanted = self._flushes_started + 1
            self._flush_requests += 1
            self._wake.set()
            while self._flushes_done < wanted:
                left = deadline - time.monotonic()
                if left <= 0 or self._stop.is_set():
                    break
                self._flushed.wait(left)
            return self._latest

    # -- the loop --------------------------------------------------------------------------

    def sync_targets(self) -> None:
        """Make the kernel filter map match the process table."""
        self._start_describer()
        changed = self._changed_processes()
        exiting = [pid for pid, bits in changed.items() if bits & layout.PROC_EXIT] if changed is not None else ()
        added, _ = self.processes.refresh(changed=changed, exiting=exiting)
        if added:
            log.info("watching %d new process(es): %s", len(added),
                     ", ".join(f"{p.comm}[{p.pid}]" for p in added[:10]))
        for event in self.processes.take_events():
            self._apply(event)
        to_seed = self._sync_kernel_filter()
        if self.processes.version != self._prepared_version:
            self._prepare_changed()
        # Last: reading blocked threads' stacks (blocked_stacks.py) takes a while, and a short-lived
        # target's mappings must be read first. A seeded block counts from when its process was
        # put in the filter: a thread off CPU now that the probe has not seen leave the CPU since
        # then was off CPU all along.
        for pid, since_ns in to_seed:
            self.aggregator.in_progress.seed(pid, since_ns=since_ns)

    def _prepare_changed(self) -> None:
        """After the filter, so that the kernel counts while a big binary's symbols load: read each
        new target's mappings while it is alive, since it may exit before its first flush."""
        # Only the pids whose processes changed since the last pass (all of them the first time,
        # after an exec or a replacement, or when the table's log does not reach back that far):
        # a pass over every process at every change was O(node) once a second on a busy node.
        changed = self.processes.changed_since(self._prepared_version)
        self._prepared_version = self.processes.version
        watched = self.processes.watched_pids() if changed is None else \
            [pid for pid in changed if self.processes.watched(pid)]
        for pid in watched:
            current = self.processes.info(pid)
            prepared = self._prepared.get(pid)
            if current is None or prepared == current.key:
                continue
            self.aggregator.prepare(pid)
            self._prepared[pid] = current.key
            if self.describer is not None and (self.unwind_tables == "all" or not self.probe.config.watch_all):
                self.describer.want(pid)
        looked_at = self._prepared if changed is None else [pid for pid in changed if pid in self._prepared]
        for pid in [pid for pid in looked_at if self.processes.latest(pid) is None]:
            del self._prepared[pid]  # expired: the aggregator has dropped what named it
            if self.describer is not None:
                self.describer.forget(pid)

    def _changed_processes(self) -> dict[int, int] | None:
        """The processes the kernel reported changed since the last refresh (pid -> layout.PROC_*
        bits), or None for a rescan of /proc: the first time, every `resync_interval` (a write to
        another process's /proc/PID/comm is not reported), and after the kernel's event map was full."""
        events = self.probe.take_process_events()
        now = time.monotonic()
        dropped = self.probe.stats()[layout.STAT_PROC_EVENTS_DROPPED] if events is not None else 0
        if events is None or dropped != self._process_events_dropped or now >= self._next_resync:
            if dropped != self._process_events_dropped and self._next_resync:
                log.warning("the kernel's process event map was full (%d events lost): rescanning /proc",
                            dropped - self._process_events_dropped)
            self._process_events_dropped = dropped
            self._next_resync = now + self.resync_interval
            return None
        return events

    def _apply(self, event: ProcessEvent) -> None:
        """The one place that acts on what happened to a process (ProcessTable reports it)."""
        pid = event.info.pid if isinstance(event, Exec) else event.new.pid
        if isinstance(event, Replaced):
            # What the kernel counted under the pid so far is the old process's.
            self.aggregator.process_replaced(event.old)
        else:
            # Stacks counted in the moment between the exec and this scan may be named from the new
            # program's maps; from here on they all are.
            log.info("%s[%d] exec'd %s: reading its maps again", event.info.comm, pid, event.info.exe)
            self.aggregator.forget_program(pid)
        self._prepared.pop(pid, None)  # prepared again below, as the process it is now
        self._prepared_version = -1
        if self.describer is not None:
            self.describer.forget(pid)

    def _sync_kernel_filter(self) -> list[tuple[int, int]]:
        """Returns the processes whose threads off CPU now are to be seeded, with the moment
        (CLOCK_MONOTONIC) from which the probe sees their every switch-out."""
        kernel = self.probe.kernel_targets()
        to_seed: list[tuple[int, int]] = []
        if self.probe.config.watch_all:
            for pid in self._exclude:
                if kernel.get(pid) != layout.TARGET_EXCLUDE:
                    self.probe.set_target(pid, layout.TARGET_EXCLUDE)
            if not self._seeded_all:
                # Everything is watched from the attach on; threads off CPU since before are seeded.
                self._seeded_all = True
                since = getattr(self.probe, "attached_ktime_ns", 0) or ktime_ns()
                to_seed = [(pid, since) for pid in self.processes.watched_pids()]
            return to_seed
        wanted = self.processes.watched_pids()
        for pid in wanted - kernel.keys():
            log.debug("adding target %d to the kernel filter", pid)
            self.probe.set_target(pid, layout.TARGET_WATCH)
            to_seed.append((pid, ktime_ns()))  # after the filter: a switch-out from now on is the probe's own
        children = self.probe.children() if self.probe.config.follow_children else {}
        for pid in kernel.keys() - wanted:
            if pid in children:
                # Added by the kernel at fork: adopt it while it lives.
                parent, boot_ns, comm = children[pid]
                if not self.processes.adopt(pid, parent=parent, comm=comm, boot_ns=boot_ns).exited:
                    continue
            log.debug("removing target %d from the kernel filter", pid)
            self.probe.remove_target(pid)
        return to_seed

    def flush(self, *, final: bool = False) -> Snapshot:
        with self._lock:
            self._flushes_started += 1
            number = self._flushes_started
        snapshot = self.aggregator.flush(final=final, until_ns=self._final_until_ns if final else None)
        truncated = self.aggregator.take_truncated()
        if self.describer is not None and self.probe.config.watch_all and self.unwind_tables == "auto":
            # Every process is watched: tables only for those whose stacks need them.
            for pid in truncated:
                self.describer.want(pid)
        heap.trim_if_grown()  # what the flush allocated for a moment (map reads, new symbols) goes back
        self._history.add(snapshot)  # first: who waits for this flush reads the history next
        with self._lock:
            self._flushes_done = number
            self._latest = snapshot
            self._flushed.notify_all()
        for sink in self.sinks:
            try:
                sink.publish(snapshot)
            except Exception:
                # A broken sink must not stop the probe or the other sinks.
                sink.stats.add("failed")
                self._sink_errors.exception("sink %s failed to take a snapshot", sink.name)
        return snapshot

    def run(self) -> None:
        """Run until stop(): targets every targets_interval, a flush every flush_interval (on a fixed
        schedule: see next_flush_slot())."""
        next_flush = time.monotonic() + self.flush_interval
        next_targets = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_targets:
                try:
                    self.sync_targets()
                except Exception:
                    log.exception("refreshing targets failed")
                next_targets = now + self.targets_interval
            with self._lock:
                requested = self._flush_requests
                self._flush_requests = 0
            if requested or now >= next_flush:
                self.cycles.before_flush()
                try:
                    self.flush()
                except Exception:
                    log.exception("flush failed")
                self.cycles.after_flush()
                if now >= next_flush:  # a requested flush leaves the schedule as it is
                    next_flush = next_flush_slot(next_flush, time.monotonic(), self.flush_interval)
            self._wake.wait(max(0.0, min(next_flush, next_targets) - time.monotonic()))
            self._wake.clear()
        # Once more on the way out: nothing counted before the signal is left in the kernel, and
        # blocks still going on count up to this flush (or up to the end of the window asked for).
        try:
            self.sync_targets()
            self.flush(final=True)
        except Exception:
            log.exception("final flush failed")
        finally:
            self.cycles.close()

    def _start_describer(self) -> None:
        if self.probe.unwinder is not None and self.describer is None:
            self.describer = Describer(self.probe.unwinder)
            self.describer.start()

    def start(self) -> None:
        self._start_describer()
        with self._lock:
            if self._latest.sequence == 0:
                self._latest = self.aggregator.initial_snapshot()
        self._thread = threading.Thread(target=self.run, name="offcpu-pipeline", daemon=True)
        self._thread.start()

    def end_window_at(self, ktime_ns: int) -> None:
        """Count nothing after `ktime_ns` (CLOCK_MONOTONIC): the final flush covers up to there."""
        self.probe.set_cutoff(ktime_ns)
        self._final_until_ns = ktime_ns

    def stop(self, sink_timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            self._flushed.notify_all()
        if self.describer is not None:
            self.describer.stop()
        deadline = time.monotonic() + sink_timeout
        for sink in self.sinks:
            try:
                sink.close(max(0.1, deadline - time.monotonic()))
            except Exception:
                log.exception("closing sink %s failed", sink.name)


def next_flush_slot(slot: float, now: float, interval: float) -> float:
    """The first slot after `now` of the schedule slot + k * interval (k >= 1), for the flush due at
    `slot` that ended at `now` (time.monotonic()).

    The schedule is fixed, not `now + interval`: a scrape reads the counters of the newest flush, and
    Prometheus stamps them with the scrape's time, so the lag between a flush and the scrapes that
    read it must stay the same for rate() to be right. Counted from the end of each flush, the flushes
    drift by their own duration each time against a scraper's steady interval (0.5 s flushes of a few
    processes came every 0.51 s), until a scrape no longer finds the flush it found before and reads
    one a whole interval older: the scrapes around that moment are an interval further apart than the
    flushes they read, and a rate() over a window holding that jump is low by interval / window (by
    5.6% for 0.5 s flushes in a 10 s window, 11% for 5 s ones in a 1-minute window of 15 s scrapes),
    and high by the drift in a window without one. On a fixed schedule whose interval divides the
    scrape interval, every scrape reads a flush the same time before it (give or take how long a
    flush waits for the CPU). Slots missed by a flush longer than an interval are skipped, not made
    up with flushes in a row."""
    missed = max(0.0, (now - slot) // interval)
    return slot + (missed + 1) * interval
