"""Logging that cannot flood: a message key logs at most once per interval, with a count of the
repeats it swallowed."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

__all__ = ["RateLimitedLog"]


class RateLimitedLog:
    def __init__(self, logger: logging.Logger, interval: float = 60.0) -> None:
        self.logger = logger
        self.interval = interval
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def _allow(self, key: str) -> int | None:
        now = time.monotonic()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.interval:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                return None
            self._last[key] = now
            return self._suppressed.pop(key, 0)

    def log(self, level: int, msg: str, *args: Any, exc_info: bool = False) -> None:
        suppressed = self._allow(msg)
        if suppressed is None:
            return
        if suppressed:
            msg += " (%d similar messages suppressed)"
            args = (*args, suppressed)
        self.logger.log(level, msg, *args, exc_info=exc_info)

    def warning(self, msg: str, *args: Any) -> None:
        self.log(logging.WARNING, msg, *args)

    def error(self, msg: str, *args: Any) -> None:
        self.log(logging.ERROR, msg, *args)

    def exception(self, msg: str, *args: Any) -> None:
        self.log(logging.ERROR, msg, *args, exc_info=True)
