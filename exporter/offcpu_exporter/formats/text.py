"""Profile -> the text report of bcc's ``offcputime``: one block per stack, kernel frames leaf
first, ``--``, user frames leaf first, then ``-  comm (pid)`` and the off-CPU microseconds.

As in bcc the largest stacks come last (nearest the prompt). Only the `top` largest stacks are
printed; a footer gives per-process totals and how many stacks were left out.
"""

from __future__ import annotations

from datetime import UTC, datetime

from offcpu_exporter.formats.profile import Profile, ProfileSample

__all__ = ["encode"]

DEFAULT_TOP = 50


def _timestamp(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}es" if word.endswith(("s", "ch")) else f"{n} {word}s"


def _block(s: ProfileSample) -> list[str]:
    out = [f"    {f.name}" for f in s.stack.kernel]
    out.append("    --")
    out.extend(f"    {f.name}" for f in s.stack.user)
    who = f"{s.process.comm} ({s.process.pid})"
    if s.tid:
        who += f" thread {s.thread_name or '?'} ({s.tid})"
    out.append(f"    {'-':<16} {who} [{s.reason.label}, {_plural(s.value.count, 'switch')}]")
    out.append(f"        {(s.value.ns + 500) // 1000}")
    out.append("")
    return out


def encode(profile: Profile, top: int = DEFAULT_TOP) -> bytes:
    seconds = profile.duration_ns / 1e9
    out = [
        f"Off-CPU time (us) by kernel + user stack, {seconds:.1f} s from {_timestamp(profile.start_ns)}"
        + (f" ({profile.description})" if profile.description else ""),
        "",
    ]
    ranked = sorted(profile.samples, key=lambda s: (-s.value.ns, s.process.pid, s.tid))
    shown = ranked[:top] if top > 0 else ranked
    for s in reversed(shown):
        out.extend(_block(s))
    totals = profile.totals_by_process()
    out.append(f"{_plural(len(totals), 'process')}, off-CPU total:")
    for key, total in sorted(totals.items(), key=lambda kv: -kv[1].ns):
        info = profile.processes[key]
        out.append(f"    {info.comm} ({info.pid}): {(total.ns + 500) // 1000} us, {_plural(total.count, 'switch')}")
    if len(shown) < len(ranked):
        out.append(f"{len(ranked) - len(shown)} smaller stacks not shown (of {len(ranked)}).")
    return ("\n".join(out) + "\n").encode("utf-8", "surrogateescape")
