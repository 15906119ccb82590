"""`--web.config.file` is re-read when it or the files it names change, as the exporter-toolkit does:
a rotated certificate is served and added or removed users are accepted or refused without a
restart; a broken new file keeps the last good config, and is logged and counted. Real servers on
loopback."""

from __future__ import annotations

import http.client
import logging
import shutil
import socket
import ssl
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from offcpu_exporter.web.auth import BCRYPT_MAX_PASSWORD_BYTES, BasicAuth
from offcpu_exporter.web.config_watch import WebConfigWatcher
from offcpu_exporter.web.options import WebOptions
from offcpu_exporter.web.server import WebServer
from testkit.tls import self_signed
from testkit.web_client import basic, get, hashed, make_routes, users_yaml

CHECK_INTERVAL_S = 0.1


def start(config: Path) -> WebServer:
    options = WebOptions(listen_address="127.0.0.1:0", config_file=str(config))
    s = WebServer(make_routes(), options, config_check_interval=CHECK_INTERVAL_S)
    s.start()
    return s


def eventually(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(CHECK_INTERVAL_S)
    return condition()


def served_certificate(port: int) -> bytes:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # only the certificate's bytes are looked at
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, ctx.wrap_socket(raw) as tls:
        cert = tls.getpeercert(binary_form=True)
    assert cert is not None
    return cert


def der(pem: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pem.read_text())


def test_a_rotated_certificate_is_served_without_a_restart(tmp_path: Path) -> None:
    for name in ("old", "new"):
        self_signed(tmp_path / f"{name}.key", tmp_path / f"{name}.crt")
    shutil.copy(tmp_path / "old.crt", tmp_path / "tls.crt")
    shutil.copy(tmp_path / "old.key", tmp_path / "tls.key")
    config = tmp_path / "web.yml"
    config.write_text("tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n")
    s = start(config)
    try:
        assert served_certificate(s.port) == der(tmp_path / "old.crt")
        trusting_new = ssl.create_default_context(cafile=str(tmp_path / "new.crt"))
        with pytest.raises(ssl.SSLError):
            get(s, "/metrics", context=trusting_new)
        # Rotation as cert-manager or a renewal script does it: the files change, the config does not.
        shutil.copy(tmp_path / "new.key", tmp_path / "tls.key")
        shutil.copy(tmp_path / "new.crt", tmp_path / "tls.crt")
        assert eventually(lambda: served_certificate(s.port) == der(tmp_path / "new.crt"))
        assert get(s, "/metrics", context=trusting_new)[0] == 200
        counters = s.counters()
        assert counters.config_reloads == 1 and counters.config_reload_failures == 0
    finally:
        s.stop()


def test_a_broken_certificate_keeps_the_last_good_one(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    self_signed(tmp_path / "tls.key", tmp_path / "tls.crt")
    good = der(tmp_path / "tls.crt")
    config = tmp_path / "web.yml"
    config.write_text("tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n")
    s = start(config)
    try:
        with caplog.at_level(logging.ERROR, logger="offcpu_exporter.web.config_watch"):
            (tmp_path / "tls.crt").write_text("-----BEGIN CERTIFICATE-----\nnot one\n-----END CERTIFICATE-----\n")
            # The files are checked when a connection comes: each probe here is one.
            assert eventually(lambda: served_certificate(s.port) == good and s.counters().config_reload_failures == 1)
        assert "not reloaded, the last good one stays in force" in caplog.text
        assert "cannot load TLS certificate" in caplog.text
        # Turning TLS off is refused too: clients scrape with https. (Logged at most once a minute.)
        config.write_text(users_yaml({"alice": "a"}))
        assert eventually(lambda: served_certificate(s.port) == good and s.counters().config_reload_failures == 2)
    finally:
        s.stop()


def test_turning_tls_off_needs_a_restart(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    self_signed(tmp_path / "tls.key", tmp_path / "tls.crt")
    config = tmp_path / "web.yml"
    config.write_text("tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n")
    now = [0.0]
    watcher = WebConfigWatcher(str(config), interval=1.0, clock=lambda: now[0])
    first = watcher.current()
    config.write_text(users_yaml({"alice": "a"}))
    assert watcher.current() is first  # not checked before the interval is over
    now[0] = 1.0
    with caplog.at_level(logging.ERROR, logger="offcpu_exporter.web.config_watch"):
        assert watcher.current() is first
    assert "turning TLS on or off needs a restart" in caplog.text
    assert (watcher.reloads, watcher.failures) == (0, 1)


def test_users_added_and_removed_take_effect_without_a_restart(tmp_path: Path) -> None:
    config = tmp_path / "web.yml"
    config.write_text(users_yaml({"alice": "alice-pw"}))
    s = start(config)
    kept_alive = http.client.HTTPConnection("127.0.0.1", s.port, timeout=5)

    def status_on_kept_alive(user: str, password: str) -> int:
        kept_alive.request("GET", "/metrics", headers=basic(user, password))
        response = kept_alive.getresponse()
        response.read()
        return response.status

    try:
        assert get(s, "/metrics", basic("alice", "alice-pw"))[0] == 200
        assert status_on_kept_alive("alice", "alice-pw") == 200
        assert get(s, "/metrics", basic("bob", "bob-pw"))[0] == 401
        config.write_text(users_yaml({"bob": "bob-pw"}))
        assert eventually(lambda: get(s, "/metrics", basic("bob", "bob-pw"))[0] == 200)
        assert get(s, "/metrics", basic("alice", "alice-pw"))[0] == 401
        # A connection opened before the change (Prometheus keeps its own) sees it as well.
        assert status_on_kept_alive("alice", "alice-pw") == 401
        assert status_on_kept_alive("bob", "bob-pw") == 200
    finally:
        kept_alive.close()
        s.stop()


def test_a_broken_file_keeps_the_last_good_users(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = tmp_path / "web.yml"
    config.write_text(users_yaml({"alice": "alice-pw"}))
    s = start(config)
    try:
        with caplog.at_level(logging.ERROR, logger="offcpu_exporter.web.config_watch"):
            config.write_text("basic_auth_users: [\n")
            assert eventually(lambda: get(s, "/healthz")[0] == 401 and s.counters().config_reload_failures == 1)
            assert get(s, "/metrics", basic("alice", "alice-pw"))[0] == 200
            assert get(s, "/metrics")[0] == 401
            # The same broken file is reported once, not at every check.
            time.sleep(5 * CHECK_INTERVAL_S)
            get(s, "/healthz")
            assert s.counters().config_reload_failures == 1
        assert "not valid YAML" in caplog.text
        config.write_text(users_yaml({"carol": "carol-pw"}))
        assert eventually(lambda: get(s, "/metrics", basic("carol", "carol-pw"))[0] == 200)
        assert s.counters().config_reloads == 1
    finally:
        s.stop()


def test_passwords_past_bcrypts_72_bytes_are_refused_not_an_error(tmp_path: Path) -> None:
    exactly = "p" * BCRYPT_MAX_PASSWORD_BYTES
    auth = BasicAuth({"prometheus": hashed(exactly).encode()})
    assert auth.check(basic("prometheus", exactly)["Authorization"])
    # bcrypt 4 cut the password at 72 bytes, so this matched; bcrypt 5 raises; here it is refused.
    assert not auth.check(basic("prometheus", exactly + "x")["Authorization"])
    assert not auth.check(basic("nobody", "é" * 40)["Authorization"])  # 80 bytes of UTF-8
    config = tmp_path / "web.yml"
    config.write_text(f"basic_auth_users:\n  prometheus: '{hashed(exactly)}'\n")
    s = start(config)
    try:
        assert get(s, "/metrics", basic("prometheus", exactly + "x"))[0] == 401
        assert get(s, "/metrics", basic("prometheus", exactly))[0] == 200
    finally:
        s.stop()
