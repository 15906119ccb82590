"""Turning kernel and user stack addresses into frames.

``Symbolizer`` (:mod:`.symbolizer`) is the one entry point the pipeline uses. It never raises: an
address that cannot be named becomes a placeholder frame (``[unknown] libfoo.so+0x1a2b``, or
``[unknown]`` when no mapping holds it; :mod:`.frames`) and is counted in
:attr:`Symbolizer.failures`.

Where names come from:
- kernel: ``/proc/kallsyms`` (see :mod:`offcpu_exporter.symbols.kernel`);
- user (:mod:`.user`): the ELF files of the executable mappings in ``/proc/PID/maps``
  (:mod:`.process`, :mod:`.maps`), opened through ``/proc/PID/map_files/`` (the very file mapped,
  even when deleted or replaced) or else through ``/proc/PID/root`` (containers;
  :mod:`.mapped`), their ``.symtab``/``.dynsym`` or those of a separate debug file
  (:mod:`offcpu_exporter.symbols.debuginfo`, :mod:`.symbolfile`); the vDSO image read from the
  process's memory;
- JIT code: ``/tmp/perf-PID.map`` inside the process's root (:mod:`offcpu_exporter.symbols.perfmap`).

Symbol tables are cached by file identity (device, inode, size, mtime), shared by every process
mapping the file, bounded (LRU) and dropped when the last process using them is forgotten
(:mod:`.filecache`).
"""

from offcpu_exporter.symbols.frames import UNKNOWN
from offcpu_exporter.symbols.symbolizer import Symbolizer

__all__ = ["UNKNOWN", "Symbolizer"]
