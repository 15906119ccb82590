"""Executable mappings of a process, from ``/proc/PID/maps``."""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

__all__ = ["Mapping", "ProcessMaps", "parse_maps"]

_DELETED = " (deleted)"


@dataclass(frozen=True, slots=True)
class Mapping:
    start: int
    end: int
    offset: int  # file offset of `start`
    dev: str  # "major:minor" as printed (hex)
    inode: int
    path: str  # as the process sees it, " (deleted)" removed; "" for anonymous memory
    deleted: bool = False

    @property
    def is_file(self) -> bool:
        return self.inode != 0 and self.path.startswith("/")

    @property
    def map_files_name(self) -> str:
        return f"{self.start:x}-{self.end:x}"


def parse_maps(text: str) -> list[Mapping]:
    """The executable mappings in ``text`` (maps format), sorted by start; bad lines are skipped."""
    out: list[Mapping] = []
    for line in text.splitlines():
        mapping = _parse_line(line)
        if mapping is not None:
            out.append(mapping)
    out.sort(key=lambda m: m.start)
    return out


def _parse_line(line: str) -> Mapping | None:
    # start-end perms offset dev inode [path]; the path may contain spaces (it is the rest).
    fields = line.split(None, 5)
    if len(fields) < 5:
        return None
    span, perms, offset, dev, inode = fields[:5]
    if len(perms) < 3 or perms[2] != "x":
        return None
    start_s, sep, end_s = span.partition("-")
    try:
        start, end = int(start_s, 16), int(end_s, 16)
        file_offset = int(offset, 16)
        ino = int(inode)
    except ValueError:
        return None
    if not sep or start >= end or file_offset < 0 or ino < 0:
        return None
    path = fields[5].rstrip("\n") if len(fields) > 5 else ""
    deleted = path.endswith(_DELETED)
    if deleted:
        path = path[: -len(_DELETED)]
    return Mapping(start, end, file_offset, dev, ino, path, deleted)


class ProcessMaps:
    """Sorted executable mappings with a bisect lookup."""

    __slots__ = ("_starts", "mappings")

    def __init__(self, mappings: list[Mapping]) -> None:
        self.mappings = mappings
        self._starts = [m.start for m in mappings]

    def find(self, address: int) -> Mapping | None:
        i = bisect_right(self._starts, address) - 1
        if i >= 0:
            m = self.mappings[i]
            if address < m.end:
                return m
        return None
