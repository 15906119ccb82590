"""A symbolizer for aggregator tests: every address named after itself (k<hex> kernel, u<hex> user),
with the Symbolizer protocol's bookkeeping as no-ops."""

from __future__ import annotations

from offcpu_exporter.snapshot import Frame, FrameKind


class Names:
    failures = 0

    def kernel(self, addresses):  # type: ignore[no-untyped-def]
        return tuple(Frame(f"k{a:x}", FrameKind.KERNEL) for a in addresses)

    def user(self, pid, addresses):  # type: ignore[no-untyped-def]
        return tuple(Frame(f"u{a:x}") for a in addresses)

    def prepare(self, pid: int) -> None:
        pass

    def generation(self, pid: int) -> int:
        return 0

    def refresh(self, pid: int) -> int:
        self.refreshes = getattr(self, "refreshes", 0) + 1
        return self.generation(pid)

    def forget(self, pid: int) -> None:
        pass
