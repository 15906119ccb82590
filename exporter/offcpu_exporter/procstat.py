"""/proc/PID/stat: a process's name, parent and start time. The start time (clock ticks after
boot) is what tells two processes that held the same pid apart."""

from __future__ import annotations

__all__ = ["parse_stat", "start_ticks"]


def parse_stat(text: str) -> tuple[str, int, int]:
    """(comm, ppid, start ticks) from /proc/PID/stat. comm may hold spaces and parentheses:
    it runs from the first '(' to the last ')'."""
    lpar, rpar = text.index("("), text.rindex(")")
    comm = text[lpar + 1 : rpar]
    fields = text[rpar + 2 :].split()
    # fields[0] is field 3 (state); ppid is field 4, starttime field 22.
    return comm, int(fields[1]), int(fields[19])


def start_ticks(pid: int, proc_root: str = "/proc") -> int | None:
    """When the process holding `pid` now started; None if there is none."""
    try:
        with open(f"{proc_root}/{pid}/stat", encoding="utf-8", errors="replace") as f:
            return parse_stat(f.read())[2]
    except (OSError, ValueError, IndexError):
        return None
