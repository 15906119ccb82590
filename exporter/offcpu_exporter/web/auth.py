"""HTTP basic auth against bcrypt hashes, as the exporter-toolkit checks it.

bcrypt is slow on purpose (~60 ms at cost 10), and Prometheus sends the same credentials on every
scrape, so a successful check is cached: per (user, hash) the SHA-256 of the password that matched,
compared in constant time. Failed checks are never cached, and bcrypt runs one at a time (as the
toolkit's mutex does) so that a password-guessing client costs at most one core. Unknown users are
checked against a fixed hash so that timing does not reveal which users exist.

bcrypt reads at most 72 bytes of a password. bcrypt 4 cut longer ones silently (so any suffix
matched); bcrypt 5 raises instead. A longer password is refused here without a bcrypt check: it
cannot be the one a hash was made from, and it must be a 401, never a 500.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import threading
from collections.abc import Mapping

import bcrypt

__all__ = ["BasicAuth", "parse_basic_authorization"]

# bcrypt (cost 10) of a random password nobody knows; used for unknown user names.
_FAKE_HASH = b"$2b$10$01RVuLf3JyCRcMVwazpleOm8vGu5Qy2V86WDucX.QiJn0CWoGuNEm"
BCRYPT_MAX_PASSWORD_BYTES = 72


def parse_basic_authorization(header: str | None) -> tuple[str, bytes] | None:
    """(user, password) from an ``Authorization: Basic ...`` header, None when absent or malformed."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "basic" or not token:
        return None
    try:
        raw = base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, password = raw.partition(b":")
    if not sep:
        return None
    try:
        return user.decode("utf-8"), password
    except UnicodeDecodeError:
        return None


class BasicAuth:
    def __init__(self, users: Mapping[str, bytes]) -> None:
        self._users = dict(users)
        self._bcrypt_lock = threading.Lock()
        self._cache_lock = threading.Lock()
        self._verified: dict[tuple[str, bytes], bytes] = {}

    @property
    def enabled(self) -> bool:
        return bool(self._users)

    def check_cached(self, authorization: str | None) -> bool | None:
        """True or False when known without bcrypt (a cached success, a missing or malformed
        header); None when a bcrypt check is needed. Microseconds: fit for an event loop."""
        if not self._users:
            return True
        credentials = parse_basic_authorization(authorization)
        if credentials is None:
            return False
        return True if self._verified_before(*credentials) else None

    def check(self, authorization: str | None) -> bool:
        """True when the header carries a known user and its password. May take one bcrypt check."""
        if not self._users:
            return True
        credentials = parse_basic_authorization(authorization)
        if credentials is None:
            return False
        user, password = credentials
        if len(password) > BCRYPT_MAX_PASSWORD_BYTES:
            return False
        if self._verified_before(user, password):
            return True
        hashed = self._users.get(user)
        known = hashed is not None
        if hashed is None:
            hashed = _FAKE_HASH
        with self._bcrypt_lock:
            try:
                ok = bcrypt.checkpw(password, hashed)
            except ValueError:  # a hash bcrypt cannot read (or a password it refuses): never a match
                ok = False
        if ok and known:
            with self._cache_lock:
                self._verified[(user, hashed)] = hashlib.sha256(password).digest()
            return True
        return False

    def _verified_before(self, user: str, password: bytes) -> bool:
        """A success cached for this user's current hash (a SHA-256 of the password, not the password)."""
        hashed = self._users.get(user)
        if hashed is None:
            return False
        with self._cache_lock:
            cached = self._verified.get((user, hashed))
        return cached is not None and hmac.compare_digest(cached, hashlib.sha256(password).digest())
