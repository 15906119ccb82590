"""One flag style (node_exporter's dotted `--component.option`), the former dashed spellings kept as
hidden aliases that log a deprecation, and `--log.format json` writing real JSON lines."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest

from offcpu_exporter import cli
from offcpu_exporter.config import deprecated_spellings
from offcpu_exporter.logfmt import JsonFormatter, LogfmtFormatter

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "offcpu_exporter", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


def _deprecated() -> dict[str, str]:
    return deprecated_spellings(cli._subparsers(cli.build_parser()))


def test_node_exporter_names() -> None:
    help_text = _run("serve", "--help").stdout
    for flag in ("--log.level", "--log.format", "--web.listen-address", "--web.config.file", "--config.file",
                 "--otlp.endpoint", "--no-otlp.metrics", "--skywalking.endpoint", "--kubernetes.metadata"):
        assert flag in help_text, flag


def test_one_style_and_old_spellings_hidden() -> None:
    old = _deprecated()
    assert {"--log-level", "--config", "--otlp-endpoint", "--no-otlp-metrics", "--skywalking-endpoint",
            "--kubernetes-metadata"} <= old.keys()
    parser = cli.build_parser()
    for sub in cli._subparsers(parser):
        text = sub.format_help()
        for spelling in old:
            assert not re.search(rf"(?<![\w.-]){re.escape(spelling)}(?![\w.-])", text), spelling
        for action in sub._actions:
            for flag in action.option_strings:
                # --component.option or a plain --option of the exporter itself; words joined by dashes.
                assert flag in ("-h", "-o") or (flag.startswith("--") and "_" not in flag), flag
                assert not any(flag.startswith(f"--{p}-") for p in ("log", "otlp", "skywalking", "kubernetes",
                                                                     "web", "prometheus", "pprof")), flag


def test_old_spellings_still_work(tmp_path: Path) -> None:
    config = tmp_path / "c.yml"
    config.write_text("otlp-timeout: 3s\nkubernetes.refresh-interval: 1m\n")
    options = cli.parse_args(["serve", "--log-level", "debug", "--otlp-endpoint=http://127.0.0.1:4317",
                              "--no-otlp-metrics", "--kubernetes-metadata", "off", "--config", str(config)])
    assert (options.log_level, options.otlp_endpoint, options.otlp_metrics, options.kubernetes_metadata) == (
        "debug", "http://127.0.0.1:4317", False, "off")
    assert options.otlp_timeout == 3.0 and options.kubernetes_refresh_interval == 60.0
    assert sorted(options._deprecated) == sorted([
        ("--log-level", "--log.level"), ("--otlp-endpoint", "--otlp.endpoint"),
        ("--no-otlp-metrics", "--no-otlp.metrics"),
        ("--kubernetes-metadata", "--kubernetes.metadata"), ("--config", "--config.file"),
        ("otlp-timeout", "otlp.timeout")])


def test_deprecated_spelling_logs_a_warning_as_json(tmp_path: Path) -> None:
    empty = tmp_path / "empty.sw"
    empty.write_bytes(b"")
    r = _run("skywalking-dump", "--log-level", "info", "--log.format", "json", str(empty))
    assert r.returncode == 0, r.stderr
    records = [json.loads(line) for line in r.stderr.splitlines()]
    assert {"level": "warn", "source": "offcpu_exporter",
            "msg": "--log-level is deprecated and will be removed: use --log.level"}.items() <= records[0].items()
    assert records[0]["time"].endswith("Z")


def test_formats_one_line_each() -> None:
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        record = logging.LogRecord("offcpu_exporter.probe", logging.ERROR, __file__, 1, 'say "%s"', ("a b=c\\",),
                                   sys.exc_info())
    line = JsonFormatter().format(record)
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed["level"] == "error" and parsed["msg"] == 'say "a b=c\\"' and "second line" in parsed["err"]
    line = LogfmtFormatter().format(record)
    assert "\n" not in line
    assert ' level=error source=offcpu_exporter.probe msg="say \\"a b=c\\\\\\"" err="Traceback' in line, line


@pytest.mark.parametrize("fmt", ["yaml", ""])
def test_bad_log_format(fmt: str) -> None:
    r = _run("serve", "--log.format", fmt)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_log_level_warn_is_warning(tmp_path: Path) -> None:
    # node_exporter's spelling, on the command line and in a config file.
    assert cli.parse_args(["serve", "--log.level", "warn"]).log_level == "warning"
    config = tmp_path / "c.yml"
    config.write_text("log.level: warn\n")
    assert cli.parse_args(["record", "--pid", "1", "--config.file", str(config)]).log_level == "warning"
    with pytest.raises(SystemExit):
        cli.parse_args(["serve", "--log.level", "warnings"])
