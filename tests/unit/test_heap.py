"""The heap is trimmed when the resident set grew, not at every call (issue 27: the trim after
every flush was ~9% of the exporter's busy time at 2,000 processes)."""

from __future__ import annotations

import ctypes

from offcpu_exporter import heap

_BLOCK = 8 << 10  # below glibc's mmap threshold: from the heap, and kept there when freed
_BLOCKS = 3000  # 24 MB


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    return libc


def test_trims_only_after_the_resident_set_grew() -> None:
    libc = _libc()
    heap.trim_if_grown()  # the baseline
    assert not heap.trim_if_grown(), "nothing grew, nothing to trim"
    blocks = [libc.malloc(_BLOCK) for _ in range(_BLOCKS)]
    fence = libc.malloc(64)  # above them: the heap's top cannot shrink by itself when they are freed
    for block in blocks:
        ctypes.memset(block, 1, _BLOCK)  # resident
    for block in blocks:
        libc.free(block)
    grown = heap.resident_bytes()
    assert heap.trim_if_grown()
    assert grown - heap.resident_bytes() >= _BLOCK * _BLOCKS // 2, "the free memory went back"
    assert not heap.trim_if_grown()
    libc.free(fence)


def test_live_growth_does_not_trim_at_every_call() -> None:
    libc = _libc()
    heap.trim_if_grown()
    blocks = [libc.malloc(_BLOCK) for _ in range(_BLOCKS)]
    for block in blocks:
        ctypes.memset(block, 1, _BLOCK)
    assert heap.trim_if_grown()  # grew: trimmed once, and the live blocks are the new baseline
    assert not heap.trim_if_grown()
    for block in blocks:
        libc.free(block)
