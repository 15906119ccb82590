"""Folded stacks, as flamegraph.pl and speedscope read them:
`comm;user frames root..leaf;kernel frames entry..leaf <off-CPU microseconds>` per line."""

from __future__ import annotations

from exporter.formats import Profile

__all__ = ["parse_folded", "render_folded"]


def render_folded(profile: Profile) -> str:
    lines: dict[str, int] = {}
    for sample, value in profile.rows:
        info = profile.processes.get(sample.process)
        comm = (info.comm if info else "?").replace(";", ":").replace(" ", "_")
        line = sample.stack.folded(comm).replace("\n", " ")
        lines[line] = lines.get(line, 0) + value.ns
    return "".join(f"{line} {ns // 1000}\n" for line, ns in sorted(lines.items()) if ns // 1000 > 0)


def parse_folded(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.splitlines():
        stack, _, value = line.rpartition(" ")
        if stack:
            out[stack] = out.get(stack, 0) + int(value)
    return out
