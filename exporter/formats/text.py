"""The top stacks as text, like bcc's offcputime: kernel frames leaf first, `--`, user frames leaf
first, then the process and the total off-CPU microseconds; smallest first, biggest last."""

from __future__ import annotations

from exporter.formats import Profile
from exporter.snapshot import ZERO, Counter

__all__ = ["render_text"]


def render_text(profile: Profile, top: int = 100) -> str:
    merged: dict[tuple[object, ...], Counter] = {}
    for sample, value in profile.rows:
        key = (sample.process, sample.stack)
        merged[key] = merged.get(key, ZERO) + value
    ranked = sorted(merged.items(), key=lambda kv: kv[1].ns)[-top:]
    out = []
    for (pkey, stack), value in ranked:
        info = profile.processes.get(pkey)  # type: ignore[call-overload]
        comm = info.comm if info else "?"
        for frame in stack.kernel:  # type: ignore[attr-defined]
            out.append(f"    {frame.name}")
        out.append("    --")
        for frame in stack.user:  # type: ignore[attr-defined]
            out.append(f"    {frame.name}")
        out.append(f"    -                {comm} ({pkey.pid})")  # type: ignore[attr-defined]
        out.append(f"        {value.ns // 1000} us, {value.count} switches\n")
    total = profile.total
    out.append(f"total: {total.ns // 1000} us off CPU in {total.count} switches, {len(merged)} stacks")
    return "\n".join(out) + "\n"
