"""Bad flags and config files: one line on stderr, exit status 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from offcpu_exporter.cli import core_config, parse_args

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "offcpu_exporter", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("args", [
    ["record", "--comm", "("],
    ["record", "--pid", "abc"],
    ["record", "--pid", "-3"],
    ["record"],
    ["serve", "--all", "--pid", "1"],
    ["serve", "--attach", "uprobe"],
    ["serve", "--flush-interval", "0"],
    ["record", "--all", "--min-block", "10ms", "--max-block", "1ms"],
    ["bogus"],
])
def test_bad_flags_one_line_exit_2(args: list[str]) -> None:
    r = _run(*args)
    assert r.returncode == 2, r
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("offcpu-exporter: error:")


@pytest.mark.parametrize("text,message", [
    ("flush-interval: fast\n", "flush-interval"),
    ("pid: [1, two]\n", "pid"),
    ("all: yes please\n", "all: expected true or false"),
    ("no-such-option: 1\n", "unknown option 'no-such-option'"),
    ("[1, 2]\n", "expected a mapping"),
    ("comm: '('\n", "invalid regular expression"),
    ("a: [\n", "not valid YAML"),
])
def test_bad_config_file(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "c.yml"
    path.write_text(text)
    r = _run("serve", "--config.file", str(path))
    assert r.returncode == 2
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_config_file_sets_defaults_and_flags_override(tmp_path: Path) -> None:
    path = tmp_path / "c.yml"
    path.write_text("flush_interval: 2\npid: [10, 11]\nper-thread: true\nmin-block: 5ms\n")
    options = parse_args(["serve", "--config.file", str(path), "--flush-interval", "3"])
    assert options.flush_interval == 3.0
    assert options.pid == [10, 11]
    assert options.per_thread is True
    assert options.min_block == 5_000_000
    assert not options.all


def test_serve_defaults_to_every_process() -> None:
    config = core_config(parse_args(["serve"]))
    assert config.rules.watch_all is True and config.probe.watch_all is True
