"""mTLS for OTLP: real loopback receivers (grpc.server, an HTTPS http.server) that require a client
certificate signed by their CA. With the client certificate (flags, or the per-signal environment
variables) both signals arrive; without one, or with one from another CA, nothing does and the
failures are counted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.otlp_receivers import GrpcReceiver, HttpReceiver
from testkit.otlp_sink import config_from_args, context_of
from testkit.snapshots import two_process_snapshot
from testkit.tls import Pki, make_pki

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(params=["grpc", "http/protobuf"])
def receiver(request: pytest.FixtureRequest, pki: Pki) -> Iterator[GrpcReceiver | HttpReceiver]:
    r = GrpcReceiver(mtls=pki) if request.param == "grpc" else HttpReceiver(mtls=pki)
    r.protocol = request.param  # type: ignore[union-attr]
    with r:
        yield r


def _push(args: list[str], env: dict[str, str] | None = None) -> dict[str, int]:
    from offcpu_exporter.sinks.otlp.sink import OtlpSink

    snapshot = two_process_snapshot(sequence=1)
    config = config_from_args(["--otlp.interval", "1h", "--otlp.timeout", "2s", "--otlp.max-delay", "3s", *args],
                              env)
    assert config is not None
    sink = OtlpSink(config, context_of(lambda: snapshot), host_name="test-host")
    sink.publish(snapshot)
    sink.close(8)  # sends the pending profile, and the metrics once (the provider's shutdown)
    return dict(sink.stats.values())


def test_client_certificate_from_flags(receiver: GrpcReceiver | HttpReceiver, pki: Pki) -> None:
    stats = _push(["--otlp.endpoint", receiver.endpoint, "--otlp.protocol", receiver.protocol,  # type: ignore[union-attr]
                   "--otlp.certificate", str(pki.ca), "--otlp.client-certificate", str(pki.client_cert),
                   "--otlp.client-key", str(pki.client_key)])
    got = receiver.received
    assert len(got.profiles) == 1 and got.metrics, stats
    assert stats.get("sent") == 1


def test_client_certificate_from_per_signal_environment(receiver: GrpcReceiver | HttpReceiver, pki: Pki) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
           "OTEL_EXPORTER_OTLP_PROTOCOL": receiver.protocol,  # type: ignore[union-attr]
           "OTEL_EXPORTER_OTLP_CERTIFICATE": str(pki.ca),
           "OTEL_EXPORTER_OTLP_PROFILES_CLIENT_CERTIFICATE": str(pki.client_cert),
           "OTEL_EXPORTER_OTLP_PROFILES_CLIENT_KEY": str(pki.client_key),
           # metrics: the generic variables, here another CA's certificate, which the receiver refuses
           "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": str(pki.other_client_cert),
           "OTEL_EXPORTER_OTLP_CLIENT_KEY": str(pki.other_client_key)}
    stats = _push([], env)
    got = receiver.received
    assert len(got.profiles) == 1 and stats.get("sent") == 1
    assert not got.metrics and stats.get("metrics_failed", 0) >= 1, stats


@pytest.mark.parametrize("client", ["none", "other-ca"])
def test_no_or_foreign_client_certificate_is_refused(receiver: GrpcReceiver | HttpReceiver, pki: Pki,
                                                     client: str) -> None:
    extra = [] if client == "none" else ["--otlp.client-certificate", str(pki.other_client_cert),
                                          "--otlp.client-key", str(pki.other_client_key)]
    stats = _push(["--otlp.endpoint", receiver.endpoint, "--otlp.protocol", receiver.protocol,  # type: ignore[union-attr]
                   "--otlp.certificate", str(pki.ca), *extra])
    got = receiver.received
    assert not got.profiles and not got.metrics
    assert not stats.get("sent") and stats.get("dropped", 0) + stats.get("failed", 0) >= 1, stats


def test_client_certificate_needs_tls_and_its_key(pki: Pki, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs TLS"):
        config_from_args(["--otlp.endpoint", "http://127.0.0.1:4317", "--otlp.client-certificate",
                          str(pki.client_cert), "--otlp.client-key", str(pki.client_key)])
    with pytest.raises(ValueError, match="needs its key"):
        config_from_args(["--otlp.endpoint", "https://127.0.0.1:4317", "--otlp.client-certificate",
                          str(pki.client_cert)])
    with pytest.raises(ValueError, match="OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY: no such file"):
        config_from_args(["--no-otlp.profiles"], {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://127.0.0.1:4317",
                              "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": str(pki.client_cert),
                              "OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY": str(tmp_path / "missing.key")})
