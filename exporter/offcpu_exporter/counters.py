"""The kernel's cumulative counters as increases, and the drains that keep their map from filling.

The reference semantics: the kernel keeps cumulative counters per key; each flush computes the
increase against the value read at the previous flush. Unlike the reference, the map is drained so
it never fills silently:
- a key unchanged for `age_after` flushes is deleted with lookup-and-delete (its last value is
  accounted), and so are all unchanged keys once the map passes its high-water mark;
- a kernel entry that reads lower than before was deleted and re-created: its value is the increase.
"""

from __future__ import annotations

import functools
import logging
import operator
from dataclasses import dataclass

from offcpu_exporter.probe.maps import CounterKey, CounterValue, KernelMaps

__all__ = ["CounterDiff", "increase"]

log = logging.getLogger(__name__)


def increase(current: CounterValue, previous: CounterValue | None) -> CounterValue:
    """The increase of a cumulative kernel counter since the previous read. A value lower than
    the previous one means the entry was deleted and re-created in between: all of it is new."""
    if previous is None:
        return current
    # In C (map, min): this runs for every changed key of every flush.
    diff = tuple(map(operator.sub, current, previous))
    return current if min(diff) < 0 else _AS_COUNTER_VALUE(diff)


# CounterValue._make() without its Python frame (a classmethod call per changed key per flush).
_AS_COUNTER_VALUE = functools.partial(tuple.__new__, CounterValue)


@dataclass(slots=True)  # one per kernel key
class _KeyState:
    value: CounterValue
    idle: int = 0


class CounterDiff:
    """The last value read of each kernel key, and the keys' ages for the drains."""

    def __init__(self, probe: KernelMaps, *, age_after: int, high_water: float) -> None:
        self.probe = probe
        self.age_after = age_after  # flushes a kernel key may stay unchanged before it is drained
        self.high_water = high_water  # counts-map fill at which every unchanged key is drained
        self._keys: dict[CounterKey, _KeyState] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def stack_ids(self) -> set[int]:
        """Every stack id a known key names (the stack map must keep them)."""
        ids = {k.user_stack for k in self._keys} | {k.kernel_stack for k in self._keys}
        if not self.probe.config.wakers:
            return ids
        wakers = {k.waker for k in self._keys} - {None}
        return ids | {w.user_stack for w in wakers if w} | {w.kernel_stack for w in wakers if w}

    def diff(self, rows: list[tuple[CounterKey, CounterValue]]) -> list[tuple[CounterKey, CounterValue]]:
        """The increases of `rows` (every key the kernel holds) since the last read, and of the keys
        drained now."""
        changed: list[tuple[CounterKey, CounterValue]] = []
        unchanged: list[CounterKey] = []
        known = self._keys
        sub = operator.sub
        for key, value in rows:
            state = known.get(key)
            if state is None:
                known[key] = state = _KeyState(value)
                inc = value
            elif value == state.value:  # most keys at a flush (compared in C, no increase built)
                state.idle += 1
                unchanged.append(key)
                continue
            else:
                # increase(), inlined: it runs for every changed key (of every process) per flush.
                diff = tuple(map(sub, value, state.value))
                state.value = value
                if min(diff) >= 0:  # (then some figure grew: the values differ)
                    changed.append((key, _AS_COUNTER_VALUE(diff)))
                    state.idle = 0
                    continue
                inc = value  # deleted and re-created since
            if any(inc):
                changed.append((key, inc))
                state.idle = 0
            else:
                state.idle += 1
                unchanged.append(key)
        if len(known) > len(rows):
            # Keys we knew that the kernel no longer has (deleted behind our back): forget them.
            seen = {key for key, _ in rows}
            for key in [k for k in known if k not in seen]:
                del known[key]
        changed.extend(self._drain(len(rows), [k for k, _ in rows], unchanged))
        return changed

    def _drain(self, entries: int, keys: list[CounterKey],
               unchanged: list[CounterKey]) -> list[tuple[CounterKey, CounterValue]]:
        cap = self.probe.config.max_counts
        if entries >= self.high_water * cap:
            victims = unchanged
            if entries - len(victims) >= self.high_water * cap:
                # Everything is busy: drain it all; the kernel re-creates keys on the next switch.
                victims = keys
            log.info("counts map at %d/%d entries: draining %d keys", entries, cap, len(victims))
        else:
            victims = [key for key in unchanged if self._keys[key].idle >= self.age_after]
        if not victims:
            return []
        return self._take(victims)

    def take_process(self, tgid: int) -> list[tuple[CounterKey, CounterValue]]:
        """Takes every key of `tgid` out of the kernel: the increases since the last read."""
        return self._take([k for k in self._keys if k.tgid == tgid])

    def _take(self, keys: list[CounterKey]) -> list[tuple[CounterKey, CounterValue]]:
        taken = []
        final = self.probe.take_counts(keys)
        for key in keys:
            state = self._keys.pop(key, None)
            value = final.get(key)
            if value is not None and state is not None:
                inc = increase(value, state.value)
                if any(inc):
                    taken.append((key, inc))
        return taken
