"""Golden files: the one switch that rewrites them, and the rule that a rewrite never passes.

With OFFCPU_UPDATE_GOLDEN=1 a golden test writes what it produced to its file and then fails, so
that a run with the switch set can never be mistaken for a passing one: review the diff, then run
again without the switch.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SWITCH = "OFFCPU_UPDATE_GOLDEN"


def rewrite_if_requested(path: Path, text: str) -> None:
    """With the switch set, write `text` to the golden file `path` and fail the test."""
    if os.environ.get(SWITCH) != "1":
        return
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    pytest.fail(f"golden file rewritten: review the diff and run again without {SWITCH} ({path})")
