from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testkit.symbol_programs import Program, start


@pytest.fixture
def run() -> Iterator[Callable[..., Program]]:
    """Start test programs; every one is stopped (and its perf map removed) at the end."""
    started: list[Program] = []

    def _run(binary: Path | str, *args: str, cwd: Path | None = None) -> Program:
        program = start([str(binary), *args], cwd=cwd)
        started.append(program)
        return program

    yield _run
    for program in started:
        program.stop()
