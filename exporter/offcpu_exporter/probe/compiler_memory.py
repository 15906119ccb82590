"""Giving back the memory bcc's compiler used, once the probe is loaded.

bcc compiles the probe with clang and LLVM inside this process. Afterwards the exporter never
runs the compiler again, yet (measured on Debian 12, bcc 0.26, LLVM 14):
- glibc keeps ~40 MB of the compiler's freed heap mapped: ``malloc_trim`` returns it;
- ~74 MB of libLLVM's and libclang-cpp's code pages stay resident in the exporter and count in
  its RSS (and in a container's memory usage). ``MADV_PAGEOUT`` (Linux 5.4+,
  https://man7.org/linux/man-pages/man2/madvise.2.html) reclaims them: clean file pages are simply
  dropped, and should the code run again it is read back from the file. It never discards data,
  so it is safe on any mapping; it is applied to the compiler libraries' code only.
"""

from __future__ import annotations

import ctypes
import logging
import re

from offcpu_exporter.heap import trim
from offcpu_exporter.symbols.proc_maps import parse_maps

__all__ = ["release_compiler_memory"]

log = logging.getLogger(__name__)

MADV_PAGEOUT = 21
_COMPILER_LIBRARY = re.compile(r"/lib(LLVM|clang-cpp|clang)[-.][^/]*$")


def compiler_code_mappings(maps_text: str) -> list[tuple[int, int]]:
    """(start, end) of the executable mappings of the LLVM and clang libraries."""
    return [(m.start, m.end) for m in parse_maps(maps_text) if _COMPILER_LIBRARY.search(m.path)]


def release_compiler_memory(maps_path: str = "/proc/self/maps") -> int:
    """Trims the heap and pages the compiler's code out; returns the bytes of code advised."""
    trim()
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        with open(maps_path) as f:
            ranges = compiler_code_mappings(f.read())
    except OSError as exc:
        log.debug("cannot read %s: %s", maps_path, exc)
        return 0
    madvise = libc.madvise
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    advised = 0
    for start, end in ranges:
        if madvise(start, end - start, MADV_PAGEOUT) != 0:
            # EINVAL before Linux 5.4: the pages just stay resident.
            log.debug("madvise(MADV_PAGEOUT) of the compiler's code: errno %d", ctypes.get_errno())
            return advised
        advised += end - start
    return advised
