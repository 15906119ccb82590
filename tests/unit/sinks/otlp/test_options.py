from __future__ import annotations

import argparse

import pytest

from offcpu_exporter.sinks.otlp.endpoints import SignalEndpoint
from offcpu_exporter.sinks.otlp.options import add_arguments
from testkit.otlp_sink import config_from_args


def test_off_without_an_endpoint() -> None:
    assert config_from_args([]) is None
    assert config_from_args(["--otlp.endpoint", "http://c:4317", "--no-otlp.profiles", "--no-otlp.metrics"]) is None


def _where(endpoint: SignalEndpoint | None) -> tuple[str, bool] | None:
    return None if endpoint is None else (endpoint.target, endpoint.insecure)


def test_flag_endpoint_grpc_and_http() -> None:
    grpc_cfg = config_from_args(["--otlp.endpoint", "http://collector:4317"])
    assert grpc_cfg is not None
    assert grpc_cfg.profiles == grpc_cfg.metrics == SignalEndpoint("collector:4317", insecure=True)
    http_cfg = config_from_args(["--otlp.endpoint", "https://c.example:4318/otlp/", "--otlp.protocol", "http/protobuf"])
    assert http_cfg is not None
    assert _where(http_cfg.profiles) == ("https://c.example:4318/otlp/v1development/profiles", False)
    assert _where(http_cfg.metrics) == ("https://c.example:4318/otlp/v1/metrics", False)
    assert http_cfg.metrics is not None and http_cfg.metrics.protocol == "http/protobuf"


def test_bare_host_port_means_tls_unless_insecure() -> None:
    cfg = config_from_args(["--otlp.endpoint", "collector:4317"])
    assert cfg is not None and _where(cfg.profiles) == ("collector:4317", False)
    cfg = config_from_args(["--otlp.endpoint", "collector:4317", "--otlp.insecure"])
    assert cfg is not None and _where(cfg.profiles) == ("collector:4317", True)
    cfg = config_from_args(["--otlp.endpoint", "collector:4318", "--otlp.protocol", "http/protobuf"])
    assert cfg is not None and _where(cfg.metrics) == ("https://collector:4318/v1/metrics", False)


def test_environment_defaults() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://gw:4318",
        "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT": "http://pyroscope:4040/custom/path",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_HEADERS": "X-Scope-OrgID=tenant%201,Authorization=Bearer abc",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "2500",
        "OTEL_METRIC_EXPORT_INTERVAL": "30000",
        "OTEL_EXPORTER_OTLP_COMPRESSION": "none",
    }
    cfg = config_from_args([], env)
    assert cfg is not None and cfg.profiles is not None and cfg.metrics is not None
    assert _where(cfg.profiles) == ("http://pyroscope:4040/custom/path", True)  # signal URL as-is
    assert _where(cfg.metrics) == ("http://gw:4318/v1/metrics", True)
    for signal in (cfg.profiles, cfg.metrics):
        assert signal.protocol == "http/protobuf" and signal.compression == "none" and signal.timeout == 2.5
        assert signal.headers == {"x-scope-orgid": "tenant 1", "authorization": "Bearer abc"}
    assert cfg.metrics_interval == 30.0
    # flags win over the environment
    cfg = config_from_args(["--otlp.endpoint", "http://other:4317", "--otlp.protocol", "grpc"], env)
    assert cfg is not None and _where(cfg.profiles) == ("other:4317", True)


def test_per_signal_environment_wins_over_the_generic_one_for_its_signal_only() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://gw:4317",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://metrics-gw:4318/otlp/v1/metrics",
        "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_HEADERS": "X-Scope-OrgID=everyone",
        "OTEL_EXPORTER_OTLP_PROFILES_HEADERS": "X-Scope-OrgID=profiles-tenant",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "3000",
        "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "500",
        "OTEL_EXPORTER_OTLP_PROFILES_COMPRESSION": "none",
        "OTEL_EXPORTER_OTLP_PROFILES_INSECURE": "false",
    }
    cfg = config_from_args([], env)
    assert cfg is not None and cfg.profiles is not None and cfg.metrics is not None
    assert cfg.metrics == SignalEndpoint("http://metrics-gw:4318/otlp/v1/metrics", True, "http/protobuf",
                                         {"x-scope-orgid": "everyone"}, 0.5, "gzip")
    # http:// with INSECURE=false: TLS, as the SDK does (the scheme only gives the default)
    assert cfg.profiles == SignalEndpoint("gw:4317", False, "grpc", {"x-scope-orgid": "profiles-tenant"}, 3.0, "none")
    # a flag applies to both signals, over every variable
    cfg = config_from_args(["--otlp.headers", "k=v", "--otlp.timeout", "1s", "--otlp.protocol", "grpc",
                            "--otlp.endpoint", "http://flag:4317"], env)
    assert cfg is not None and cfg.profiles is not None and cfg.metrics is not None
    for signal in (cfg.profiles, cfg.metrics):
        assert (signal.target, signal.protocol, signal.headers, signal.timeout) == ("flag:4317", "grpc", {"k": "v"},
                                                                                    1.0)


def test_insecure_from_environment() -> None:
    cfg = config_from_args([], {"OTEL_EXPORTER_OTLP_ENDPOINT": "c:4317", "OTEL_EXPORTER_OTLP_INSECURE": "true"})
    assert cfg is not None and _where(cfg.profiles) == ("c:4317", True)


@pytest.mark.parametrize(
    "args",
    [
        ["--otlp.endpoint", "http://c:4318/v1/metrics"],  # a path on a gRPC endpoint
        ["--otlp.endpoint", "ftp://c:21"],
        ["--otlp.endpoint", "https://c:4317", "--otlp.insecure"],
        ["--otlp.endpoint", "http://c:4317", "--otlp.certificate", "/nonexistent.pem"],
    ],
)
def test_contradictions_are_errors(args: list[str]) -> None:
    with pytest.raises(ValueError):
        config_from_args(args)


@pytest.mark.parametrize(
    "args",
    [
        ["--otlp.interval", "0"],
        ["--otlp.timeout", "abc"],
        ["--otlp.protocol", "http/json"],
        ["--otlp.service-name", "{exe}-{nope}"],
        ["--otlp.top-stacks", "0"],
    ],
)
def test_bad_values_exit_with_status_2(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="offcpu-exporter")
    add_arguments(parser, {})
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(args)
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_bad_environment_value_is_an_error_only_when_the_sink_is_on() -> None:
    assert config_from_args([], {"OTEL_EXPORTER_OTLP_TIMEOUT": "ten"}) is None
    with pytest.raises(ValueError, match="OTEL_EXPORTER_OTLP_TIMEOUT"):
        config_from_args(["--otlp.endpoint", "http://c:4317"], {"OTEL_EXPORTER_OTLP_TIMEOUT": "ten"})
    with pytest.raises(ValueError, match="OTEL_METRIC_EXPORT_INTERVAL"):
        config_from_args(["--otlp.endpoint", "http://c:4317"], {"OTEL_METRIC_EXPORT_INTERVAL": "-5"})
    with pytest.raises(ValueError, match="OTEL_EXPORTER_OTLP_PROTOCOL='http/json' is not one of"):
        config_from_args(
            [], {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}
        )
    with pytest.raises(ValueError, match="OTEL_EXPORTER_OTLP_COMPRESSION"):
        config_from_args(["--otlp.endpoint", "http://c:4317"], {"OTEL_EXPORTER_OTLP_COMPRESSION": "deflate"})
    # the flag replaces a bad environment value
    cfg = config_from_args(
        ["--otlp.endpoint", "http://c:4317", "--otlp.protocol", "grpc"], {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}
    )
    assert cfg is not None and cfg.profiles is not None and cfg.profiles.protocol == "grpc"
    # a bad per-signal value names its variable, and only stops the signal that is on
    with pytest.raises(ValueError, match="OTEL_EXPORTER_OTLP_PROFILES_TIMEOUT"):
        config_from_args(["--otlp.endpoint", "http://c:4317"], {"OTEL_EXPORTER_OTLP_PROFILES_TIMEOUT": "0"})
    assert config_from_args(["--otlp.endpoint", "http://c:4317", "--no-otlp.profiles"],
                            {"OTEL_EXPORTER_OTLP_PROFILES_TIMEOUT": "0"}) is not None


def test_create_reports_contradictions_as_startup_errors() -> None:
    from offcpu_exporter.sinks.otlp.sink import create
    from testkit.otlp_sink import context_of

    parser = argparse.ArgumentParser()
    add_arguments(parser, {})
    options = parser.parse_args(["--otlp.endpoint", "http://c:4318/v1/metrics"])
    with pytest.raises(ValueError, match="gRPC endpoint has no path"):
        create(options, context_of(lambda: None))  # type: ignore[arg-type,return-value]
