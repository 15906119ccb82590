"""Agent mode: the exporter acts as a SkyWalking Rover for the processes it watches.

A background thread reports new watched processes (`EBPFProcessService/reportProcesses`, host
process metadata with ``support_ebpf_profiling=true``, without which the OAP offers no task),
keeps them alive, and polls `EBPFProfilingService/queryTasks` with the newest `TaskUpdateTime`
seen. `OFF_CPU` tasks for one of our processes open a window [TaskStartTime, +FixedTriggerDuration s);
`assignments` tells the sink which processes of a snapshot to send under which task.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from offcpu_exporter.formats.proto.skywalking.common import Common_pb2
from offcpu_exporter.formats.proto.skywalking.ebpf.profiling import Process_pb2
from offcpu_exporter.formats.skywalking import TaskMetadata
from offcpu_exporter.ratelimit import RateLimitedLog
from offcpu_exporter.sinks.skywalking.client import OapClient
from offcpu_exporter.sinks.skywalking.delivery import describe_error
from offcpu_exporter.sinks.skywalking.options import POLL_INTERVAL
from offcpu_exporter.snapshot import ProcessInfo, ProcessKey, Snapshot

__all__ = ["Agent", "AgentOptions", "ProfilingTask", "parse_tasks", "snapshot_in_window"]

log = logging.getLogger(__name__)

TASK_COMMAND = "EBPFProfilingTaskQuery"
LAYER = "OS_LINUX"


@dataclass(frozen=True)
class AgentOptions:
    agent_id: str
    service_name: str = "{exe}"  # str.format fields: comm, exe, pid, hostname
    instance_name: str = "{hostname}"
    process_name: str = "{comm}-{pid}"
    labels: tuple[str, ...] = ()
    report_cmdline: bool = False
    poll_interval: float = POLL_INTERVAL


@dataclass(frozen=True)
class ProfilingTask:
    task_id: str
    process_ids: frozenset[str]
    target_type: str
    trigger_type: str
    start_ms: int
    duration_s: int
    update_ms: int

    @property
    def end_ms(self) -> int:
        return self.start_ms + self.duration_s * 1000


def _int_arg(args: Mapping[str, str], name: str) -> int:
    try:
        return int(args.get(name, "0") or "0")
    except ValueError:
        return 0


def parse_tasks(commands: Common_pb2.Commands) -> list[ProfilingTask]:
    tasks = []
    for command in commands.commands:
        if command.command != TASK_COMMAND:
            continue
        args = {pair.key: pair.value for pair in command.args}
        tasks.append(
            ProfilingTask(
                task_id=args.get("TaskId", ""),
                process_ids=frozenset(p.strip() for p in args.get("ProcessId", "").split(",") if p.strip()),
                target_type=args.get("TargetType", ""),
                trigger_type=args.get("TriggerType", ""),
                start_ms=_int_arg(args, "TaskStartTime"),
                duration_s=_int_arg(args, "FixedTriggerDuration"),
                update_ms=_int_arg(args, "TaskUpdateTime"),
            )
        )
    return tasks


def snapshot_in_window(snapshot: Snapshot, start_ms: int, end_ms: int) -> bool:
    """Whether a snapshot's increases belong to the task window [start_ms, end_ms).

    A snapshot covers [interval_start, time]; it belongs to the window when at least half of it lies
    inside, or when the whole window lies inside it (tasks shorter than a flush). Summed over the
    flushes this matches the window's length within one flush interval, without counting any
    stretch twice."""
    lo, hi = snapshot.interval_start_ns // 1_000_000, snapshot.time_ns // 1_000_000
    overlap = min(hi, end_ms) - max(lo, start_ms)
    if overlap <= 0:
        return False
    return 2 * overlap >= hi - lo or overlap >= end_ms - start_ms


@dataclass
class _Reported:
    info: ProcessInfo
    entity: Process_pb2.EBPFProcessEntityMetadata
    properties: list[Common_pb2.KeyStringValuePair]
    process_id: str = ""  # assigned by the OAP; "" until the report succeeded


@dataclass
class _State:
    watched: dict[ProcessKey, ProcessInfo] = field(default_factory=dict)
    reported: dict[ProcessKey, _Reported] = field(default_factory=dict)
    tasks: dict[str, ProfilingTask] = field(default_factory=dict)
    latest_update_ms: int = 0


class Agent:
    def __init__(
        self,
        client: OapClient,
        options: AgentOptions,
        clock_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
        hostname: str | None = None,
    ) -> None:
        self._client = client
        self._options = options
        self._clock_ms = clock_ms
        self._hostname = hostname or socket.gethostname()
        self._lock = threading.Lock()
        self._state = _State()
        self._ignored: set[str] = set()
        self._warn = RateLimitedLog(log)
        self._stop = threading.Event()
        self._poke = threading.Event()
        self._cycles = 0
        self._cycle_done = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="skywalking-agent", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout: float) -> None:
        self._stop.set()
        self._poke.set()
        self._thread.join(timeout)

    # -- pipeline side -------------------------------------------------------------------------

    def observe(self, snapshot: Snapshot) -> None:
        """Records the snapshot's processes (cheap; no I/O). Live ones are reported and kept alive;
        an exited one keeps its OAP id while snapshots still carry it, so that the data counted
        up to its exit is still sent under its task."""
        present = {key: view.info for key, view in snapshot.processes.items()}
        with self._lock:
            new = {k for k, info in present.items() if not info.exited} - self._state.watched.keys()
            self._state.watched = present
        if new:
            self._poke.set()  # report newcomers now rather than at the next poll

    def assignments(self, snapshot: Snapshot) -> list[tuple[ProcessKey, TaskMetadata]]:
        """(process, task metadata) for every OFF_CPU task window the snapshot belongs to."""
        with self._lock:
            by_id = {r.process_id: key for key, r in self._state.reported.items() if r.process_id}
            tasks = list(self._state.tasks.values())
        result = []
        for task in tasks:
            if not snapshot_in_window(snapshot, task.start_ms, task.end_ms):
                continue
            for process_id in sorted(task.process_ids):
                key = by_id.get(process_id)
                if key is not None:
                    result.append((key, TaskMetadata(task.task_id, process_id, task.start_ms)))
        return result

    def process_ids(self) -> dict[ProcessKey, str]:
        with self._lock:
            return {key: r.process_id for key, r in self._state.reported.items() if r.process_id}

    @property
    def cycles(self) -> int:
        with self._cycle_done:
            return self._cycles

    def wait_cycles(self, n: int, timeout: float) -> bool:
        """For tests: waits until `n` report/poll cycles have completed."""
        with self._cycle_done:
            return self._cycle_done.wait_for(lambda: self._cycles >= n, timeout)

    # -- worker side ---------------------------------------------------------------------------

    def _names(self, info: ProcessInfo) -> dict[str, object]:
        return {"comm": info.comm, "exe": info.exe_name, "pid": info.pid, "hostname": self._hostname}

    def _describe(self, info: ProcessInfo) -> _Reported:
        names = self._names(info)
        opts = self._options
        entity = Process_pb2.EBPFProcessEntityMetadata(
            layer=LAYER,
            serviceName=opts.service_name.format(**names),
            instanceName=opts.instance_name.format(**names),
            processName=opts.process_name.format(**names),
            labels=list(opts.labels),
        )
        properties = [
            Common_pb2.KeyStringValuePair(key="pid", value=str(info.pid)),
            Common_pb2.KeyStringValuePair(key="support_ebpf_profiling", value="true"),
        ]
        if opts.report_cmdline and info.cmdline:
            properties.append(Common_pb2.KeyStringValuePair(key="command_line", value=" ".join(info.cmdline)))
        return _Reported(info, entity, properties)

    def _report_new(self) -> None:
        with self._lock:
            watched = dict(self._state.watched)
            for key in list(self._state.reported):
                if key not in watched:
                    del self._state.reported[key]  # gone from the snapshots: forget it
            todo = [
                key
                for key, info in watched.items()
                if not info.exited and (key not in self._state.reported or not self._state.reported[key].process_id)
            ]
        if not todo:
            return
        described = {key: self._describe(watched[key]) for key in todo}
        report = Process_pb2.EBPFProcessReportList(ebpfAgentID=self._options.agent_id)
        for key, item in described.items():
            report.processes.add().hostProcess.CopyFrom(
                Process_pb2.EBPFHostProcessMetadata(entity=item.entity, pid=key.pid, properties=item.properties)
            )
        downstream = self._client.report_processes(report)
        assigned: dict[int, str] = {}
        for process in downstream.processes:
            if process.WhichOneof("process") == "hostProcess":
                assigned[process.hostProcess.pid] = process.processId
        with self._lock:
            for key, item in described.items():
                if key not in self._state.watched:
                    continue
                item.process_id = assigned.get(key.pid, "")
                self._state.reported[key] = item
                if item.process_id:
                    log.info("skywalking: reported pid %d as process %s", key.pid, item.process_id)
                else:
                    self._warn.warning("skywalking: the OAP assigned no process id to pid %d", key.pid)

    def _keep_alive(self) -> None:
        with self._lock:
            watched = self._state.watched
            reported = [
                r
                for key, r in self._state.reported.items()
                if r.process_id and key in watched and not watched[key].exited
            ]
        if not reported:
            return
        pings = Process_pb2.EBPFProcessPingPkgList(ebpfAgentID=self._options.agent_id)
        for item in reported:
            pings.processes.add(entityMetadata=item.entity, properties=item.properties)
        self._client.keep_alive(pings)

    def _poll_tasks(self) -> None:
        with self._lock:
            latest = self._state.latest_update_ms
        tasks = parse_tasks(self._client.query_tasks(self._options.agent_id, latest))
        now = self._clock_ms()
        with self._lock:
            for task in tasks:
                self._state.latest_update_ms = max(self._state.latest_update_ms, task.update_ms)
                if task.target_type != "OFF_CPU":
                    if task.task_id not in self._ignored:
                        self._ignored.add(task.task_id)
                        log.info(
                            "skywalking: ignoring %s task %s (this exporter profiles off-CPU time only)",
                            task.target_type or "untyped",
                            task.task_id,
                        )
                    continue
                if task.trigger_type not in ("", "FIXED_TIME"):
                    if task.task_id not in self._ignored:
                        self._ignored.add(task.task_id)
                        log.info("skywalking: ignoring task %s with trigger %s", task.task_id, task.trigger_type)
                    continue
                if task.task_id not in self._state.tasks:
                    log.info(
                        "skywalking: off-CPU task %s for processes %s, %d s from %d",
                        task.task_id,
                        ",".join(sorted(task.process_ids)),
                        task.duration_s,
                        task.start_ms,
                    )
                self._state.tasks[task.task_id] = task
            # Forget tasks well past their end (two poll intervals of slack for the last flush).
            slack = int(2 * self._options.poll_interval * 1000) + 30_000
            for task_id, task in list(self._state.tasks.items()):
                if task.end_ms + slack < now:
                    del self._state.tasks[task_id]

    def _cycle(self) -> None:
        for step in (self._report_new, self._keep_alive, self._poll_tasks):
            if self._stop.is_set():
                return
            try:
                step()
            except Exception as exc:  # grpc.RpcError: the OAP is down or refused; again next cycle
                # The other steps still run: a refused report must not stop the task polling.
                self._warn.warning("skywalking agent: %s failed: %s", step.__name__.lstrip("_"), describe_error(exc))

    def _run(self) -> None:
        next_poll = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_poll:
                self._cycle()
                next_poll = time.monotonic() + self._options.poll_interval
            else:
                try:
                    self._report_new()
                except Exception as exc:
                    self._warn.warning("skywalking agent: report_new failed: %s", describe_error(exc))
            with self._cycle_done:
                self._cycles += 1
                self._cycle_done.notify_all()
            self._poke.wait(max(0.0, next_poll - time.monotonic()))
            self._poke.clear()
