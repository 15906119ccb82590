"""Runs `go tool pprof` (Debian golang-go) on a profile and reads its -top table."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

__all__ = ["go_pprof", "top_cum"]


def go_pprof(tmp_path: Path, *args: str) -> str:
    go = shutil.which("go")
    if go is None:
        # In CI a missing peer is a broken setup, not a reason to skip.
        missing = pytest.fail if os.environ.get("CI") else pytest.skip
        missing("go (Debian golang-go, installed by scripts/setup --test) is not on PATH")
    env = dict(os.environ, HOME=str(tmp_path), GOCACHE=str(tmp_path / "gocache"), GOFLAGS="")
    done = subprocess.run(
        [go, "tool", "pprof", *args], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def top_cum(output: str) -> dict[str, float]:
    """Function -> cum value from `go tool pprof -top -unit=ms` (or a count)."""
    result = {}
    for line in output.splitlines():
        m = re.match(r"\s*([\d.]+)(?:ms)?\s+[\d.]+%\s+[\d.]+%\s+([\d.]+)(?:ms)?\s+[\d.]+%\s+(.+)$", line)
        if m:
            result[m.group(3).strip()] = float(m.group(2))
    return result
