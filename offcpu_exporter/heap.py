"""Keeping the exporter's resident memory to what it uses.

glibc's allocator keeps the memory a process once had: freed blocks stay mapped for reuse, and each
thread that allocates gets an arena of its own (up to 8 per core), whose free memory the others
never reuse. A flush, a symbol table read, or a burst of work on the web server's threads would
each leave their peak behind in the RSS a container limit counts. So: few arenas, and the free
memory given back after the work that makes it (malloc_trim(3), mallopt(3) M_ARENA_MAX and
M_MMAP_THRESHOLD).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools

__all__ = ["limit_arenas", "trim"]

_M_ARENA_MAX = -8
_M_MMAP_THRESHOLD = -3


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None)


def limit_arenas(arenas: int = 2, mmap_threshold: int = 128 << 10) -> bool:
    """Before threads are started: at most `arenas` malloc arenas for the whole process, and blocks
    from `mmap_threshold` bytes on always in mappings of their own (returned whole when freed;
    glibc otherwise raises the threshold to the largest block freed, and a table or a map read of
    a few MB then stays in the heap for good)."""
    try:
        libc = _libc()
        return bool(libc.mallopt(_M_ARENA_MAX, arenas)) and bool(libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold))
    except AttributeError:  # not glibc
        return False


def trim() -> None:
    """Give the allocator's free memory back to the system."""
    with contextlib.suppress(AttributeError):
        _libc().malloc_trim(0)
