"""Headless Chromium (Debian `chromium`) for page tests: a screenshot, the DOM after the page's
scripts ran, and a `Page` driven with real input events over the DevTools protocol."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

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
    # In CI a missing peer is a broken setup, not a reason to skip.
    missing = pytest.fail if os.environ.get("CI") else pytest.skip
    missing("no chromium (Debian chromium, installed by scripts/setup --test)")


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


class Page:
    """A page driven over the DevTools protocol (--remote-debugging-pipe: commands on fd 3,
    replies on fd 4, NUL-terminated JSON), to click, hover, type and resize like a person."""

    def __init__(self, url: str, size: tuple[int, int] = (1200, 800), timeout: float = 30.0) -> None:
        self._timeout = timeout
        self._next_id = 0
        self._buffer = b""
        self._profile_dir = tempfile.TemporaryDirectory(prefix="chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def child_fds() -> None:
            os.dup2(to_browser_r, 3)
            os.dup2(from_browser_w, 4)

        self._proc = subprocess.Popen(
            [
                _chromium(),
                *_FLAGS,
                f"--user-data-dir={self._profile_dir.name}",
                f"--window-size={size[0]},{size[1]}",
                "--remote-debugging-pipe",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=child_fds,
            # preexec_fn runs before the child closes other fds: keep the two it just made.
            pass_fds=(3, 4),
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        target = self._call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self._session = self._call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.resize(*size)
        self.call("Page.navigate", {"url": url})
        self.wait_for("document.readyState === 'complete'")

    def _send(self, method: str, params: dict[str, Any], session: str | None) -> int:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        return self._next_id

    def _call(self, method: str, params: dict[str, Any], session: str | None = None) -> dict[str, Any]:
        wanted = self._send(method, params, session)
        deadline = time.monotonic() + self._timeout
        while True:
            while b"\0" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == wanted:
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error']}")
                    return reply.get("result", {})  # type: ignore[no-any-return]
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise TimeoutError(f"chromium did not answer {method}")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium exited")
            self._buffer += chunk

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self._call(method, params or {}, self._session)

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str) -> None:
        deadline = time.monotonic() + self._timeout
        while not self.evaluate(f"!!({expression})"):
            if time.monotonic() > deadline:
                raise TimeoutError(expression)
            time.sleep(0.05)

    def mouse(self, kind: str, x: float, y: float) -> None:
        """A real input event at viewport coordinates (kind: mouseMoved, mousePressed, mouseReleased)."""
        params: dict[str, Any] = {"type": kind, "x": x, "y": y}
        if kind != "mouseMoved":
            params.update(button="left", clickCount=1)
        self.call("Input.dispatchMouseEvent", params)

    def click(self, x: float, y: float) -> None:
        self.mouse("mouseMoved", x, y)
        self.mouse("mousePressed", x, y)
        self.mouse("mouseReleased", x, y)

    def key(self, key: str) -> None:
        for kind in ("keyDown", "keyUp"):
            self.call("Input.dispatchKeyEvent", {"type": kind, "key": key, "code": key})

    def type_text(self, text: str) -> None:
        self.call("Input.insertText", {"text": text})

    def resize(self, width: int, height: int) -> None:
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )

    def screenshot(self, png: Path) -> None:
        data = self.call("Page.captureScreenshot", {"format": "png"})["data"]
        png.parent.mkdir(parents=True, exist_ok=True)
        png.write_bytes(base64.b64decode(data))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._call("Browser.close", {})
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)
        self._profile_dir.cleanup()

    def __enter__(self) -> Page:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
