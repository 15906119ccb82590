"""Pure encoders: snapshots and profiles in the formats people and backends read; none does I/O.

For people and their tools: pprof, folded stacks, a text report like bcc's offcputime and a
self-contained HTML flame graph. Each takes a `Profile` (off-CPU time per stack over one interval,
built from snapshots by `Profile.between(before, after)` or `Profile.over(snapshots)`) and returns
bytes; `render(fmt, profile)` picks one by name. For backends: `otlp_profiles` (OTLP profiles
requests), `skywalking` (`EBPFProfilingData` messages) and `delimited` (their framing in a file),
imported only by the outputs that use them (they load protobuf). `proto/` holds the schemas.
"""

from __future__ import annotations

from collections.abc import Callable

from offcpu_exporter.formats import flamegraph, folded, pprof, text
from offcpu_exporter.formats.profile import Accumulator, Profile, ProfileFilter, ProfileSample

__all__ = ["FORMATS", "Accumulator", "Profile", "ProfileFilter", "ProfileSample", "render"]

_ENCODERS: dict[str, Callable[[Profile], bytes]] = {
    "pprof": pprof.encode,
    "folded": folded.encode,
    "html": flamegraph.encode,
    "text": text.encode,
}
FORMATS: tuple[str, ...] = tuple(_ENCODERS)


def render(fmt: str, profile: Profile) -> bytes:
    """The profile in format `fmt` (one of FORMATS); ValueError for an unknown format."""
    encoder = _ENCODERS.get(fmt)
    if encoder is None:
        raise ValueError(f"unknown profile format {fmt!r} (choose from {', '.join(FORMATS)})")
    return encoder(profile)
