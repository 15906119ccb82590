"""The web config in force: the last one read well from `--web.config.file`, re-read when that file or
a file it names (certificate, key, client CA) changes.

The exporter-toolkit re-reads its web config per request and its certificate per handshake, so that
certificate and user rotation take effect without a restart; this does the same, comparing the
files' bytes (a digest: a rewrite within one mtime tick is still seen) at most once per `interval`,
when a connection or a request comes. A new file that does not load keeps the last good config; the
failure is logged (rate-limited) and counted. Turning TLS on or off is refused the same way: the
scheme Prometheus scrapes with cannot change under it, so that needs a restart.
"""

from __future__ import annotations

import hashlib
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from offcpu_exporter.ratelimit import RateLimitedLog
from offcpu_exporter.web.auth import BasicAuth
from offcpu_exporter.web.config_file import WebConfig, WebConfigError, load_web_config

__all__ = ["ServingConfig", "WebConfigWatcher"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServingConfig:
    """One loaded web config and what the server builds from it."""

    config: WebConfig
    ssl_context: ssl.SSLContext | None
    auth: BasicAuth

    @classmethod
    def build(cls, config: WebConfig) -> ServingConfig:
        return cls(config, config.tls.context() if config.tls else None, BasicAuth(config.users))


class WebConfigWatcher:
    """``current()`` is the config to use now; raises WebConfigError at construction when the file
    does not load (start-up fails fast), never afterwards."""

    def __init__(self, path: str, interval: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._path = Path(path) if path else None
        self._interval = interval
        self._clock = clock
        self._log = RateLimitedLog(log, interval=60.0)
        self.reloads = 0  # new configs put in force after start-up
        self.failures = 0  # changed files that did not load (the last good config stayed)
        self._fingerprint = _fingerprint(self._path) if self._path else b""
        self._serving = ServingConfig.build(load_web_config(self._path) if self._path else WebConfig())
        self._next_check = clock() + interval

    @property
    def tls(self) -> bool:
        return self._serving.ssl_context is not None

    def current(self) -> ServingConfig:
        if self._path is None:
            return self._serving
        now = self._clock()
        if now < self._next_check:
            return self._serving
        self._next_check = now + self._interval
        fingerprint = _fingerprint(self._path)
        if fingerprint == self._fingerprint:
            return self._serving
        # Remembered whether it loads or not: a broken file is reported once per change, not per check.
        self._fingerprint = fingerprint
        try:
            serving = ServingConfig.build(load_web_config(self._path))
            if (serving.ssl_context is None) != (self._serving.ssl_context is None):
                raise WebConfigError("turning TLS on or off needs a restart")
        except WebConfigError as e:
            self.failures += 1
            self._log.error("web config file %s not reloaded, the last good one stays in force: %s", self._path, e)
            return self._serving
        self._serving = serving
        self.reloads += 1
        log.info("web config file %s reloaded (TLS %s, %d basic auth users)", self._path,
                 "on" if serving.ssl_context else "off", len(serving.config.users))
        return serving


def _fingerprint(path: Path) -> bytes:
    """A digest of the config file and the files it names, as they are now (missing ones included)."""
    digest = hashlib.sha256()
    text = _read(path)
    digest.update(text)
    for named in _named_files(path, text):
        digest.update(b"\0" + str(named).encode() + b"\0" + _read(named))
    return digest.digest()


def _named_files(path: Path, text: bytes) -> list[Path]:
    # Read leniently: a file that does not parse is reported by load_web_config, not here.
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        return []
    section = data.get("tls_server_config") if isinstance(data, dict) else None
    if not isinstance(section, dict):
        return []
    base = path.resolve().parent
    return [base / str(section[k]) for k in ("cert_file", "key_file", "client_ca_file") if section.get(k)]


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        return f"unreadable: {e.errno}".encode()
