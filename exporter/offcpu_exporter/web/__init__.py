"""The exporter's HTTP surface: handlers are registered by path, served by `offcpu_exporter.web.server`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

__all__ = ["Handler", "Request", "Response", "Routes"]


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: Mapping[str, list[str]]
    headers: Mapping[str, str]  # lower-case names

    def arg(self, name: str, default: str | None = None) -> str | None:
        values = self.query.get(name)
        return values[-1] if values else default


@dataclass(frozen=True)
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: Mapping[str, str] = field(default_factory=dict)


# Handlers run on a server worker thread; they may block (a pprof profile waits N seconds)
# without stopping other requests or the probe loop.
Handler = Callable[[Request], Response]


class Routes:
    def __init__(self) -> None:
        self._routes: dict[str, Handler] = {}

    def add(self, path: str, handler: Handler) -> None:
        if path in self._routes:
            raise ValueError(f"route {path} registered twice")
        self._routes[path] = handler

    def get(self, path: str) -> Handler | None:
        return self._routes.get(path)

    def paths(self) -> list[str]:
        return sorted(self._routes)
