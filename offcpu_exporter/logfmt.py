"""Log set-up. Messages carry strings from watched processes (comm, paths): control characters are
escaped so a hostile process name cannot forge log lines."""

from __future__ import annotations

import logging
import sys

__all__ = ["EscapingFormatter", "configure_logging"]

_CONTROL = {c: f"\\x{c:02x}" for c in range(32) if c not in (9,)} | {0x7F: "\\x7f"}
_CONTROL[10] = "\\n"
_CONTROL[13] = "\\r"


class EscapingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage().translate(_CONTROL)
        record = logging.makeLogRecord({**record.__dict__, "msg": message, "args": None})
        return super().format(record)


def configure_logging(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(EscapingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
