"""The symbol-file cache shared by all processes: an entry stays while a process using it is
known, goes with the last one, and the least recently used goes first when full."""

from __future__ import annotations

import os
import sys

from offcpu_exporter.symbols.filecache import SymbolFileCache
from offcpu_exporter.symbols.mapped import MappedFile
from offcpu_exporter.symbols.symbolfile import SymbolFile, load_mapped_file


def _python_symbols() -> SymbolFile:
    path = os.path.realpath(sys.executable)
    st = os.stat(path)
    sym = load_mapped_file(MappedFile((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns), path), path, "/", [])
    assert sym is not None
    return sym


def test_an_entry_goes_with_the_last_process_using_it() -> None:
    cache = SymbolFileCache(8)
    sym = _python_symbols()
    cache.store(("a",), sym, pid=1)
    assert cache.get(("a",), pid=2) is sym
    cache.release(1)
    assert ("a",) in cache and cache.get(("a",), pid=3) is sym
    cache.release(2)
    assert ("a",) in cache  # pid 3 still uses it
    cache.release(3)
    assert ("a",) not in cache and len(cache) == 0


def test_an_unusable_file_is_remembered_as_such() -> None:
    cache = SymbolFileCache(8)
    cache.store(("broken",), None, pid=1)
    assert ("broken",) in cache  # not loaded again
    assert cache.get(("broken",), pid=1) is None


def test_the_least_recently_used_entry_goes_first_when_full() -> None:
    cache = SymbolFileCache(2)
    sym = _python_symbols()
    cache.store(("a",), sym, pid=1)
    cache.store(("b",), sym, pid=1)
    cache.get(("a",), pid=1)
    cache.store(("c",), sym, pid=1)
    assert len(cache) == 2 and ("a",) in cache and ("c",) in cache and ("b",) not in cache
