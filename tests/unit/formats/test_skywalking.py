"""The pure snapshot -> EBPFProfilingData conversion."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from google.protobuf import json_format

from offcpu_exporter.formats.proto.skywalking.ebpf.profiling import Profile_pb2 as pb
from offcpu_exporter.formats.skywalking import (
    INT32_MAX,
    TaskMetadata,
    encode_samples,
    encode_snapshot,
    skywalking_stack_id,
    split_counter,
    with_task,
)
from offcpu_exporter.snapshot import Counter, Reason, Stack
from testkit import golden
from testkit.snapshots import (
    EMPTY,
    KERNEL_ONLY,
    LOST_USER,
    PIPE,
    SEC,
    SLEEP,
    kernel,
    process,
    sample,
    snapshot,
    user,
)

GOLDEN = Path(__file__).parent / "golden" / "offcpu_messages.json"
APP = process(4242, "app")
OTHER = process(777, "other")


def golden_snapshot():
    return snapshot(
        [
            sample(APP, SLEEP, 10, 2 * SEC, tid=4242),
            sample(APP, SLEEP, 5, 1 * SEC, tid=4243),  # same stack, other thread: summed
            sample(APP, SLEEP, 1, 100, tid=4243, reason=Reason.RUNNABLE),  # other reason: summed
            sample(APP, PIPE, 0, 0, total=Counter(3, 300)),  # no increase: not sent
            sample(APP, LOST_USER, 2, 20_000),
            sample(APP, KERNEL_ONLY, 1, 1_000),
            sample(APP, EMPTY, 4, 4_000),  # nothing to draw: not sent
            sample(OTHER, PIPE, 7, 7_000),
        ],
        [APP, OTHER],
    )


def test_golden_messages() -> None:
    encoded = encode_snapshot(golden_snapshot())
    actual = {
        str(key.pid): [
            json.loads(json_format.MessageToJson(m, always_print_fields_with_no_presence=True)) for m in messages
        ]
        for key, messages in encoded.items()
    }
    golden.rewrite_if_requested(
        GOLDEN,
        json.dumps(
            {
                "made_by": "OFFCPU_UPDATE_GOLDEN=1 pytest tests/unit/formats/test_skywalking.py",
                "checked_by_hand": "kernel half first, each half leaf first, sums over threads",
                "messages": actual,
            },
            indent=1,
        )
        + "\n",
    )
    assert actual == json.loads(GOLDEN.read_text())["messages"]


def test_kernel_half_first_each_leaf_first() -> None:
    (message,) = encode_samples([sample(APP, SLEEP, 3, 300)])
    kernel_half, user_half = message.offCPU.stacks
    assert kernel_half.stackType == pb.PROCESS_KERNEL_SPACE
    assert list(kernel_half.stackSymbols) == [f.name for f in SLEEP.kernel]
    assert kernel_half.stackSymbols[0] == "finish_task_switch.isra.0"
    assert user_half.stackType == pb.PROCESS_USER_SPACE
    assert list(user_half.stackSymbols) == ["offcpu_sleep_ms", "main", "__libc_start_main"]
    assert message.offCPU.switchCount == 3 and message.offCPU.duration == 300
    assert not message.HasField("task")


def test_oap_order_is_root_first() -> None:
    # The OAP pushes each symbol to the front of one list (EBPFProfilingStack.deserialize):
    # the resulting list must be the root-first stack: user root .. user leaf, kernel entry .. leaf.
    (message,) = encode_samples([sample(APP, SLEEP, 1, 1)])
    oap: list[str] = []
    for stack in message.offCPU.stacks:
        for symbol in stack.stackSymbols:
            oap.insert(0, symbol)
    assert oap == [f.name for f in SLEEP.root_to_leaf()]
    assert oap[0] == "__libc_start_main" and oap[-1] == "finish_task_switch.isra.0"


def test_aggregates_threads_and_reasons_but_not_processes() -> None:
    messages = encode_samples(
        [
            sample(APP, SLEEP, 1, 10, tid=1),
            sample(APP, SLEEP, 2, 20, tid=2, reason=Reason.UNINTERRUPTIBLE),
            sample(OTHER, SLEEP, 4, 40),
        ]
    )
    assert [(m.offCPU.switchCount, m.offCPU.duration) for m in messages] == [(3, 30), (4, 40)]


def test_zero_negative_and_empty_are_not_sent() -> None:
    assert encode_samples([sample(APP, SLEEP, 0, 0)]) == []
    assert encode_samples([sample(APP, EMPTY, 5, 500)]) == []
    assert encode_samples([sample(APP, SLEEP, -1, -10)]) == []
    # A duration without a completed switch count still carries time (DURATION flame graphs).
    (message,) = encode_samples([sample(APP, SLEEP, 0, 10)])
    assert (message.offCPU.switchCount, message.offCPU.duration) == (0, 10)


def test_lost_and_single_halves_are_sent_as_they_are() -> None:
    (lost,) = encode_samples([sample(APP, LOST_USER, 1, 5)])
    assert [list(s.stackSymbols) for s in lost.offCPU.stacks] == [
        ["finish_task_switch", "futex_wait"],
        ["[lost stack: user, -EFAULT]"],
    ]
    (kernel_only,) = encode_samples([sample(APP, KERNEL_ONLY, 1, 5)])
    assert [s.stackType for s in kernel_only.offCPU.stacks] == [pb.PROCESS_KERNEL_SPACE]
    user_only = Stack(user=user("poll_loop"), kernel=())
    (message,) = encode_samples([sample(APP, user_only, 1, 5)])
    assert [s.stackType for s in message.offCPU.stacks] == [pb.PROCESS_USER_SPACE]


def test_stack_id_is_stable_non_negative_int32_and_shared_by_halves() -> None:
    (message,) = encode_samples([sample(APP, SLEEP, 1, 1)])
    ids = {s.stackId for s in message.offCPU.stacks}
    assert ids == {skywalking_stack_id(SLEEP)}
    assert 0 <= skywalking_stack_id(SLEEP) <= INT32_MAX
    assert skywalking_stack_id(SLEEP) == int(SLEEP.stack_id[:8], 16) >> 1
    same = Stack(user=user("offcpu_sleep_ms", "main", "__libc_start_main"), kernel=SLEEP.kernel)
    assert skywalking_stack_id(same) == skywalking_stack_id(SLEEP)
    assert skywalking_stack_id(PIPE) != skywalking_stack_id(SLEEP)
    other = Stack(user=SLEEP.user, kernel=kernel("finish_task_switch.isra.0", "__schedule"))
    assert skywalking_stack_id(other) != skywalking_stack_id(SLEEP)


def test_split_above_int32_keeps_the_totals(caplog) -> None:
    big = Counter(5 * INT32_MAX + 17, 10**15 + 3)
    parts = split_counter(big)
    assert len(parts) == 6
    assert all(0 < p.count <= INT32_MAX for p in parts)
    assert sum(p.count for p in parts) == big.count
    assert sum(p.ns for p in parts) == big.ns
    assert split_counter(Counter(INT32_MAX, 9)) == [Counter(INT32_MAX, 9)]
    with caplog.at_level(logging.INFO):
        messages = encode_samples([sample(APP, SLEEP, big.count, big.ns)])
    assert len(messages) == 6
    assert sum(m.offCPU.switchCount for m in messages) == big.count
    assert sum(m.offCPU.duration for m in messages) == big.ns
    assert "split 1 stack increases above int32 switches into 5 extra messages" in caplog.text
    # Serializable: no value overflows its wire type.
    for m in messages:
        pb.EBPFProfilingData.FromString(m.SerializeToString())


def test_encode_snapshot_filters_processes_and_with_task() -> None:
    snap = golden_snapshot()
    only = encode_snapshot(snap, [OTHER.key])
    assert list(only) == [OTHER.key]
    assert encode_snapshot(snap, []) == {}
    messages = only[OTHER.key]
    task = TaskMetadata("t1", "p1", 1000, 2000)
    streamed = with_task(task, messages)
    assert streamed[0].task.taskId == "t1" and streamed[0].task.processId == "p1"
    assert (streamed[0].task.profilingStartTime, streamed[0].task.currentTime) == (1000, 2000)
    assert streamed[0].offCPU == messages[0].offCPU
    assert not messages[0].HasField("task")  # the encoder's message is not modified
    assert with_task(task, []) == []


def test_sum_over_messages_equals_process_increase() -> None:
    snap = golden_snapshot()
    encoded = encode_snapshot(snap)
    for key, messages in encoded.items():
        expected = sum(
            (s.increase for s in snap.samples if s.process == key and (s.stack.user or s.stack.kernel)),
            Counter(),
        )
        assert sum(m.offCPU.switchCount for m in messages) == expected.count
        assert sum(m.offCPU.duration for m in messages) == expected.ns
