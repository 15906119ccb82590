"""The real probe and pipeline in the test process: one compile per use, no HTTP."""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterable, Iterator
from typing import Any

from offcpu_exporter.aggregate import AggregateConfig
from offcpu_exporter.core import CoreConfig, build_core
from offcpu_exporter.pipeline import Pipeline
from offcpu_exporter.probe.loader import Probe, ProbeConfig
from offcpu_exporter.snapshot import Counter, Snapshot, StackSample
from offcpu_exporter.targets import TargetRules
from testkit.workloads import WORKLOAD_COMM, Workload, WorkloadResult

ATTACH = os.environ.get("OFFCPU_ATTACH", "auto")
# A test's first flush loads kallsyms and the workload's symbols in pure Python: well under a
# second here, but 10-20 s under the kernel matrix's emulation, past flush_now()'s default.
FLUSH_TIMEOUT = 120.0


@contextlib.contextmanager
def running_pipeline(*, pids: tuple[int, ...] = (), comm: str | None = None, per_thread: bool = True,
                     follow_children: bool = False, flush_interval: float = 0.5, watch_all: bool = False,
                     probe_config: ProbeConfig | None = None,
                     aggregate: AggregateConfig | None = None, probe: Probe | None = None,
                     sinks: list[Any] | None = None) -> Iterator[Pipeline]:
    """A pipeline on a new probe, or on `probe` (a started one shared by several tests, which saves
    the compile: ~0.5 s here, ~25 s under the kernel matrix's emulation), with `sinks` from its first
    flush on. A shared probe still holds earlier tests' counters: they show up as exited processes,
    which tests select away by pid.
    Built by the same factory as the CLI's (offcpu_exporter.core)."""
    config = probe_config or (probe.config if probe is not None else
                              ProbeConfig(attach=ATTACH, per_thread=per_thread, follow_children=follow_children,
                                          watch_all=watch_all))
    rules = TargetRules(pids=pids, comm=re.compile(comm) if comm else None, watch_all=config.watch_all,
                        follow_children=config.follow_children)
    core = build_core(CoreConfig(probe=config, rules=rules, aggregate=aggregate or AggregateConfig(),
                                 flush_interval=flush_interval, targets_interval=0.2), probe=probe)
    own_probe = probe is None
    if own_probe:
        core.probe.start()
    pipeline = core.pipeline
    if sinks is not None:
        pipeline.sinks = sinks  # before the first flush
    pipeline.sync_targets()
    pipeline.start()
    try:
        yield pipeline
    finally:
        pipeline.stop()
        if own_probe:
            core.probe.close()


def observe(workload: Workload, **pipeline_options: Any) -> tuple[WorkloadResult, Snapshot]:
    """Watch a started workload (`--wait-go`) with a pipeline from go to its end; returns its
    result and a snapshot flushed after it ended (0.1 s later, so its last switch-ins are in)."""
    with running_pipeline(pids=(workload.pid,), **pipeline_options) as pipeline:
        workload.go()
        result = workload.wait()
        time.sleep(0.1)
        return result, pipeline.flush_now(FLUSH_TIMEOUT)

def with_function(snapshot: Snapshot, function: str, pid: int | None = None) -> list[StackSample]:
    """Samples whose stack holds `function` among its user frames."""
    return [s for s in snapshot.samples
            if (pid is None or s.process.pid == pid) and any(f.name == function for f in s.stack.user)]


def total(samples: list[StackSample]) -> Counter:
    out = Counter()
    for s in samples:
        out = out + s.total
    return out


def kernel_names(samples: Iterable[StackSample]) -> set[str]:
    """The kernel functions of these samples' stacks."""
    return {f.name.split(" ", 1)[0] for s in samples for f in s.stack.kernel}


def in_window(snap: Snapshot, tid: int) -> list[StackSample]:
    """The thread's samples inside its measured window: the workload marks the window's edges with
    offcpu_window_mark (an interval is charged when it ends) in its own code; the thread's start (a
    preemption in schedule_tail before any of its code runs) and exit (libc's, then do_exit) come
    before and after."""
    return [s for s in snap.samples if s.tid == tid and _in_window_code(s)]


def _in_window_code(sample: StackSample) -> bool:
    user = sample.stack.user
    kernel = kernel_names([sample])
    if any(f.name == "offcpu_window_mark" for f in user) or "do_exit" in kernel or "ret_from_fork" in kernel:
        return False
    # ret_from_fork: a new thread preempted before its first return to user space. The thread's
    # start and exit paths otherwise have user frames, none of them the workload's own. A
    # frame-pointer walk can miss thread_main (the thread preempted in a callee's first
    # instructions) but not every workload frame. Rows without a file-backed user frame (time
    # stolen from a running thread, a user stack not read) stay in: nothing places them outside.
    mapped = [f for f in user if f.module]
    return not mapped or any(f.module_basename == WORKLOAD_COMM for f in mapped)
