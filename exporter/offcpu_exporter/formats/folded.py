"""Profile -> folded stacks, the input of flamegraph.pl, speedscope, inferno and friends.

One line per distinct stack: ``comm;user root..leaf;kernel entry..leaf <microseconds>``
(the order of bcc's ``offcputime -f``). A row with a waker (--wakers on) is in bcc
``offwaketime -f``'s layout: the blocked stack as above, a ``--`` frame, then the waker's stack
leaf first (kernel, then user) and last the waker's comm (or ``[timer]``, ``[softirq]``,
``[interrupt]`` for a wake-up from interrupt context). Rows that fold to the same line (other threads, other
reasons) are merged. Values are whole microseconds, rounded per process with the largest
remainder method so that each process's lines add up to exactly its total off-CPU time in
microseconds (rounded) instead of drifting by one per line.
"""

from __future__ import annotations

from collections.abc import Iterable

from offcpu_exporter.formats.profile import Profile
from offcpu_exporter.snapshot import ProcessKey, Waker

__all__ = ["apportion", "encode", "lines", "parse", "waker_frames"]


def apportion(ns_values: list[int], unit_ns: int = 1000) -> list[int]:
    """Rounds each value to whole units so that the rounded values add up to the rounded sum."""
    target = (sum(ns_values) + unit_ns // 2) // unit_ns
    floors = [v // unit_ns for v in ns_values]
    short = target - sum(floors)
    by_remainder = sorted(range(len(ns_values)), key=lambda i: (-(ns_values[i] % unit_ns), i))
    for i in by_remainder[:short]:
        floors[i] += 1
    return floors


def lines(profile: Profile) -> list[tuple[str, int]]:
    """(folded stack, microseconds) pairs, largest first; lines that round to 0 us are left out."""
    per_process: dict[ProcessKey, dict[str, int]] = {}
    for s in profile.samples:
        folded = s.stack.folded(s.process.comm.replace(";", ":"))
        if s.waker is not None:
            folded = f"{folded};{waker_frames(s.waker)}"
        rows = per_process.setdefault(s.process.key, {})
        rows[folded] = rows.get(folded, 0) + s.value.ns
    merged: dict[str, int] = {}
    for rows in per_process.values():
        stacks = list(rows)
        for folded, us in zip(stacks, apportion([rows[k] for k in stacks]), strict=True):
            merged[folded] = merged.get(folded, 0) + us
    return sorted(((k, v) for k, v in merged.items() if v > 0), key=lambda kv: (-kv[1], kv[0]))


def waker_frames(waker: Waker) -> str:
    """`--`, the waker's frames leaf first, its name: what offwaketime puts after a blocked stack."""
    parts = ["--", *(f.name.replace(";", ":") for f in waker.leaf_to_root()), waker.name.replace(";", ":")]
    return ";".join(parts)


def encode(profile: Profile) -> bytes:
    return "".join(f"{stack} {us}\n" for stack, us in lines(profile)).encode("utf-8", "surrogateescape")


def parse(text: str) -> Iterable[tuple[list[str], int]]:
    """Reads folded lines back (frames root first, value); the inverse of `encode`."""
    for line in text.splitlines():
        if not line.strip():
            continue
        stack, _, value = line.rpartition(" ")
        yield stack.split(";"), int(value)
