"""`scripts/test --quick`: what it runs exists, and the smoke test in it loads the real probe.
A renamed or moved test would otherwise leave the quick lane running nothing of the kernel."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _quick_pytest_args() -> list[str]:
    script = (ROOT / "scripts" / "test").read_text()
    block = script[script.index('if [ "$quick" = 1 ]') :]
    command = block[block.index("-m pytest") : block.index('"$@"')].replace("\\\n", " ")
    return re.findall(r'"[^"]*"|\S+', command)[2:]  # after "-m pytest"


def test_the_quick_lane_collects_unit_tests_and_a_kernel_smoke_test() -> None:
    args = [a.strip('"') for a in _quick_pytest_args()]
    assert "tests/unit" in args and "not slow" in args
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "kernel",
         *[a for a in args if a.startswith("tests/e2e")]],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    collected = [line for line in out.stdout.splitlines() if "::" in line]
    assert len(collected) == 1 and "test_probe.py::" in collected[0], out.stdout
