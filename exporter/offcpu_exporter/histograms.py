"""Block-duration histograms per process: the kernel's cumulative slots per tgid as increases,
summed per process identity (a pid may be reused) and into the rollups."""

from __future__ import annotations

import operator
from collections.abc import Iterable

from offcpu_exporter.probe import layout
from offcpu_exporter.probe.maps import KernelMaps
from offcpu_exporter.rollup import Rollups
from offcpu_exporter.snapshot import ProcessInfo, ProcessKey, Where
from offcpu_exporter.targets import ProcessTable

__all__ = ["Histograms"]


class Histograms:
    def __init__(self, probe: KernelMaps, processes: ProcessTable, rollups: Rollups) -> None:
        self.probe = probe
        self.processes = processes
        self.rollups = rollups
        self._totals: dict[ProcessKey, list[int]] = {}  # cumulative block counts per duration slot
        self._read: dict[int, list[int]] = {}  # tgid -> the kernel's slots at the last read
        # The totals as snapshots show them, made again only after they grew: most processes on a
        # node block at no time between two flushes.
        self._shown: dict[ProcessKey, tuple[int, ...]] = {}

    def get(self, pkey: ProcessKey) -> tuple[int, ...]:
        """A process's cumulative counts per slot; () when it has none."""
        shown = self._shown.get(pkey)
        if shown is None:
            total = self._totals.get(pkey)
            shown = self._shown[pkey] = tuple(total) if total else ()
        return shown

    def add(self, info: ProcessInfo, tgid: int, slots: list[int]) -> None:
        """`slots`, the kernel's cumulative figures of `tgid`, whose increase is `info`'s."""
        inc = self._increase(info, tgid, slots)
        if inc is not None:
            self.rollups.add_blocks(info.where, inc)

    def _increase(self, info: ProcessInfo, tgid: int, slots: list[int]) -> list[int] | None:
        """Adds the increase of `tgid`'s `slots` since the last read to `info`'s totals, and returns
        it (None when there is none)."""
        last = self._read.get(tgid)
        self._read[tgid] = slots
        if last is None:
            inc = slots
            if not any(inc):
                return None
        elif slots == last:
            return None
        else:
            # In C (map, min): every process's histogram is read at every flush.
            inc = list(map(operator.sub, slots, last))
            if min(inc) < 0:
                inc = slots  # deleted and re-created since
                if not any(inc):
                    return None
            # (Else some slot grew: the slots differ and none is lower.)
        total = self._totals.get(info.key)
        if total is None:
            total = self._totals[info.key] = [0] * layout.HIST_SLOTS
        total[:] = map(operator.add, total, inc)
        self._shown.pop(info.key, None)
        return inc

    def read(self) -> int:
        """Reads every process's slots; returns how many entries the kernel's map holds (what
        map_sizes() would otherwise count with a system call per entry)."""
        hist = self.probe.read_hist()
        latest = self.processes.latest
        # Summed per container, then into the rollups once per container: thousands of processes'
        # histograms grow at every flush, in a handful of containers. The growths are collected
        # and summed slot by slot at the end, in C (map(sum, zip(...))), rather than added one by
        # one into a running sum. (Keyed by length too: zip() would cut longer slots short.)
        growth: dict[tuple[Where, int], list[list[int]]] = {}
        for tgid, slots in hist.items():
            holder = latest(tgid)
            if holder is None:
                continue
            inc = self._increase(holder, tgid, slots)
            if inc is None:
                continue
            where = (holder.namespace, holder.pod, holder.container)  # (holder.where, without its call)
            incs = growth.get((where, len(inc)))
            if incs is None:
                growth[(where, len(inc))] = [inc]
            else:
                incs.append(inc)
        for (where, _), incs in growth.items():
            self.rollups.add_blocks(where, list(map(sum, zip(*incs, strict=True))) if len(incs) > 1 else incs[0])
        return len(hist)

    def take(self, tgid: int, owner: ProcessInfo | None) -> None:
        """Takes `tgid`'s slots out of the kernel (its process is gone, or replaced by a new one
        with its pid): what they hold since the last read is `owner`'s, if it is still shown."""
        slots = self.probe.take_hist(tgid)
        if owner is not None:
            self.add(owner, tgid, slots)
        self._read.pop(tgid, None)

    def forget(self, keys: Iterable[ProcessKey]) -> None:
        for key in keys:
            self._totals.pop(key, None)
            self._shown.pop(key, None)
