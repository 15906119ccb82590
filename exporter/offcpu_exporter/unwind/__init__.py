"""User-stack unwinding for code built without frame pointers: DWARF CFI tables built in user space
and walked by the BPF program (bpf/unwind.h). See docs/unwinding.md.

- :mod:`.cfi`, :mod:`.table`, :mod:`.objects`: one ELF object's CFI -> a compact table;
- :mod:`.cache`: tables by build id, in memory and on disk;
- :mod:`.unwinder`: per process, its mappings -> (table, load bias), written into the maps
  (:mod:`.kernel`) of a loaded program compiled with :mod:`.source`.
"""

from offcpu_exporter.unwind.bpf_maps import UnwindMaps
from offcpu_exporter.unwind.cache import TableCache
from offcpu_exporter.unwind.source import UnwindConfig, bpf_text
from offcpu_exporter.unwind.unwinder import MappingUnwind, Unwinder

__all__ = ["MappingUnwind", "TableCache", "UnwindConfig", "UnwindMaps", "Unwinder", "bpf_text"]
