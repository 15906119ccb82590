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
        if total is None and last is None and len(slots) == layout.HIST_SLOTS:
            # The kernel's slots are its total (see read()): kept as they are, the same list.
            self._totals[info.key] = slots
        else:
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
        read, totals, shown = self._read, self._totals, self._shown
        ge = operator.ge
        # Summed per container, then into the rollups once per container: thousands of processes'
        # histograms grow at every flush, in a handful of containers. A container's growth is the
        # sum of its processes' new slots less the sum of their slots read before, summed slot by
        # slot at the end in C (map(sum, zip(...))) rather than process by process. (Keyed by
        # length too: zip() would cut longer slots short.)
        grown: dict[tuple[Where, int], tuple[list[list[int]], list[list[int]]]] = {}
        for tgid, slots in hist.items():
            holder = latest(tgid)
            if holder is None:
                continue
            last = read.get(tgid)
            if last is not None and slots == last:
                continue  # (and the list read before stays: its identity is tested below)
            key = holder.key
            if totals.get(key) is last and last is not None and len(slots) == len(last) and all(map(ge, slots, last)):
                # Most processes: the total is the kernel's slots, which only grew (nothing was
                # counted for the process before this kernel entry, nor was it re-created): the
                # new slots are the new total, without an addition slot by slot.
                read[tgid] = totals[key] = slots
                shown.pop(key, None)
                fewer: list[int] | None = last
            else:
                inc = self._increase(holder, tgid, slots)
                if inc is None:
                    continue
                slots, fewer = inc, None
            where = (holder.namespace, holder.pod, holder.container)  # (holder.where, without its call)
            sums = grown.get((where, len(slots)))
            if sums is None:
                sums = grown[(where, len(slots))] = ([], [])
            sums[0].append(slots)
            if fewer is not None:
                sums[1].append(fewer)
        for (where, _), (more, less) in grown.items():
            growth = list(map(sum, zip(*more, strict=True))) if len(more) > 1 else more[0]
            if less:
                growth = list(map(operator.sub, growth, map(sum, zip(*less, strict=True))))
            self.rollups.add_blocks(where, growth)
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
