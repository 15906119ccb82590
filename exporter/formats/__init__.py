"""Profile formats for people and their tools, rendered from the samples of a time window.

`window(before, after)` turns two snapshots into the per-stack values between them (cumulative
totals subtracted); `render(fmt, profile)` encodes them. Encoders are pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from exporter.snapshot import ZERO, Counter, ProcessInfo, ProcessKey, Snapshot, StackSample

__all__ = ["FORMATS", "Profile", "render", "window"]


@dataclass(frozen=True)
class Profile:
    start_ns: int
    end_ns: int
    processes: Mapping[ProcessKey, ProcessInfo]
    rows: tuple[tuple[StackSample, Counter], ...]  # each sample with its value in the window

    @property
    def total(self) -> Counter:
        return sum((v for _, v in self.rows), ZERO)


def window(before: Snapshot | None, after: Snapshot) -> Profile:
    """The samples of `after` with their growth since `before` (all of it when before is None)."""
    base: dict[tuple[object, ...], Counter] = {}
    if before is not None:
        for s in before.samples:
            base[(s.process, s.tid, s.reason, s.stack)] = s.total
    rows = []
    for s in after.samples:
        value = s.total - base.get((s.process, s.tid, s.reason, s.stack), ZERO)
        if value.count > 0 or value.ns > 0:
            rows.append((s, value))
    start = before.time_ns if before is not None else after.start_time_ns
    return Profile(start, after.time_ns, MappingProxyType({k: v.info for k, v in after.processes.items()}),
                   tuple(rows))


def _folded(profile: Profile) -> bytes:
    from exporter.formats.folded import render_folded

    return render_folded(profile).encode()


def _text(profile: Profile) -> bytes:
    from exporter.formats.text import render_text

    return render_text(profile).encode()


FORMATS: dict[str, Callable[[Profile], bytes]] = {"folded": _folded, "text": _text}


def render(fmt: str, profile: Profile) -> bytes:
    try:
        encoder = FORMATS[fmt]
    except KeyError:
        raise ValueError(f"unknown format {fmt!r}; use one of {', '.join(sorted(FORMATS))}") from None
    return encoder(profile)
