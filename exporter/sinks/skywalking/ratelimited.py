"""A logger wrapper that lets one message through per interval and counts the rest."""

from __future__ import annotations

import logging
import time

__all__ = ["RateLimitedLog"]


class RateLimitedLog:
    def __init__(self, logger: logging.Logger, every: float = 60.0) -> None:
        self._logger = logger
        self._every = every
        self._last = -every
        self._suppressed = 0

    def warning(self, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last < self._every:
            self._suppressed += 1
            return
        if self._suppressed:
            message += " (%d similar messages suppressed)"
            args = (*args, self._suppressed)
        self._last, self._suppressed = now, 0
        self._logger.warning(message, *args)
