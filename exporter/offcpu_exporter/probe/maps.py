"""What the rest of the exporter uses of the loaded probe: `KernelMaps`, and the plain values its
maps hold (`CounterKey`, `CounterValue`, `StartEntry`).

`Probe` (probe/loader.py) is the real one, over the BPF maps; tests and benchmarks pass an in-memory
stand-in (testkit/kernel_maps.py), which mypy checks against this protocol. Modules that only read
the values import them from here, not from the loader (which needs bcc).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:
    from offcpu_exporter.probe.config import ProbeConfig
    from offcpu_exporter.unwind import Unwinder

__all__ = ["CounterKey", "CounterValue", "KernelMaps", "ProgramRuns", "StartEntry", "WakerIds", "with_waker"]


class WakerIds(NamedTuple):
    """The waker part of a `counts` key with wakers on (struct offcpu_waker)."""

    tgid: int
    tid: int
    context: int  # layout.WAKER_*
    user_stack: int
    kernel_stack: int
    comm: bytes  # NUL-padded


class CounterKey(NamedTuple):
    """A key of the kernel's `counts` map (a NamedTuple: hashed in C, it is a dict key per flush).
    With wakers on, the kernel's keys carry a sixth element, their WakerIds (`waker`): made with
    tuple.__new__ by probe/access.py. With them off a key is these five fields, as cheap to read
    and hash as before wakers existed."""

    tgid: int
    tid: int  # 0 when aggregating per process
    reason: int
    user_stack: int  # a stack id: layout.STACK_* below layout.STACK_RESERVED, else a hash
    kernel_stack: int

    @property
    def waker(self) -> WakerIds | None:
        return self[5] if len(self) > 5 else None  # type: ignore[misc]


def with_waker(key: CounterKey, waker: WakerIds) -> CounterKey:
    """`key` with its waker as the sixth element (wakers on: see CounterKey)."""
    return tuple.__new__(CounterKey, (*key[:5], waker))


class CounterValue(NamedTuple):
    """Cumulative: every block's count and ns; the sampled (weighted) estimate of the key's stack."""

    blocks: int
    ns: int
    weighted_blocks: int
    weighted_ns: int


class StartEntry(NamedTuple):
    """A thread off CPU now: since when, why, and its stacks when they were captured. (Fields in
    struct offcpu_start's order: read_starts() makes them from the map's bytes without a Python
    call per thread.)"""

    ts_ns: int
    user_stack: int
    kernel_stack: int
    tgid: int
    reason: int
    weight: int


class ProgramRuns(NamedTuple):
    """The kernel's figures of the probe's programs since they were loaded (program_stats.py)."""

    ns: int  # time spent in them (0 while the kernel does not time them: kernel.bpf_stats_enabled)
    runs: int  # runs (counted while timed, as above)
    skipped: int  # runs the kernel skipped (its recursion guard): switches not seen; counted always


class KernelMaps(Protocol):
    config: ProbeConfig
    mode: str  # "kprobe" | "tracepoint" once attached
    hooked: tuple[str, ...]
    attached_wall_ns: int  # when counting began (wall clock), 0 before
    attached_ktime_ns: int  # the same on the probe's clock (CLOCK_MONOTONIC)
    unwinder: Unwinder | None  # DWARF unwind tables, when user stacks use them

    @property
    def attached(self) -> bool: ...

    # lifecycle: load and attach (counting begins), then detach and free the maps
    def start(self) -> None: ...

    def close(self) -> None: ...

    @property
    def cutoff_ns(self) -> int: ...

    # targets
    def kernel_targets(self) -> dict[int, int]: ...

    def set_target(self, tgid: int, value: int = 1) -> None: ...

    def remove_target(self, tgid: int) -> None: ...

    def children(self) -> dict[int, tuple[int, int, str]]: ...

    def forget_child(self, tgid: int) -> None: ...

    def take_process_events(self) -> dict[int, int] | None:
        """tgid -> layout.PROC_* of processes that changed since the last call; None when these
        maps have no such source (then /proc is rescanned at every refresh)."""

    # counters and stacks
    def read_counts(self) -> list[tuple[CounterKey, CounterValue]]: ...

    def take_counts(self, keys: Iterable[CounterKey]) -> dict[CounterKey, CounterValue]: ...

    def stack(self, stack_id: int) -> tuple[int, ...] | None: ...

    def stack_ids(self) -> set[int]: ...

    def waker_stack_ids(self) -> set[int]:
        """The stack ids of the wakers of blocks in progress (none with wakers off)."""

    def delete_stacks(self, stack_ids: Iterable[int]) -> None: ...

    def store_stack(self, frames: Sequence[int]) -> int: ...

    # blocks in progress
    def read_starts(self) -> dict[int, StartEntry]: ...

    def read_start(self, tid: int) -> StartEntry | None: ...

    def seed_start(self, tid: int, entry: StartEntry) -> bool: ...

    def unseed_start(self, tid: int, ts_ns: int) -> None: ...

    def write_marks(self, marks: dict[int, tuple[int, int]]) -> None: ...

    def read_marks(self) -> dict[int, tuple[int, int]]: ...

    def delete_marks(self, tids: Iterable[int]) -> None: ...

    def set_marks_active(self, active: bool) -> None: ...

    def set_cutoff(self, ktime_ns: int) -> None: ...

    # histogram, statistics, sizes, cost
    def read_hist(self) -> dict[int, list[int]]: ...

    def take_hist(self, tgid: int) -> list[int]: ...

    def stats(self) -> list[int]: ...

    def map_sizes(self, **known: int) -> dict[str, tuple[int, int]]: ...

    def program_runs(self) -> ProgramRuns: ...
