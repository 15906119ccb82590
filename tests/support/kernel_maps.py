"""An in-memory stand-in for the kernel maps: what Aggregator reads of Probe, held in dicts, for
the delta-logic tests and the flush-cost benchmark (the real maps are exercised by
tests/e2e/test_probe.py)."""

from __future__ import annotations

from offcpu_exporter.probe import layout
from offcpu_exporter.probe.loader import ProbeConfig, RawKey


class KernelMaps:
    """Counters in `counts` (key -> (count, ns)), stacks in `stacks` (id -> addresses); freed stack
    ids are recorded in `deleted_stacks`, stack ids of pending switch-outs are `pending`."""

    def __init__(self, max_counts: int = 100) -> None:
        self.config = ProbeConfig(max_counts=max_counts)
        self.counts: dict[RawKey, tuple[int, int]] = {}
        self.stacks: dict[int, tuple[int, ...]] = {}
        self.deleted_stacks: set[int] = set()
        self.pending: set[int] = set()
        self.targets: dict[int, int] = {}  # the in-kernel filter: tgid -> layout.TARGET_*
        self.mode, self.hooked, self.attached = "tracepoint", ("sched:sched_switch",), True

    def read_counts(self):  # type: ignore[no-untyped-def]
        return [(k, c, ns) for k, (c, ns) in self.counts.items()]

    def take_counts(self, keys):  # type: ignore[no-untyped-def]
        return {k: self.counts.pop(k) for k in list(keys) if k in self.counts}

    def stack(self, stack_id: int):  # type: ignore[no-untyped-def]
        return self.stacks.get(stack_id)

    def delete_stacks(self, ids) -> None:  # type: ignore[no-untyped-def]
        for sid in ids:
            self.stacks.pop(sid, None)
            self.deleted_stacks.add(sid)

    def pending_stack_ids(self) -> set[int]:
        return self.pending

    def read_hist(self) -> dict[int, list[int]]:
        return {}

    def delete_hist(self, tgid: int) -> None:
        pass

    def stats(self) -> list[int]:
        return [0] * layout.STAT_MAX

    def map_sizes(self, counts_entries: int):  # type: ignore[no-untyped-def]
        return {"counts": (counts_entries, self.config.max_counts)}

    def kernel_targets(self) -> dict[int, int]:
        return dict(self.targets)

    def set_target(self, tgid: int, value: int = 1) -> None:
        self.targets[tgid] = value

    def remove_target(self, tgid: int) -> None:
        self.targets.pop(tgid, None)

    def children(self):  # type: ignore[no-untyped-def]
        return {}

    def forget_child(self, tgid: int) -> None:
        pass
