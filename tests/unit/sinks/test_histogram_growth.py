"""A histogram's growth added slot by slot, as the folded process and the container groups add
it: the same as the plain loop for every shape (longer, shorter, reset slots)."""

from __future__ import annotations

import random

from offcpu_exporter.sinks.prometheus.top_series import _add_growth


def _plain(slots: list[int], now: tuple[int, ...], before: tuple[int, ...]) -> list[int]:
    out = list(slots) + [0] * max(0, len(now) - len(slots))
    for i, n in enumerate(now):
        out[i] += max(n - (before[i] if i < len(before) else 0), 0)
    return out


def test_growth_is_added_as_the_plain_loop_adds_it() -> None:
    rng = random.Random(27)
    for _ in range(2000):
        slots = [rng.randrange(100) for _ in range(rng.randrange(6))]
        before = tuple(rng.randrange(50) for _ in range(rng.randrange(6)))
        now = tuple(rng.randrange(60) for _ in range(rng.randrange(6)))
        expected = _plain(slots, now, before)
        _add_growth(slots, now, before)
        assert slots == expected, (now, before)
    unchanged = [1]
    _add_growth(unchanged, (3, 4, 5), (3, 4, 5))
    assert unchanged == [1, 0, 0]  # as long as the histogram, though nothing grew
