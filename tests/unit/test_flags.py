"""One flag style (node_exporter's dotted `--component.option`) and `--log.format json` writing real
JSON lines."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from offcpu_exporter import cli
from offcpu_exporter.logfmt import JsonFormatter, LogfmtFormatter

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "offcpu_exporter", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


def test_node_exporter_names() -> None:
    help_text = _run("serve", "--help").stdout
    for flag in ("--log.level", "--log.format", "--web.listen-address", "--web.config.file", "--config.file",
                 "--otlp.endpoint", "--no-otlp.metrics", "--skywalking.endpoint", "--kubernetes.metadata"):
        assert flag in help_text, flag


def test_one_style() -> None:
    parser = cli.build_parser()
    for sub in cli._subparsers(parser):
        for action in sub._actions:
            for flag in action.option_strings:
                # --component.option or a plain --option of the exporter itself; words joined by dashes.
                assert flag in ("-h", "-o") or (flag.startswith("--") and "_" not in flag), flag
                assert not any(flag.startswith(f"--{p}-") for p in ("log", "otlp", "skywalking", "kubernetes",
                                                                     "web", "prometheus", "pprof")), flag


@pytest.mark.parametrize("argv", [["serve", "--log-level", "debug"], ["serve", "--otlp-endpoint=http://127.0.0.1:4317"],
                                  ["serve", "--no-otlp-metrics"]])
def test_dashed_spellings_are_not_flags(argv: list[str]) -> None:
    """Only the dotted names exist: a dashed spelling is an unknown flag, not an alias."""
    with pytest.raises(SystemExit):
        cli.parse_args(argv)


def test_dashed_config_file_key_is_unknown(tmp_path: Path) -> None:
    config = tmp_path / "c.yml"
    config.write_text("otlp-timeout: 3s\n")
    r = _run("serve", "--config.file", str(config))
    assert r.returncode == 2 and "unknown option 'otlp-timeout'" in r.stderr, r.stderr


def test_log_format_json_writes_json_lines() -> None:
    r = _run("record", "--log.format", "json", "--pid", "999999")
    assert r.returncode != 0
    records = [json.loads(line) for line in r.stderr.splitlines() if line.startswith("{")]
    assert records, r.stderr
    assert set(records[0]) >= {"time", "level", "source", "msg"} and records[0]["time"].endswith("Z")


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
