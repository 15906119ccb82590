"""The web config file (`--web.config.file`), in the format of the Prometheus exporter-toolkit's
web-config.yml: https://github.com/prometheus/exporter-toolkit/blob/master/docs/web-configuration.md

Python's `ssl` cannot accept a client certificate without verifying it, so the client auth types
`RequestClientCert` and `RequireAnyClientCert` are refused with a clear message rather than
silently weakened or strengthened; Go cipher-suite and curve names are refused for the same reason.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = ["TLSConfig", "WebConfig", "WebConfigError", "load_web_config"]


class WebConfigError(ValueError):
    """The web config file is missing, unreadable or invalid (a one-line message)."""


_CLIENT_AUTH = {
    "": ssl.CERT_NONE,
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_UNSUPPORTED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert")
_TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_TLS_KEYS = {
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "client_allowed_sans",
    "min_version",
    "max_version",
    "prefer_server_cipher_suites",
}
_TLS_REFUSED = {
    "cipher_suites": "Go cipher suite names have no exact OpenSSL equivalent here",
    "curve_preferences": "Go curve preferences have no exact OpenSSL equivalent here",
    "cert": "inline certificates are not supported; use cert_file",
    "key": "inline keys are not supported; use key_file",
}
# Headers the server itself owns; a config may not override them.
_RESERVED_HEADERS = {
    "content-length",
    "content-type",
    "content-encoding",
    "connection",
    "transfer-encoding",
    "vary",
    "www-authenticate",
}
_BCRYPT_PREFIXES = (b"$2a$", b"$2b$", b"$2y$")


@dataclass(frozen=True)
class TLSConfig:
    cert_file: Path
    key_file: Path
    client_auth: ssl.VerifyMode = ssl.CERT_NONE
    client_ca_file: Path | None = None
    client_allowed_sans: tuple[str, ...] = ()
    min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2  # the toolkit's default
    max_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_3
    prefer_server_ciphers: bool = True

    def context(self) -> ssl.SSLContext:
        """A server context; raises WebConfigError when the files do not load."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = self.min_version
        ctx.maximum_version = self.max_version
        if self.prefer_server_ciphers:
            ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
        try:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as e:
            raise WebConfigError(f"cannot load TLS certificate {self.cert_file} / key {self.key_file}: {e}") from e
        ctx.verify_mode = self.client_auth
        if self.client_ca_file is not None:
            try:
                ctx.load_verify_locations(cafile=self.client_ca_file)
            except (OSError, ssl.SSLError) as e:
                raise WebConfigError(f"cannot load client CA file {self.client_ca_file}: {e}") from e
        return ctx


@dataclass(frozen=True)
class WebConfig:
    tls: TLSConfig | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    headers: Mapping[str, str] = field(default_factory=dict)  # extra response headers


def load_web_config(path: str | Path) -> WebConfig:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise WebConfigError(f"cannot read web config file {path}: {e.strerror or e}") from e
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise WebConfigError(f"web config file {path} is not valid YAML: {_one_line(e)}") from e
    if data is None:
        return WebConfig()
    if not isinstance(data, dict):
        raise WebConfigError(f"web config file {path}: top level must be a mapping")
    _no_unknown(data, {"tls_server_config", "basic_auth_users", "http_server_config"}, "")
    base = Path(path).resolve().parent
    return WebConfig(
        tls=_tls(data.get("tls_server_config"), base),
        users=_users(data.get("basic_auth_users")),
        headers=_headers(data.get("http_server_config")),
    )


def _tls(section: Any, base: Path) -> TLSConfig | None:
    if section is None:
        return None
    if not isinstance(section, dict):
        raise WebConfigError("tls_server_config must be a mapping")
    for key, why in _TLS_REFUSED.items():
        if key in section:
            raise WebConfigError(f"tls_server_config.{key} is not supported: {why}")
    _no_unknown(section, _TLS_KEYS, "tls_server_config.")
    cert, key_file = section.get("cert_file"), section.get("key_file")
    if not cert:
        raise WebConfigError("tls_server_config: missing cert_file")
    if not key_file:
        raise WebConfigError("tls_server_config: missing key_file")
    auth_name = str(section.get("client_auth_type") or "")
    if auth_name in _UNSUPPORTED_CLIENT_AUTH:
        raise WebConfigError(
            f"tls_server_config.client_auth_type {auth_name} is not supported (client certificates are "
            "always verified here): use VerifyClientCertIfGiven or RequireAndVerifyClientCert"
        )
    if auth_name not in _CLIENT_AUTH:
        raise WebConfigError(f"tls_server_config.client_auth_type: unknown value {auth_name!r}")
    ca = section.get("client_ca_file")
    client_auth = _CLIENT_AUTH[auth_name]
    if client_auth != ssl.CERT_NONE and not ca:
        raise WebConfigError(f"tls_server_config: client_auth_type {auth_name} needs client_ca_file")
    sans = section.get("client_allowed_sans") or []
    if not isinstance(sans, list) or not all(isinstance(s, str) for s in sans):
        raise WebConfigError("tls_server_config.client_allowed_sans must be a list of strings")
    if sans and client_auth != ssl.CERT_REQUIRED:
        raise WebConfigError("tls_server_config.client_allowed_sans needs client_auth_type RequireAndVerifyClientCert")
    tls = TLSConfig(
        cert_file=base / str(cert),
        key_file=base / str(key_file),
        client_auth=client_auth,
        client_ca_file=(base / str(ca)) if ca else None,
        client_allowed_sans=tuple(sans),
        min_version=_version(section, "min_version", ssl.TLSVersion.TLSv1_2),
        max_version=_version(section, "max_version", ssl.TLSVersion.TLSv1_3),
        prefer_server_ciphers=bool(section.get("prefer_server_cipher_suites", True)),
    )
    if tls.min_version > tls.max_version:
        raise WebConfigError("tls_server_config: min_version is above max_version")
    tls.context()  # fail at start-up, not at the first connection
    return tls


def _version(section: Mapping[str, Any], key: str, default: ssl.TLSVersion) -> ssl.TLSVersion:
    value = section.get(key)
    if value is None or value == "":
        return default
    if value not in _TLS_VERSIONS:
        raise WebConfigError(f"tls_server_config.{key}: unknown TLS version {value!r} (TLS10..TLS13)")
    return _TLS_VERSIONS[value]


def _users(section: Any) -> dict[str, bytes]:
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise WebConfigError("basic_auth_users must be a mapping of user name to bcrypt hash")
    users: dict[str, bytes] = {}
    for user, hashed in section.items():
        if ":" in str(user):
            raise WebConfigError(f"basic_auth_users: user name {user!r} contains ':'")
        raw = str(hashed or "").encode("ascii", "replace")
        if not raw.startswith(_BCRYPT_PREFIXES) or len(raw) != 60:
            raise WebConfigError(f"basic_auth_users: the password of {user!r} is not a bcrypt hash")
        users[str(user)] = raw
    return users


def _headers(section: Any) -> dict[str, str]:
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise WebConfigError("http_server_config must be a mapping")
    # http2 is accepted for compatibility; this server speaks HTTP/1.1 (what Prometheus scrapes with).
    _no_unknown(section, {"headers", "http2"}, "http_server_config.")
    headers = section.get("headers") or {}
    if not isinstance(headers, dict):
        raise WebConfigError("http_server_config.headers must be a mapping")
    out: dict[str, str] = {}
    for key, value in headers.items():
        name = str(key)
        if name.lower() in _RESERVED_HEADERS:
            raise WebConfigError(f"http_server_config.headers: {name} is set by the server itself")
        text = str(value)
        if any(c in text or c in name for c in "\r\n") or not name or " " in name or ":" in name:
            raise WebConfigError(f"http_server_config.headers: invalid header {name!r}")
        out[name] = text
    return out


def _no_unknown(section: Mapping[str, Any], known: set[str], prefix: str) -> None:
    for key in section:
        if key not in known:
            raise WebConfigError(f"web config: unknown field {prefix}{key}")


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())
