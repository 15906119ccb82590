"""Opening files as a watched process sees them, without escaping its root.

A container's files are reachable through ``/proc/PID/root``, but the kernel resolves an absolute
symlink found under that prefix against *our* root, not the container's: ``/proc/PID/root/lib/x``
where ``lib`` is a symlink to ``/etc`` would open the host's ``/etc/x``. So paths are walked one
component at a time with ``lstat``/``readlink``, symlinks re-anchored at the process's root and
``..`` clamped there (the semantics of openat2's RESOLVE_IN_ROOT, which Python does not expose).
"""

from __future__ import annotations

import os
import stat

__all__ = ["resolve_in_root"]

_MAX_SYMLINKS = 40  # the kernel's own limit (MAXSYMLINKS)


def resolve_in_root(root: str, path: str) -> str | None:
    """Return ``root`` + the fully resolved ``path`` interpreted inside ``root``, or None when the
    path does not exist, loops, or is not a regular file at the end."""
    pending = [c for c in path.split("/") if c]
    pending.reverse()  # a stack: next component last
    resolved: list[str] = []
    hops = 0
    while pending:
        part = pending.pop()
        if part == ".":
            continue
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        candidate = root + "/" + "/".join([*resolved, part])
        try:
            st = os.lstat(candidate)
        except (OSError, ValueError):
            return None
        if stat.S_ISLNK(st.st_mode):
            hops += 1
            if hops > _MAX_SYMLINKS:
                return None
            try:
                target = os.readlink(candidate)
            except (OSError, ValueError):
                return None
            if target.startswith("/"):
                resolved = []
            parts = [c for c in target.split("/") if c]
            pending.extend(reversed(parts))
            continue
        resolved.append(part)
    full = root + "/" + "/".join(resolved)
    try:
        if not stat.S_ISREG(os.stat(full).st_mode):
            return None
    except (OSError, ValueError):
        return None
    return full
