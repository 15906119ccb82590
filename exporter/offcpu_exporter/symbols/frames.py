"""The frames the symbolizer hands out for what it cannot name, and the pseudo-modules it names."""

from __future__ import annotations

from offcpu_exporter.snapshot import Frame, FrameKind

__all__ = ["JIT_MODULE", "UNKNOWN", "VDSO", "placeholder"]

UNKNOWN = Frame("[unknown]", FrameKind.PLACEHOLDER)
JIT_MODULE = "[jit]"
VDSO = "[vdso]"


def placeholder(module: str, offset: int, build_id: str = "") -> Frame:
    """``[unknown] libfoo.so+0x1a2b``: module, file offset and build id kept for later symbolization."""
    if not module:
        return UNKNOWN
    base = module.rsplit("/", 1)[-1]
    return Frame(f"[unknown] {base}+0x{offset:x}", FrameKind.PLACEHOLDER, module, offset, build_id)
