"""Describes processes to the unwinder in the background.

The first time an object is seen its CFI is parsed (0.4 s for libc, 1-2 s for python3.11, tens of
seconds for the largest objects): never on the flush thread. One worker thread takes the processes
to describe in order, and looks again every `refresh_seconds` at those it described, since a
process may map more code (dlopen) or exec; until a process is described its user stacks are
walked with frame pointers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

from offcpu_exporter import heap
from offcpu_exporter.unwind.build import allow_builds, cancel_builds
from offcpu_exporter.unwind.unwinder import Unwinder

__all__ = ["Describer"]

log = logging.getLogger(__name__)


class Describer:
    def __init__(self, unwinder: Unwinder, *, refresh_seconds: float = 10.0, refresh_rate: float = 20.0) -> None:
        """Each described process is looked at again after `refresh_seconds`, and at most
        `refresh_rate` of them a second (at thousands of processes, each is then looked at less
        often: the cost stays bounded; new processes are never held back)."""
        self.unwinder = unwinder
        self.refresh_seconds = refresh_seconds
        self.refresh_rate = refresh_rate
        self._next_refresh = 0.0
        self._queue: deque[int] = deque()
        self._wanted: set[int] = set()  # queued or described
        self._described: dict[int, float] = {}  # pid -> when it was last looked at
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._busy = False  # a pid is being described now
        self.failures = 0

    def want(self, pid: int) -> None:
        """Describe `pid` (once; later calls are free)."""
        with self._lock:
            if pid in self._wanted:
                return
            self._wanted.add(pid)
            self._queue.append(pid)
        self._wake.set()

    def forget(self, pid: int) -> None:
        with self._lock:
            self._wanted.discard(pid)
            self._described.pop(pid, None)
        self.unwinder.forget(pid)

    @property
    def described(self) -> int:
        with self._lock:
            return len(self._described)

    @property
    def pending(self) -> int:
        """Processes waiting for their first description, the one being described now included
        (`record` waits for them: the worker may have taken the only one off the queue already)."""
        with self._lock:
            return len(self._queue) + self._busy

    def wait_idle(self, timeout: float) -> bool:
        """Until nothing is queued (for tests and `record`'s first stacks)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not self._queue and not self._busy:
                    return True
            time.sleep(0.02)
        return False

    def start(self) -> None:
        allow_builds()
        self._thread = threading.Thread(target=self._run, name="offcpu-unwind-tables", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        cancel_builds()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _next(self) -> int | None:
        now = time.monotonic()
        with self._lock:
            if self._queue:
                self._busy = True
                return self._queue.popleft()
            # In the order they were last looked at (see _run()): the first is the stalest. Looking
            # at every process to find it made a pass over N processes cost N^2.
            for pid, at in self._described.items():
                if now - at >= self.refresh_seconds and now >= self._next_refresh:
                    self._busy = True
                    self._next_refresh = now + 1 / self.refresh_rate
                    return pid
                break
        return None

    def _idle_seconds(self) -> float:
        """How long nothing is due (a want() wakes the worker earlier)."""
        now = time.monotonic()
        with self._lock:
            oldest = next(iter(self._described.values()), None)
        if oldest is None:
            return 1.0
        due = max(oldest + self.refresh_seconds, self._next_refresh)
        return min(1.0, max(0.001, due - now))

    def _run(self) -> None:
        while not self._stop.is_set():
            pid = self._next()
            if pid is None:
                self._wake.wait(self._idle_seconds())
                self._wake.clear()
                continue
            changes = self.unwinder.changes
            try:
                described = self.unwinder.update(pid)
            except Exception:
                changes = -1  # (a build that failed may have allocated as much as one that did not)
                self.failures += 1
                log.exception("building the unwind tables of pid %d failed; its stacks use frame pointers", pid)
                described = None
            with self._lock:
                self._busy = False
                if described is None:  # gone
                    self._wanted.discard(pid)
                    self._described.pop(pid, None)
                elif pid in self._wanted:
                    self._described.pop(pid, None)  # to the end: the order is the age
                    self._described[pid] = time.monotonic()
            if described is None:
                self.unwinder.forget(pid)
            if self.unwinder.changes != changes:
                # What a description allocated for a moment (maps parsed, a table received) goes
                # back. Not after a look that found the maps unchanged, which allocates next to
                # nothing: at thousands of processes those are 20 a second, and the trim's own
                # read of the resident size cost half as much as the look.
                heap.trim_if_grown()
