"""The kernel's switch record as a truth (testkit/switch_trace.py): blocks are read from a thread's
alternating switch-outs and switch-ins, clipped to a window for time, counted where they end."""

from __future__ import annotations

import pytest

from testkit.switch_trace import Switch, SwitchTrace

TID, OTHER = 7, 8


def _trace(*events: tuple[int, int, int]) -> SwitchTrace:
    trace = SwitchTrace(comm="w")
    trace.switches = [Switch(ts, prev, "S", nxt) for ts, prev, nxt in events]
    return trace


def test_time_off_cpu_is_clipped_to_the_window_and_blocks_counted_where_they_end() -> None:
    # In at 0 (no switch-out before: no block), out 10 -> in 30, out 50 -> in 100, out 120 (never back).
    trace = _trace((0, OTHER, TID), (10, TID, OTHER), (30, OTHER, TID), (50, TID, OTHER), (100, OTHER, TID),
                   (120, TID, OTHER))
    assert trace.off_cpu(TID, 0, 200) == 20 + 50
    assert trace.off_cpu(TID, 20, 60) == 10 + 10
    assert trace.blocks_ending(TID, 20, 60) == 1  # the one ending at 30; the other ends at 100
    assert trace.blocks_ending(TID, 0, 200) == 2
    assert trace.off_cpu(OTHER, 0, 200) == 10 + 20 + 20  # its mirror image


@pytest.mark.parametrize("events", [
    ((10, TID, OTHER), (20, TID, OTHER)),
    ((10, OTHER, TID), (20, OTHER, TID)),
])
def test_a_record_whose_switches_do_not_alternate_is_refused(events: tuple[tuple[int, int, int], ...]) -> None:
    with pytest.raises(AssertionError, match="twice"):
        _trace(*events).off_cpu(TID, 0, 100)
