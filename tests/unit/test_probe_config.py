"""The stack maps' sizes and the id ranges the loader derives from ProbeConfig."""

from __future__ import annotations

import pytest

from offcpu_exporter.probe.loader import Probe, ProbeConfig, ProbeError


@pytest.mark.parametrize(("storage", "base", "spill"), [(1, 1, 1), (2, 2, 1), (100, 128, 25), (16384, 16384, 4096)])
def test_spill_ids_start_at_the_main_maps_bucket_count(storage: int, base: int, spill: int) -> None:
    # The kernel rounds a stack map's entries up to a power of two and hands out bucket indices.
    config = ProbeConfig(stack_storage=storage)
    assert (config.stack_spill_base, config.stack_spill_entries) == (base, spill)
    assert f"-DSTACK_SPILL_BASE={base}" in config.cflags("tracepoint")
    assert f"-DSTACK_SPILL={spill}" in config.cflags("tracepoint")
    assert ProbeConfig(stack_storage=storage, stack_spill=7).stack_spill_entries == 7
    assert config.stack_slot(base - 1) == ("stack_traces", base - 1)
    assert config.stack_slot(base) == ("stack_spill", 0)
    assert config.stack_slot(base + spill - 1) == ("stack_spill", spill - 1)


def test_stack_ids_past_32_bits_are_refused() -> None:
    with pytest.raises(ProbeError, match=r"stack storage size \d+ is too large"):
        Probe(ProbeConfig(stack_storage=1 << 31))
    Probe(ProbeConfig(stack_storage=1 << 30))  # 2^30 + 2^28 ids fit
