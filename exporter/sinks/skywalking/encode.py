"""Snapshot -> SkyWalking `EBPFProfilingData` (off-CPU), with no I/O.

One message per process and symbolized stack whose increase since the previous snapshot is not
zero (samples of the same stack on several threads or off-CPU reasons are summed, since the OAP
knows neither). Each message carries the kernel half first, then the user half, each leaf first,
exactly as SkyWalking Rover sends them: the OAP's ``EBPFProfilingStack.deserialize`` pushes every
symbol to the front of one list (``addFirst``), which turns ``kernel leaf..entry, user leaf..root``
into ``user root..leaf, kernel entry..leaf``, the root-first order it builds flame graphs in.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from exporter.sinks.skywalking.proto.ebpf.profiling import Profile_pb2 as pb
from exporter.snapshot import Counter, Frame, ProcessKey, Snapshot, Stack, StackSample

__all__ = [
    "INT32_MAX",
    "TaskMetadata",
    "encode_samples",
    "encode_snapshot",
    "skywalking_stack_id",
    "split_counter",
    "stack_symbols",
    "with_task",
]

log = logging.getLogger(__name__)

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


@dataclass(frozen=True, slots=True)
class TaskMetadata:
    """What the first message of a stream names: the task, the OAP's process id, and times in ms."""

    task_id: str
    process_id: str
    profiling_start_ms: int
    current_ms: int = 0

    def to_proto(self) -> pb.EBPFProfilingTaskMetadata:
        return pb.EBPFProfilingTaskMetadata(
            taskId=self.task_id,
            processId=self.process_id,
            profilingStartTime=self.profiling_start_ms,
            currentTime=self.current_ms,
        )


def skywalking_stack_id(stack: Stack) -> int:
    """A stable, non-negative int32 for `stackId`: the top 31 bits of the symbolized stack's hash.

    Rover sends the kernel's stack-map ids, which are reused and change on restart; the OAP does
    not aggregate by this field (it merges stacks by their symbols), so a stable hash of the frames
    is both compatible and more useful to anyone reading the stored data."""
    return int(stack.stack_id[:8], 16) >> 1


def stack_symbols(frames: Sequence[Frame]) -> list[str]:
    """The frames' names, leaf first. Placeholders (``[lost stack ...]``, ``[unknown] lib+0x..``)
    are names like any other, so a lost or unresolved half still shows in the flame graph."""
    return [frame.name for frame in frames]


def split_counter(counter: Counter) -> list[Counter]:
    """Splits an increase whose switch count exceeds int32 (`switchCount`'s wire type) into parts
    that each fit, dividing the nanoseconds in proportion; the parts add up to the whole."""
    count, ns = counter.count, min(counter.ns, INT64_MAX)
    if count <= INT32_MAX:
        return [Counter(count, ns)]
    parts: list[Counter] = []
    left_count, left_ns = count, ns
    while left_count > INT32_MAX:
        part_ns = ns * INT32_MAX // count
        parts.append(Counter(INT32_MAX, part_ns))
        left_count -= INT32_MAX
        left_ns -= part_ns
    parts.append(Counter(left_count, left_ns))
    return parts


def _stack_metadata(stack: Stack) -> list[pb.EBPFProfilingStackMetadata]:
    stack_id = skywalking_stack_id(stack)
    halves = (
        (pb.PROCESS_KERNEL_SPACE, stack.kernel),
        (pb.PROCESS_USER_SPACE, stack.user),
    )
    return [
        pb.EBPFProfilingStackMetadata(stackType=kind, stackId=stack_id, stackSymbols=stack_symbols(frames))
        for kind, frames in halves
        if frames
    ]


def encode_samples(samples: Iterable[StackSample]) -> list[pb.EBPFProfilingData]:
    """Off-CPU messages for the increases of `samples` (of one process or several: each process's
    stacks are kept apart), in first-seen order. Task metadata is left to the transport."""
    increases: dict[tuple[ProcessKey, Stack], Counter] = {}
    for sample in samples:
        if not sample.increase:
            continue
        key = (sample.process, sample.stack)
        increases[key] = increases.get(key, Counter()) + sample.increase
    messages: list[pb.EBPFProfilingData] = []
    split = extra = 0
    for (_, stack), increase in increases.items():
        if increase.count < 0 or increase.ns < 0:
            continue  # counters only grow; a negative increase is a restarted source, not data
        metadata = _stack_metadata(stack)
        if not metadata:
            continue  # both halves empty: nothing the OAP could draw (Rover skips these too)
        parts = split_counter(increase)
        if len(parts) > 1:
            split += 1
            extra += len(parts) - 1
        for part in parts:
            messages.append(
                pb.EBPFProfilingData(
                    offCPU=pb.EBPFOffCPUProfiling(stacks=metadata, switchCount=part.count, duration=part.ns)
                )
            )
    if split:
        log.info("split %d stack increases above int32 switches into %d extra messages", split, extra)
    return messages


def encode_snapshot(
    snapshot: Snapshot, processes: Iterable[ProcessKey] | None = None
) -> dict[ProcessKey, list[pb.EBPFProfilingData]]:
    """Messages per process for the snapshot's increases (only `processes` when given); processes
    without a changed stack are absent."""
    wanted = None if processes is None else set(processes)
    by_process: dict[ProcessKey, list[StackSample]] = {}
    for sample in snapshot.changed():
        if wanted is None or sample.process in wanted:
            by_process.setdefault(sample.process, []).append(sample)
    result: dict[ProcessKey, list[pb.EBPFProfilingData]] = {}
    for key, samples in by_process.items():
        messages = encode_samples(samples)
        if messages:
            result[key] = messages
    return result


def with_task(task: TaskMetadata, messages: Sequence[pb.EBPFProfilingData]) -> list[pb.EBPFProfilingData]:
    """The messages of one stream, the first a copy carrying `task` (the others unmodified)."""
    if not messages:
        return []
    first = pb.EBPFProfilingData()
    first.CopyFrom(messages[0])
    first.task.CopyFrom(task.to_proto())
    return [first, *messages[1:]]
