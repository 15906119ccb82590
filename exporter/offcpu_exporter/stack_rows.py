"""The per-stack table the aggregator keeps: per (process, thread, reason, stack), the total since
start, the increase counted for the snapshot being made, and the sample the last snapshot showed.

One record per row holds all three, so that counting an increase is one lookup of its key and a
snapshot reads every row without looking anything up: a row key hashes a ProcessKey and a Stack,
each with a Python-level __hash__, and with a dict for each of the three a changed row was hashed
seven times per flush (thousands of processes, each changed at every flush).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from offcpu_exporter.snapshot import ZERO, Counter, ProcessKey, Reason, Stack, StackSample, Waker

__all__ = ["RowKey", "StackRows"]

RowKey = tuple[ProcessKey, int, Reason, Stack, Waker | None]  # (process, tid or 0, reason, stack, waker)


class _Row:
    __slots__ = ("counted", "increase", "sample", "total")

    def __init__(self) -> None:
        self.total = ZERO
        self.increase = ZERO  # what snapshot `counted` holds of it
        self.counted = -1  # the snapshot whose increase `increase` is
        self.sample: StackSample | None = None  # as the last snapshot showed it


class StackRows:
    def __init__(self) -> None:
        self._rows: dict[RowKey, _Row] = {}
        self._next = 1  # the snapshot that increases counted now go to

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, key: RowKey, inc: Counter) -> None:
        """An increase of `key`, into its total and into the next snapshot's increase."""
        row = self._rows.get(key)
        if row is None:
            row = self._rows[key] = _Row()
        row.total = row.total + inc
        if row.counted == self._next:
            row.increase = row.increase + inc
        else:
            row.increase, row.counted = inc, self._next

    def samples(self, thread_names: Mapping[tuple[int, int], str]) -> list[StackSample]:
        """Every row as the next snapshot shows it (a sample is made again only for a row whose
        total changed, or that had an increase in this snapshot or the one before); what is counted
        after this goes to the snapshot after."""
        out = []
        now = self._next
        for key, row in self._rows.items():
            sample = row.sample
            increase = row.increase if row.counted == now else ZERO
            if sample is None or sample.total is not row.total or increase is not ZERO or sample.increase is not ZERO:
                pkey, tid, reason, stack, waker = key
                # (process, tid, thread_name, reason, stack, total, increase, waker): positional
                # arguments, a quarter quicker than keywords, for every changed row per flush.
                row.sample = sample = StackSample(
                    pkey, tid, thread_names.get((pkey.pid, tid), "") if tid else "", reason, stack, row.total, increase,
                    waker)
            out.append(sample)
        self._next += 1
        return out

    def forget(self, processes: Collection[ProcessKey]) -> None:
        """Drops every row of these processes."""
        for key in [k for k in self._rows if k[0] in processes]:
            del self._rows[key]
