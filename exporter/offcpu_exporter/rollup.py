"""Blocks summed over processes as they are counted: every process since start, and each container.

An output that folds thousands of processes into a few series (pid="other" past
--prometheus.max-processes, one histogram per container) used to sum every process's view at every
scrape: at 10,000 processes that was two thirds of a scrape's 0.6 s. The aggregator adds each
increase here as it counts it, so such an output reads a few sums and subtracts the processes it
shows on their own. Exited processes stay in the sums: an exit never lowers them.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType

from offcpu_exporter.snapshot import Counter, Reason, Rollup, Where

__all__ = ["Rollups"]

_EMPTY = Rollup()


class _Sums:
    # Plain integers, made into Counters only when read: added to for every process counted.
    __slots__ = ("blocks", "by_reason", "histogram", "ns", "rollup")

    def __init__(self) -> None:
        self.blocks = self.ns = 0
        self.by_reason: dict[Reason, list[int]] = {}  # -> [blocks, ns]
        self.histogram: list[int] = []
        self.rollup: Rollup | None = _EMPTY  # None once changed: made again when read

    def add(self, reason: Reason | None, blocks: int, ns: int) -> None:
        self.blocks += blocks
        self.ns += ns
        if reason is not None:
            sums = self.by_reason.get(reason)
            if sums is None:
                self.by_reason[reason] = [blocks, ns]
            else:
                sums[0] += blocks
                sums[1] += ns
        self.rollup = None

    def add_blocks(self, growth: Sequence[int]) -> None:
        if len(self.histogram) < len(growth):
            self.histogram.extend([0] * (len(growth) - len(self.histogram)))
        self.histogram[: len(growth)] = map(operator.add, self.histogram, growth)  # (in C)
        self.rollup = None

    def read(self) -> Rollup:
        if self.rollup is None:
            by_reason = {reason: Counter(blocks, ns) for reason, (blocks, ns) in self.by_reason.items()}
            self.rollup = Rollup(Counter(self.blocks, self.ns), MappingProxyType(by_reason), tuple(self.histogram))
        return self.rollup


class Rollups:
    """The aggregator's (one writer); read when a snapshot is made."""

    def __init__(self) -> None:
        self._everything = _Sums()
        self._containers: dict[Where, _Sums] = {}

    def add(self, where: Where, reason: Reason | None, blocks: int, ns: int) -> None:
        """A process's off-CPU increase for one reason (None: not told apart by reason)."""
        self._everything.add(reason, blocks, ns)
        sums = self._containers.get(where)
        if sums is None:
            sums = self._containers[where] = _Sums()
        # (Containers' totals only, their histograms' sums: _Sums.add(None, ...) inlined, since
        # this runs for every process counted at every flush.)
        sums.blocks += blocks
        sums.ns += ns
        sums.rollup = None

    def add_blocks(self, where: Where, growth: Sequence[int]) -> None:
        """How much a process's block-duration histogram grew, slot by slot."""
        self._everything.add_blocks(growth)
        sums = self._containers.get(where)
        if sums is None:
            sums = self._containers[where] = _Sums()
        sums.add_blocks(growth)

    def everything(self) -> Rollup:
        return self._everything.read()

    def containers(self, present: Iterable[Where]) -> Mapping[Where, Rollup]:
        """The containers with a process in the snapshot: those without any are forgotten, so that
        their series end as a process's do after its grace (and start from zero if one comes back)."""
        alive = set(present)
        for where in [w for w in self._containers if w not in alive]:
            del self._containers[where]
        sums = self._containers
        return MappingProxyType({w: sums[w].read() if w in sums else _EMPTY for w in alive})
