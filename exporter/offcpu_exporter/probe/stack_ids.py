"""Stack ids as the BPF program computes them (store_stack() in bpf/offcpu.bpf.c): a 64-bit hash of
the frames, so that user space can store a stack under the id the kernel would give the same
frames (blocks seeded with stacks read from /proc: blocked_stacks.py)."""

from __future__ import annotations

from collections.abc import Sequence

from offcpu_exporter.probe import layout

__all__ = ["stack_id"]

_MASK = (1 << 64) - 1


def stack_id(frames: Sequence[int]) -> int:
    """The id of these frames (leaf first): layout.STACK_EMPTY for none, else the hash, moved above
    the reserved ids as the kernel moves it."""
    frames = frames[: layout.MAX_DEPTH]
    n = len(frames)
    if n == 0:
        return layout.STACK_EMPTY
    h = 0x9E3779B97F4A7C15 ^ n
    for ip in frames:
        h ^= ip & _MASK
        h = (h * 0xFF51AFD7ED558CCD) & _MASK
        h ^= h >> 33
    if h < layout.STACK_RESERVED:
        h += layout.STACK_RESERVED
    return h
