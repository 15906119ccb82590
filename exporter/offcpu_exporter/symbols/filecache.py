"""Symbol files cached by file identity (:data:`FileKey`), shared by every process mapping the
file, bounded (LRU) and dropped when the last process using them is released."""

from __future__ import annotations

from collections import OrderedDict

from offcpu_exporter.symbols.mapped import FileKey
from offcpu_exporter.symbols.symbolfile import SymbolFile

__all__ = ["SymbolFileCache"]

_UNUSABLE = "unusable"  # value for a file that is not a usable ELF image


class SymbolFileCache:
    """FileKey -> SymbolFile (or "not usable"), with the pids using each entry."""

    def __init__(self, max_files: int) -> None:
        self._max_files = max(1, max_files)
        self._files: OrderedDict[FileKey, SymbolFile | str] = OrderedDict()
        self._users: dict[FileKey, set[int]] = {}
        self._keys: dict[int, set[FileKey]] = {}  # of each pid, what it uses

    def __len__(self) -> int:
        return len(self._files)

    def __contains__(self, key: FileKey) -> bool:
        """Whether `key` was loaded (usable or not) and is still cached."""
        return key in self._files

    def get(self, key: FileKey, pid: int) -> SymbolFile | None:
        """The cached symbols of `key`, now used by `pid`; None if not cached or not usable."""
        entry = self._files.get(key)
        if entry is None:
            return None
        self._files.move_to_end(key)
        self._use(key, pid)
        return entry if isinstance(entry, SymbolFile) else None

    def store(self, key: FileKey, value: SymbolFile | None, pid: int) -> None:
        """Cache what was loaded for `key` (None: not usable), used by `pid`."""
        self._files[key] = _UNUSABLE if value is None else value
        self._files.move_to_end(key)
        self._use(key, pid)
        while len(self._files) > self._max_files:
            self._files.popitem(last=False)  # reloaded from its path if a process still needs it

    def release(self, pid: int) -> None:
        """`pid` uses nothing any more: drop the entries no other process uses."""
        for key in self._keys.pop(pid, ()):
            users = self._users.get(key)
            if users is None:
                continue
            users.discard(pid)
            if not users:
                del self._users[key]
                self._files.pop(key, None)

    def _use(self, key: FileKey, pid: int) -> None:
        keys = self._keys.setdefault(pid, set())
        if key not in keys:
            keys.add(key)
            self._users.setdefault(key, set()).add(pid)
