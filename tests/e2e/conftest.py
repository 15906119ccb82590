"""Fixtures of the end-to-end tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Literal

import pytest

from offcpu_exporter.probe.loader import Probe, ProbeConfig
from testkit.inprocess import ATTACH


def _probe_scope(fixture_name: str, config: pytest.Config) -> Literal["session", "module"]:
    # In a kernel-matrix guest a compile takes 25-80 s (QEMU emulates the CPU): one probe serves the
    # whole session there, where the modules' tests run one after the other with the same options.
    return "session" if "OFFCPU_GUEST_KERNEL" in os.environ else "module"


@pytest.fixture(scope=_probe_scope)
def probe() -> Iterator[Probe]:
    """One started probe (per-thread, the default options) for a module's tests that need nothing
    else: it saves a compile per test (~0.5 s here, ~25 s under the kernel matrix's emulation, more
    on 6.12, whose headers take longer to compile; there one probe serves the session)."""
    shared = Probe(ProbeConfig(attach=ATTACH, per_thread=True))
    shared.start()
    yield shared
    shared.close()
