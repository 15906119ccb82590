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
from typing import Any

from offcpu_exporter.formats.proto.skywalking.ebpf.profiling import Profile_pb2 as pb
from offcpu_exporter.snapshot import Counter, ProcessKey, Snapshot, Stack, StackSample

__all__ = [
    "INT32_MAX",
    "TaskMetadata",
    "encode_samples",
    "encode_snapshot",
    "skywalking_stack_id",
    "split_counter",
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


def _add_half(off: pb.EBPFOffCPUProfiling, kind: int, stack_id: int, symbols: tuple[str, ...]) -> None:
    if symbols:
        half = off.stacks.add()
        half.stackType = kind  # type: ignore[assignment]
        half.stackId = stack_id
        half.stackSymbols.extend(symbols)


def _encode(samples: Iterable[StackSample]) -> dict[ProcessKey, list[pb.EBPFProfilingData]]:
    # Samples are summed per process and *symbols* (the frame names, which is all the OAP sees and
    # what it merges by): tuples of already-hashed strings hash several times faster than Stack
    # values, whose hash walks every Frame. Placeholders (``[lost stack ...]``, ``[unknown]
    # lib+0x..``) are names like any other, so a lost or unresolved half still shows.
    groups: dict[tuple[ProcessKey, tuple[str, ...], tuple[str, ...]], list[Any]] = {}
    for sample in samples:
        increase = sample.increase
        if not increase:
            continue
        stack = sample.stack
        key = (sample.process, tuple([f.name for f in stack.kernel]), tuple([f.name for f in stack.user]))
        group = groups.get(key)
        if group is None:
            groups[key] = [stack, increase.count, increase.ns]
        else:
            group[1] += increase.count
            group[2] += increase.ns
    result: dict[ProcessKey, list[pb.EBPFProfilingData]] = {}
    split = extra = 0
    for (process, kernel, user), (stack, count, ns) in groups.items():
        if count < 0 or ns < 0:
            continue  # counters only grow; a negative increase is a restarted source, not data
        if not kernel and not user:
            continue  # both halves empty: nothing the OAP could draw (Rover skips these too)
        stack_id = skywalking_stack_id(stack)
        parts = split_counter(Counter(count, ns))
        if len(parts) > 1:
            split += 1
            extra += len(parts) - 1
        messages = result.setdefault(process, [])
        for part in parts:
            message = pb.EBPFProfilingData()
            off = message.offCPU
            _add_half(off, pb.PROCESS_KERNEL_SPACE, stack_id, kernel)
            _add_half(off, pb.PROCESS_USER_SPACE, stack_id, user)
            off.switchCount = part.count
            off.duration = part.ns
            messages.append(message)
    if split:
        log.info("split %d stack increases above int32 switches into %d extra messages", split, extra)
    return result


def encode_samples(samples: Iterable[StackSample]) -> list[pb.EBPFProfilingData]:
    """Off-CPU messages for the increases of `samples` (of one process or several: each process's
    stacks are kept apart), in first-seen order. Task metadata is left to the transport."""
    return [message for messages in _encode(samples).values() for message in messages]


def encode_snapshot(
    snapshot: Snapshot, processes: Iterable[ProcessKey] | None = None
) -> dict[ProcessKey, list[pb.EBPFProfilingData]]:
    """Messages per process for the snapshot's increases (only `processes` when given); processes
    without a changed stack are absent."""
    if processes is None:
        return _encode(snapshot.changed())
    wanted = set(processes)
    return _encode(s for s in snapshot.changed() if s.process in wanted)


def with_task(task: TaskMetadata, messages: Sequence[pb.EBPFProfilingData]) -> list[pb.EBPFProfilingData]:
    """The messages of one stream, the first a copy carrying `task` (the others unmodified)."""
    if not messages:
        return []
    first = pb.EBPFProfilingData()
    first.CopyFrom(messages[0])
    first.task.CopyFrom(task.to_proto())
    return [first, *messages[1:]]
