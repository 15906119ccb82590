"""Histograms: per-process totals and the rollups' growth, against a plain model of the increases
(the kernel's cumulative slots per tgid; a lower slot means the entry was re-created)."""

from __future__ import annotations

import random

from offcpu_exporter.histograms import Histograms
from offcpu_exporter.probe import layout
from offcpu_exporter.rollup import Rollups
from offcpu_exporter.snapshot import ProcessInfo, ProcessKey, Where

SLOTS = layout.HIST_SLOTS
WHERES: list[Where] = [("", "", ""), ("ns", "a", "c"), ("ns", "b", "c")]


class _Probe:
    def __init__(self) -> None:
        self.hist: dict[int, list[int]] = {}

    def read_hist(self) -> dict[int, list[int]]:
        return {tgid: list(slots) for tgid, slots in self.hist.items()}

    def take_hist(self, tgid: int) -> list[int]:
        return self.hist.pop(tgid, [0] * SLOTS)


class _Table:
    def __init__(self) -> None:
        self.holders: dict[int, ProcessInfo] = {}

    def latest(self, tgid: int) -> ProcessInfo | None:
        return self.holders.get(tgid)


class _Model:
    """The increases, summed the plain way."""

    def __init__(self) -> None:
        self.read: dict[int, list[int]] = {}
        self.totals: dict[ProcessKey, list[int]] = {}
        self.everything = [0] * SLOTS
        self.containers: dict[Where, list[int]] = {}

    def add(self, info: ProcessInfo, tgid: int, slots: list[int]) -> None:
        last = self.read.get(tgid)
        self.read[tgid] = slots
        inc = slots if last is None else [a - b for a, b in zip(slots, last, strict=True)]
        if min(inc) < 0:
            inc = slots
        if not any(inc):
            return
        for into in (self.totals.setdefault(info.key, [0] * SLOTS), self.everything,
                     self.containers.setdefault(info.where, [0] * SLOTS)):
            into[:] = [a + b for a, b in zip(into, inc, strict=True)]


def test_totals_and_growth_match_the_plain_sums_through_resets_replacements_and_pid_reuse() -> None:
    for seed in range(60):
        rng = random.Random(seed)
        probe, table, rollups, model = _Probe(), _Table(), Rollups(), _Model()
        histograms = Histograms(probe, table, rollups)  # type: ignore[arg-type]
        born = 0
        for _ in range(30):
            for tgid in range(1, 10):
                if tgid not in table.holders or rng.random() < 0.03:  # a new process holds the pid
                    born += 1
                    table.holders[tgid] = ProcessInfo(ProcessKey(tgid, born), "p", namespace=WHERES[born % 3][0],
                                                      pod=WHERES[born % 3][1], container=WHERES[born % 3][2])
                r = rng.random()
                if r < 0.05 and tgid in probe.hist:  # the kernel entry re-created: lower slots
                    probe.hist[tgid] = [rng.randrange(0, 2) for _ in range(SLOTS)]
                elif r < 0.1:  # taken out (exit or replacement), with what grew since the last read
                    probe.hist.setdefault(tgid, [0] * SLOTS)[rng.randrange(SLOTS)] += 1
                    owner = table.holders[tgid] if rng.random() < 0.7 else None
                    slots = list(probe.hist.get(tgid, [0] * SLOTS))
                    histograms.take(tgid, owner)
                    if owner is not None:
                        model.add(owner, tgid, slots)
                    model.read.pop(tgid, None)
                elif r < 0.6:
                    probe.hist.setdefault(tgid, [0] * SLOTS)[rng.randrange(SLOTS)] += rng.randrange(1, 4)
            for tgid, slots in probe.read_hist().items():
                model.add(table.holders[tgid], tgid, slots)
            histograms.read()
            for key, total in model.totals.items():
                assert histograms.get(key) == tuple(total), seed
            assert rollups.everything().histogram == tuple(model.everything), seed
            shown = rollups.containers(WHERES)
            for where, total in model.containers.items():
                assert shown[where].histogram == tuple(total), seed
