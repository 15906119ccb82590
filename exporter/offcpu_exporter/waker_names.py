"""Waker ids to wakers (--wakers on): the waker part of a kernel counter's key named through the
same stack cache as the blocked stacks (stack_names.py), its user half in the waker's own address
space. A wake-up from interrupt context is named by what its kernel stack shows: a timer's expiry,
a softirq, or another interrupt."""

from __future__ import annotations

from offcpu_exporter.probe import layout
from offcpu_exporter.probe.maps import WakerIds
from offcpu_exporter.snapshot import Frame, Waker, WakerKind
from offcpu_exporter.stack_names import StackIds, StackNames

__all__ = ["WakerNames", "interrupt_kind", "interrupt_path", "waker_ids"]

# Kernel functions whose presence in an interrupt-context waker's stack says what ran the wake-up
# (the first match wins: a timer's wake-up runs inside the timer interrupt, perhaps itself inside a
# softirq on kernels that expire timers there).
_TIMER_FUNCTIONS = ("hrtimer_wakeup", "process_timeout", "call_timer_fn", "__run_hrtimer")
_SOFTIRQ_FUNCTIONS = ("handle_softirqs", "__do_softirq", "do_softirq", "__irq_exit_rcu", "irq_exit_rcu",
                      "net_rx_action", "blk_done_softirq", "tasklet_action_common")
# Names cached at most this many: a busy node's distinct wakers, bounded (cleared when full).
_MAX_CACHED = 65536


def waker_ids(ids: StackIds) -> WakerIds | None:
    """The waker part of a group's row ids (groups.py): its third id, with wakers on."""
    return ids[2] if len(ids) == 3 else None  # type: ignore[misc]


def interrupt_path(kernel: tuple[Frame, ...]) -> tuple[Frame, ...]:
    """An interrupt-context waker's kernel frames up to the interrupt's entry (x86-64's asm_*
    stubs, arch/x86/include/asm/idtentry.h): below it is whatever the interrupt landed on (the
    idle loop, any task), which did not wake anyone and would split one waker into many stacks."""
    for i, frame in enumerate(kernel):
        if frame.name.startswith("asm_"):
            return kernel[: i + 1]
    return kernel


def interrupt_kind(kernel: tuple[Frame, ...]) -> WakerKind:
    names = [f.name.split(" ", 1)[0].split(".", 1)[0] for f in kernel]
    if any(n in _TIMER_FUNCTIONS for n in names):
        return WakerKind.TIMER
    if any(n in _SOFTIRQ_FUNCTIONS for n in names):
        return WakerKind.SOFTIRQ
    return WakerKind.INTERRUPT


class WakerNames:
    def __init__(self, stacks: StackNames) -> None:
        self._stacks = stacks
        self._named: dict[WakerIds, Waker] = {}

    def of_row(self, ids: StackIds) -> Waker | None:
        """The waker of a group's row (groups.py), with wakers on."""
        return self.waker(waker_ids(ids))

    def waker(self, ids: WakerIds | None) -> Waker | None:
        """The waker of these ids; None when no wake-up was seen (a preempted thread's blocks,
        or a waker the kernel could not keep)."""
        if ids is None or ids.context == layout.WAKER_NONE:
            return None
        named = self._named.get(ids)
        if named is not None:
            return named
        if ids.context == layout.WAKER_TASK:
            stack = self._stacks.stack(ids.tgid, ids.user_stack, ids.kernel_stack)
            comm = ids.comm.split(b"\0", 1)[0].decode(errors="replace")
            waker = Waker(WakerKind.TASK, ids.tgid, ids.tid, comm, stack.user, stack.kernel)
        else:
            kernel = interrupt_path(self._stacks.stack(0, layout.STACK_EMPTY, ids.kernel_stack).kernel)
            waker = Waker(interrupt_kind(kernel), 0, 0, "", (), kernel)
        if len(self._named) >= _MAX_CACHED:
            self._named.clear()
        self._named[ids] = waker
        return waker
