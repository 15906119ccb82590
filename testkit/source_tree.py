"""A copy of the project as a user gets it, to build and install without writing into the checkout
(pip builds in the source tree: build/ and egg-info would land in it)."""

from __future__ import annotations

import shutil
from pathlib import Path

__all__ = ["ROOT", "copy_of_the_project"]

ROOT = Path(__file__).resolve().parents[1]

# What a user's copy of the project does not have (or what would hide a missing package-data entry).
_NOT_SHIPPED = shutil.ignore_patterns(".git", ".venv", "__pycache__", "build", "dist", "*.egg-info", "artifacts",
                                      "node_modules", "tests", "bench")


def copy_of_the_project(destination: Path) -> Path:
    shutil.copytree(ROOT, destination, ignore=_NOT_SHIPPED, symlinks=True)
    return destination
