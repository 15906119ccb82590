"""The exporter's web server on loopback: endpoints, limits, gzip, TLS, basic auth, slow clients."""

from __future__ import annotations

import base64
import gzip
import http.client
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import bcrypt
import pytest

from offcpu_exporter.web import Routes
from offcpu_exporter.web import auth as auth_module
from offcpu_exporter.web.auth import BasicAuth
from offcpu_exporter.web.compression import accepts_gzip
from offcpu_exporter.web.config_file import WebConfigError, load_web_config
from offcpu_exporter.web.options import WebOptions
from offcpu_exporter.web.server import WebServer
from testkit.tls import openssl, self_signed
from testkit.web_client import METRICS, basic, get, make_routes, raw_exchange


@pytest.fixture
def server() -> Iterator[WebServer]:
    s = WebServer(make_routes(), WebOptions(listen_address="127.0.0.1:0"), lambda: True)
    s.start()
    yield s
    s.stop()


def test_endpoints_and_readiness(server: WebServer) -> None:
    status, headers, body = get(server, "/metrics")
    assert status == 200 and body == METRICS and "content-encoding" not in headers
    assert get(server, "/healthz")[0] == 200
    assert get(server, "/readyz")[0] == 200
    status, headers, body = get(server, "/")
    assert status == 200 and b'href="/metrics"' in body and headers["content-type"].startswith("text/html")
    assert get(server, "/nope")[0] == 404
    status, headers, body = get(server, "/metrics", method="HEAD")
    assert status == 200 and body == b"" and int(headers["content-length"]) == len(METRICS)


def test_readyz_follows_the_probe() -> None:
    attached = [False]
    s = WebServer(make_routes(), WebOptions(listen_address="127.0.0.1:0"), lambda: attached[0])
    s.start()
    try:
        assert get(s, "/readyz")[0] == 503
        assert get(s, "/healthz")[0] == 200
        attached[0] = True
        assert get(s, "/readyz")[0] == 200
    finally:
        s.stop()


def test_keep_alive_serves_several_requests_on_one_connection(server: WebServer) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        for _ in range(5):
            conn.request("GET", "/metrics")
            r = conn.getresponse()
            assert r.status == 200 and r.read() == METRICS
        sock = conn.sock
        conn.request("GET", "/healthz")
        conn.getresponse().read()
        assert conn.sock is sock  # the same socket throughout
    finally:
        conn.close()


def test_gzip_when_the_client_accepts_it(server: WebServer) -> None:
    status, headers, body = get(server, "/metrics", {"Accept-Encoding": "gzip"})
    assert status == 200 and headers["content-encoding"] == "gzip" and headers["vary"] == "Accept-Encoding"
    assert gzip.decompress(body) == METRICS and len(body) < len(METRICS) / 4
    _, headers, body = get(server, "/metrics", {"Accept-Encoding": "gzip;q=0, identity"})
    assert "content-encoding" not in headers and body == METRICS
    assert accepts_gzip("deflate, gzip;q=0.5") and accepts_gzip("*") and not accepts_gzip("br, *;q=0")


def test_a_blocking_handler_blocks_neither_other_requests_nor_is_limited_away(server: WebServer) -> None:
    release = threading.Event()
    s = WebServer(make_routes(release), WebOptions(listen_address="127.0.0.1:0", max_requests=2), lambda: True)
    s.start()
    try:
        with ThreadPoolExecutor(2) as pool:
            slow = pool.submit(get, s, "/debug/slow", None, "GET", None, 30)
            time.sleep(0.3)
            t0 = time.monotonic()
            assert get(s, "/metrics")[0] == 200
            assert time.monotonic() - t0 < 2.0
            slow2 = pool.submit(get, s, "/debug/slow", None, "GET", None, 30)
            time.sleep(0.3)
            # Two handlers in flight = the limit: a third is refused at once, probes still answer.
            status, _, body = get(s, "/metrics")
            assert status == 503 and b"Limit of concurrent requests" in body
            assert get(s, "/healthz")[0] == 200
            release.set()
            assert slow.result(10)[0] == 200 and slow2.result(10)[0] == 200
        assert get(s, "/metrics")[0] == 200
    finally:
        release.set()
        s.stop()


def test_request_size_limits() -> None:
    s = WebServer(
        make_routes(), WebOptions(listen_address="127.0.0.1:0", max_header_bytes=2048, max_body_bytes=100), lambda: True
    )
    s.start()
    try:
        assert get(s, "/metrics", {"X-Big": "a" * 4000})[0] == 431
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=5)
        conn.request("POST", "/metrics", body=b"x" * 1000)
        assert conn.getresponse().status == 413
        conn.close()
        assert raw_exchange(s.port, b"GARBAGE\r\n\r\n").startswith(b"HTTP/1.1 400")
        assert raw_exchange(s.port, b"GET /metrics HTTP/2.0\r\n\r\n").startswith(b"HTTP/1.1 505")
        assert raw_exchange(s.port, b"GET /metrics HTTP/1.1\r\nBad Header: x\r\n\r\n").startswith(b"HTTP/1.1 400")
        assert get(s, "/metrics")[0] == 200
    finally:
        s.stop()


def test_slowloris_is_cut_after_the_header_timeout_and_blocks_nobody() -> None:
    s = WebServer(make_routes(), WebOptions(listen_address="127.0.0.1:0", read_header_timeout=2.0), lambda: True)
    s.start()
    cut_after: list[float] = []

    try:
        slowpokes = [threading.Thread(target=slow_client_loop, args=(s.port, cut_after)) for _ in range(5)]
        for t in slowpokes:
            t.start()
        time.sleep(0.5)
        latencies = []
        for _ in range(10):
            t0 = time.monotonic()
            assert get(s, "/metrics")[0] == 200
            latencies.append(time.monotonic() - t0)
        assert max(latencies) < 1.0
        for t in slowpokes:
            t.join(20)
        assert len(cut_after) == 5
        # Cut at the 2 s deadline (one byte per second: a few bytes in), not after the 100+ bytes.
        assert all(1.5 < c < 5.0 for c in cut_after), cut_after
    finally:
        s.stop()


def slow_client_loop(port: int, cut_after: list[float]) -> None:
    payload = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100
    with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
        sock.setblocking(False)
        t0 = time.monotonic()
        for byte in payload:
            try:
                sock.send(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                break
            deadline = time.monotonic() + 1.0
            closed = False
            while time.monotonic() < deadline:
                try:
                    if sock.recv(1) == b"":
                        closed = True
                        break
                except BlockingIOError:
                    time.sleep(0.05)
                except ConnectionResetError:
                    closed = True
                    break
            if closed:
                break
        cut_after.append(time.monotonic() - t0)


def test_a_thousand_idle_connections_do_not_stop_scrapes() -> None:
    s = WebServer(make_routes(), WebOptions(listen_address="127.0.0.1:0", read_header_timeout=30.0), lambda: True)
    s.start()
    idle: list[socket.socket] = []
    try:
        for _ in range(1000):
            idle.append(socket.create_connection(("127.0.0.1", s.port), timeout=5))
        # Half of them even started a request.
        for sock in idle[::2]:
            sock.send(b"GET /metr")
        time.sleep(0.5)
        latencies = []
        for _ in range(20):
            t0 = time.monotonic()
            status, _, body = get(s, "/metrics")
            latencies.append(time.monotonic() - t0)
            assert status == 200 and body == METRICS
        assert max(latencies) < 1.0, latencies
        # And they are all still open (nothing was dropped to make room).
        alive = 0
        for sock in idle:
            sock.setblocking(False)
            try:
                alive += sock.recv(1) != b""
            except BlockingIOError:
                alive += 1
        assert alive == 1000
    finally:
        for sock in idle:
            sock.close()
        s.stop()


def test_connection_limit_closes_new_connections_beyond_it() -> None:
    s = WebServer(make_routes(), WebOptions(listen_address="127.0.0.1:0", max_connections=3), lambda: True)
    s.start()
    held = [socket.create_connection(("127.0.0.1", s.port), timeout=5) for _ in range(3)]
    try:
        time.sleep(0.2)
        assert raw_exchange(s.port, b"GET /healthz HTTP/1.1\r\n\r\n") == b""
        for sock in held:
            sock.close()
        time.sleep(0.2)
        assert get(s, "/healthz")[0] == 200
    finally:
        s.stop()


# ---- TLS and basic auth -------------------------------------------------------------------------




@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    # Server: self-signed for 127.0.0.1. Clients: a CA and one client certificate signed by it.
    self_signed(d / "server.key", d / "server.crt", san="IP:127.0.0.1,DNS:localhost")
    openssl(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=test-ca",
        "-keyout",
        str(d / "ca.key"),
        "-out",
        str(d / "ca.crt"),
    )
    openssl(
        "req",
        "-new",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-subj",
        "/CN=prometheus",
        "-keyout",
        str(d / "client.key"),
        "-out",
        str(d / "client.csr"),
    )
    (d / "client.ext").write_text("subjectAltName=DNS:prometheus.example\n")
    openssl(
        "x509",
        "-req",
        "-in",
        str(d / "client.csr"),
        "-CA",
        str(d / "ca.crt"),
        "-CAkey",
        str(d / "ca.key"),
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        str(d / "client.ext"),
        "-out",
        str(d / "client.crt"),
    )
    return d


HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=10)).decode()





def tls_server(pki: Path, extra: str = "") -> WebServer:
    cfg = pki / f"web-{abs(hash(extra))}.yml"
    cfg.write_text(
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
        + extra
        + f"basic_auth_users:\n  prometheus: '{HASH}'\n"
        + "http_server_config:\n  headers:\n    Strict-Transport-Security: max-age=31536000\n"
    )
    s = WebServer(make_routes(), WebOptions(listen_address="127.0.0.1:0", config_file=str(cfg)), lambda: True)
    s.start()
    return s


def client_context(pki: Path, cert: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / "server.crt"))
    if cert:
        ctx.load_cert_chain(pki / "client.crt", pki / "client.key")
    return ctx


def test_tls_with_basic_auth(pki: Path) -> None:
    s = tls_server(pki)
    try:
        assert s.url.startswith("https://")
        ctx = client_context(pki)
        status, headers, body = get(s, "/metrics", basic("prometheus", "s3cret"), context=ctx)
        assert status == 200 and body == METRICS
        assert headers["strict-transport-security"] == "max-age=31536000"
        status, headers, _ = get(s, "/metrics", basic("prometheus", "wrong"), context=ctx)
        assert status == 401 and headers["www-authenticate"] == "Basic"
        assert get(s, "/metrics", basic("nobody", "s3cret"), context=ctx)[0] == 401
        assert get(s, "/metrics", context=ctx)[0] == 401
        assert get(s, "/healthz", context=ctx)[0] == 401  # every path is behind auth, as with the toolkit
        # Plain HTTP to the TLS port gets no HTTP answer.
        answer = raw_exchange(s.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert not answer.startswith(b"HTTP/")
        # A client that does not trust the certificate fails the handshake.
        with pytest.raises(ssl.SSLError):
            get(s, "/metrics", basic("prometheus", "s3cret"), context=ssl.create_default_context())
        assert get(s, "/metrics", basic("prometheus", "s3cret"), context=ctx)[0] == 200
    finally:
        s.stop()


def test_password_guessers_do_not_delay_scrapes_with_known_credentials(pki: Path) -> None:
    s = tls_server(pki)
    ctx = client_context(pki)
    try:
        assert get(s, "/metrics", basic("prometheus", "s3cret"), context=ctx)[0] == 200  # now cached
        with ThreadPoolExecutor(30) as pool:
            # 30 wrong passwords at once: ~30 serialized bcrypt checks (about 2 s) queue up.
            guesses = [
                pool.submit(get, s, "/metrics", basic("prometheus", f"guess{i}"), "GET", ctx, 30) for i in range(30)
            ]
            time.sleep(0.3)
            t0 = time.monotonic()
            assert get(s, "/metrics", basic("prometheus", "s3cret"), context=ctx)[0] == 200
            assert time.monotonic() - t0 < 0.5
            queued = sum(not g.done() for g in guesses)
            assert all(g.result(60)[0] == 401 for g in guesses)
        assert queued > 5  # the guesses really were still waiting for bcrypt
    finally:
        s.stop()


def test_tls_client_certificates(pki: Path) -> None:
    s = tls_server(
        pki,
        "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n"
        "  client_allowed_sans: [prometheus.example]\n",
    )
    try:
        ok = get(s, "/metrics", basic("prometheus", "s3cret"), context=client_context(pki, cert=True))
        assert ok[0] == 200
        with pytest.raises((ssl.SSLError, ConnectionResetError, http.client.RemoteDisconnected)):
            get(s, "/metrics", basic("prometheus", "s3cret"), context=client_context(pki, cert=False))
    finally:
        s.stop()
    s = tls_server(
        pki,
        "  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n"
        "  client_allowed_sans: [someone-else]\n",
    )
    try:
        with pytest.raises((ConnectionResetError, http.client.RemoteDisconnected, ssl.SSLError)):
            get(s, "/metrics", basic("prometheus", "s3cret"), context=client_context(pki, cert=True))
    finally:
        s.stop()


def test_successful_checks_are_cached_and_failures_are_not(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bytes] = []
    real = bcrypt.checkpw

    def counting(password: bytes, hashed: bytes) -> bool:
        calls.append(hashed)
        return real(password, hashed)

    monkeypatch.setattr(auth_module.bcrypt, "checkpw", counting)
    auth = BasicAuth({"prometheus": HASH.encode()})
    right = basic("prometheus", "s3cret")["Authorization"]
    wrong = basic("prometheus", "s3creT")["Authorization"]
    assert auth.check(right) and auth.check(right) and auth.check(right)
    assert len(calls) == 1
    assert not auth.check(wrong) and not auth.check(wrong)
    assert len(calls) == 3
    # Unknown users still cost one bcrypt check (no user enumeration by timing).
    assert not auth.check(basic("admin", "s3cret")["Authorization"])
    assert len(calls) == 4 and calls[-1] != HASH.encode()
    for bad in (None, "", "Bearer x", "Basic !!!", "Basic " + base64.b64encode(b"nocolon").decode()):
        assert not auth.check(bad)
    assert auth.check(right) and len(calls) == 4


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tls_server_config: [", "not valid YAML"),
        ("tls_server_config:\n  key_file: k\n", "missing cert_file"),
        ("tls_server_config:\n  cert_file: c\n", "missing key_file"),
        ("tls_server_config:\n  cert_file: nope.crt\n  key_file: nope.key\n", "cannot load TLS certificate"),
        ("basic_auth_users:\n  u: plaintext\n", "not a bcrypt hash"),
        ("basic_auth: {}\n", "unknown field basic_auth"),
        (
            "tls_server_config:\n  cert_file: c\n  key_file: k\n  client_auth_type: RequireAnyClientCert\n",
            "not supported",
        ),
        (
            "tls_server_config:\n  cert_file: c\n  key_file: k\n  cipher_suites: [TLS_AES_128_GCM_SHA256]\n",
            "not supported",
        ),
        ("tls_server_config:\n  cert_file: c\n  key_file: k\n  min_version: TLS99\n", "unknown TLS version"),
        ("http_server_config:\n  headers:\n    Content-Type: x\n", "set by the server"),
    ],
)
def test_bad_web_config_is_a_one_line_error(tmp_path: Path, text: str, message: str) -> None:
    cfg = tmp_path / "web.yml"
    cfg.write_text(text)
    with pytest.raises(WebConfigError) as e:
        load_web_config(cfg)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_missing_web_config_file_and_bad_listen_address(tmp_path: Path) -> None:
    with pytest.raises(WebConfigError, match="cannot read web config file"):
        WebServer(Routes(), WebOptions(config_file=str(tmp_path / "absent.yml")))
    with pytest.raises(WebConfigError, match="expected host:port"):
        WebServer(Routes(), WebOptions(listen_address="localhost"))


def test_address_in_use_fails_start(server: WebServer) -> None:
    other = WebServer(Routes(), WebOptions(listen_address=f"127.0.0.1:{server.port}"))
    with pytest.raises(OSError):
        other.start()


def test_the_documented_web_config_loads(pki: Path, tmp_path: Path) -> None:
    doc = (Path(__file__).resolve().parents[3] / "docs" / "prometheus.md").read_text()
    block = doc.split("```yaml\n", 1)[1].split("```", 1)[0]
    block = block.replace("/etc/offcpu-exporter/tls.crt", str(pki / "server.crt"))
    block = block.replace("/etc/offcpu-exporter/tls.key", str(pki / "server.key"))
    cfg = tmp_path / "web.yml"
    cfg.write_text(block)
    config = load_web_config(cfg)
    assert config.tls is not None and config.headers["Strict-Transport-Security"]
    auth = BasicAuth(config.users)
    assert auth.check(basic("prometheus", "example")["Authorization"])
