"""Waker ids named through the stack cache, and interrupt-context wakers told apart by their
kernel frames."""

from __future__ import annotations

from collections.abc import Sequence

from offcpu_exporter.groups import Group, add_row
from offcpu_exporter.probe import layout
from offcpu_exporter.probe.maps import CounterKey, CounterValue, WakerIds, with_waker
from offcpu_exporter.snapshot import Frame, FrameKind, LostHalf, Stack, WakerKind
from offcpu_exporter.stack_names import StackNames, lost_halves
from offcpu_exporter.waker_names import WakerNames, interrupt_kind, interrupt_path
from testkit.kernel_maps import MemoryMaps


class _Names:
    """A symbolizer that names an address after itself."""

    failures = 0

    def kernel(self, addresses: Sequence[int]) -> tuple[Frame, ...]:
        return tuple(Frame(f"k{a:x}", FrameKind.KERNEL) for a in addresses)

    def user(self, pid: int, addresses: Sequence[int]) -> tuple[Frame, ...]:
        return tuple(Frame(f"u{pid}:{a:x}", FrameKind.NATIVE) for a in addresses)

    def prepare(self, pid: int) -> None: ...

    def generation(self, pid: int) -> int:
        return 0

    def refresh(self, pid: int) -> int:
        return 0

    def forget(self, pid: int) -> None: ...


def _kernel(*names: str) -> tuple[Frame, ...]:
    return tuple(Frame(n, FrameKind.KERNEL) for n in names)


def test_interrupt_kinds_by_frames() -> None:
    assert interrupt_kind(_kernel("try_to_wake_up", "hrtimer_wakeup", "hrtimer_interrupt")) is WakerKind.TIMER
    assert interrupt_kind(_kernel("try_to_wake_up", "blk_mq_end_request", "handle_softirqs")) is WakerKind.SOFTIRQ
    assert interrupt_kind(_kernel("try_to_wake_up", "nvme_irq", "handle_edge_irq")) is WakerKind.INTERRUPT


def test_an_interrupt_path_stops_at_its_entry() -> None:
    frames = _kernel("try_to_wake_up", "hrtimer_wakeup", "asm_sysvec_apic_timer_interrupt", "pv_native_safe_halt",
                     "do_idle")
    assert [f.name for f in interrupt_path(frames)] == ["try_to_wake_up", "hrtimer_wakeup",
                                                         "asm_sysvec_apic_timer_interrupt"]
    assert interrupt_path(frames[:2]) == frames[:2]


def test_task_and_interrupt_wakers_are_named_from_their_stacks() -> None:
    maps = MemoryMaps()
    user_id, kernel_id = maps.store_stack([0x10, 0x20]), maps.store_stack([0x30])
    names = WakerNames(StackNames(maps, _Names()))
    task = names.waker(WakerIds(5, 6, layout.WAKER_TASK, user_id, kernel_id, b"writer\0\0"))
    assert task is not None and task.kind is WakerKind.TASK and (task.pid, task.tid, task.name) == (5, 6, "writer")
    assert [f.name for f in task.user] == ["u5:10", "u5:1f"] and [f.name for f in task.kernel] == ["k30"]
    irq = names.waker(WakerIds(0, 0, layout.WAKER_INTERRUPT, layout.STACK_EMPTY, kernel_id, b""))
    assert irq is not None and irq.kind is WakerKind.INTERRUPT and irq.user == () and irq.name == "[interrupt]"
    assert names.waker(WakerIds(0, 0, layout.WAKER_NONE, 0, 0, b"")) is None
    assert names.waker(None) is None


def test_a_wakers_lost_halves_are_counted_as_lost() -> None:
    full = layout.STACK_ERRNO_BASE + 12  # ENOMEM: the stack map was full
    irq = WakerIds(0, 0, layout.WAKER_INTERRUPT, layout.STACK_EMPTY, full, b"")
    stack = Stack((Frame("read", FrameKind.NATIVE),), (Frame("schedule", FrameKind.KERNEL),))
    assert lost_halves(5000, 5001, stack, irq) == [LostHalf("waker kernel", "ENOMEM")]
    assert lost_halves(5000, 5001, stack, irq._replace(kernel_stack=6000)) == []
    assert lost_halves(5000, 5001, stack) == ()


def test_a_thread_splits_over_its_wakers_too() -> None:
    groups: dict[tuple[int, int, int], Group] = {}
    a = WakerIds(1, 2, layout.WAKER_TASK, 4096, 4097, b"a")
    b = WakerIds(1, 3, layout.WAKER_TASK, 4098, 4097, b"b")
    key = CounterKey(1, 1, 1, 5000, 5001)
    assert key.waker is None and with_waker(key, a).waker == a
    add_row(groups, with_waker(key, a), CounterValue(3, 300, 3, 300))
    add_row(groups, with_waker(key, b), CounterValue(1, 100, 1, 100))
    rows = dict(groups[(1, 1, 1)].split())
    assert rows[(5000, 5001, a)].ns == 300 and rows[(5000, 5001, b)].ns == 100
