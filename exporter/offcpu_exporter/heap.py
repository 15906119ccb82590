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
import os
import threading

__all__ = ["limit_arenas", "resident_bytes", "trim", "trim_if_grown"]

_M_ARENA_MAX = -8
_M_MMAP_THRESHOLD = -3
# How much the resident set may grow before the heap is trimmed. A trim walks every free chunk and
# madvise()s each free page run, the same runs again each time: run after every flush, it was ~9% of
# the exporter's busy time at 2,000 processes, mostly for pages already given back.
TRIM_THRESHOLD = 4 << 20
_PAGE = os.sysconf("SC_PAGE_SIZE")


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


def resident_bytes() -> int:
    """This process's resident set (the second field of /proc/self/statm), 0 if unreadable."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


_lock = threading.Lock()
_resident_after_trim = 0


def trim_if_grown(threshold: int = TRIM_THRESHOLD) -> bool:
    """trim() when the resident set grew by `threshold` since the last trim; returns whether it
    trimmed. Growth that is live data stays after the trim and becomes the new baseline, so it does
    not cause a trim at every call."""
    global _resident_after_trim
    with _lock:
        resident = resident_bytes()
        if resident and resident - _resident_after_trim < threshold:
            # Given back meanwhile (whole mappings freed): growth counts from the lowest point.
            _resident_after_trim = min(_resident_after_trim, resident)
            return False
        trim()
        _resident_after_trim = resident_bytes()
        return True
