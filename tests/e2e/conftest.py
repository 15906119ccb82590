"""Fixtures of the end-to-end tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from offcpu_exporter.probe.loader import Probe, ProbeConfig
from testkit.inprocess import ATTACH


@pytest.fixture(scope="module")
def probe() -> Iterator[Probe]:
    """One started probe (per-thread, the default options) for a module's tests that need nothing
    else: it saves a compile per test (~0.5 s here, ~25 s under the kernel matrix's emulation)."""
    shared = Probe(ProbeConfig(attach=ATTACH, per_thread=True))
    shared.start()
    yield shared
    shared.close()
