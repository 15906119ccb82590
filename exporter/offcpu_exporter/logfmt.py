"""Log set-up: `--log.level` and `--log.format logfmt|json`, as node_exporter's (Prometheus'
promslog) flags. Messages carry strings from watched processes (comm, paths): control characters
are escaped in both formats, so a hostile process name cannot forge a log line."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from datetime import UTC, datetime

__all__ = ["FORMATS", "LEVELS", "JsonFormatter", "LogfmtFormatter", "add_arguments", "configure_logging"]

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("logfmt", "json")

_CONTROL = {c: f"\\x{c:02x}" for c in range(32) if c not in (9,)} | {0x7F: "\\x7f"}
_CONTROL[10] = "\\n"
_CONTROL[13] = "\\r"
# promslog's level names: "warn", not "warning".
_LEVEL_NAMES = {"DEBUG": "debug", "INFO": "info", "WARNING": "warn", "ERROR": "error", "CRITICAL": "error"}


def _level(name: str) -> str:
    # node_exporter's (promslog's) spelling of the level, accepted for the same one.
    return "warning" if name == "warn" else name


def add_arguments(parser: argparse.ArgumentParser, level: str = "info") -> None:
    parser.add_argument("--log.level", dest="log_level", type=_level, choices=LEVELS, default=level,
                        help=f"only log messages of this level or above (default: {level})")
    parser.add_argument("--log.format", dest="log_format", choices=FORMATS, default="logfmt",
                        help="logfmt (key=value) or json (one JSON object per line) (default: logfmt)")


def _fields(record: logging.LogRecord, message: str) -> dict[str, str]:
    ts = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    fields = {"time": ts, "level": _LEVEL_NAMES.get(record.levelname, record.levelname.lower()),
              "source": record.name, "msg": message}
    if record.exc_info:
        fields["err"] = logging.Formatter().formatException(record.exc_info)
    return fields


class LogfmtFormatter(logging.Formatter):
    """`time=... level=info source=offcpu_exporter.probe msg="probe attached ..."`"""

    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{k}={_logfmt_value(v)}" for k, v in _fields(record, record.getMessage()).items())


class JsonFormatter(logging.Formatter):
    """One JSON object per line; json.dumps escapes control characters itself."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_fields(record, record.getMessage()), ensure_ascii=False)


def _logfmt_value(value: str) -> str:
    if value and value.isprintable() and not any(c in value for c in ' ="\\'):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').translate(_CONTROL) + '"'


def configure_logging(level: str = "info", fmt: str = "logfmt") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else LogfmtFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
