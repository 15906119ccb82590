"""Renders a local HTML page in headless Chromium (Debian `chromium`): a screenshot and the DOM
after the page's scripts ran."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
)


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("no chromium (Debian chromium, installed by scripts/setup --test)")


def _run(url: str, *extra: str, size: tuple[int, int]) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile_dir:
        return subprocess.run(
            [
                _chromium(),
                *_FLAGS,
                f"--user-data-dir={profile_dir}",
                f"--window-size={size[0]},{size[1]}",
                *extra,
                url,
            ],
            capture_output=True,
            text=True,
            timeout=90,
            check=True,
        )


def screenshot(page: Path, png: Path, size: tuple[int, int] = (1200, 800)) -> None:
    png.parent.mkdir(parents=True, exist_ok=True)
    png.unlink(missing_ok=True)
    _run(page.resolve().as_uri(), f"--screenshot={png}", size=size)
    assert png.stat().st_size > 1000, "chromium wrote no screenshot"


def dump_dom(page: Path, query: str = "", size: tuple[int, int] = (1200, 800)) -> str:
    url = page.resolve().as_uri() + (f"?{query}" if query else "")
    return _run(url, "--dump-dom", size=size).stdout
