"""Kernel tests (`@pytest.mark.kernel`) load the real probe; root tests (`@pytest.mark.root`) read
what only root may (real kallsyms addresses). Where they cannot run (no root, no BPF) they fail, so
that CI never passes without them; a developer without root skips them explicitly with
OFFCPU_SKIP_KERNEL=1 (ignored when CI is set). `@pytest.mark.rt_kernel` tests run on PREEMPT_RT
kernels only."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.as_nobody import nobody_workload


def _unavailable(probe: bool) -> str | None:
    """Why this machine cannot run the test: root always, and for the probe tracefs and bcc too."""
    if os.geteuid() != 0:
        return "needs root (CAP_BPF/CAP_PERFMON)" if probe else "needs root"
    if not probe:
        return None
    if not os.path.isdir("/sys/kernel/tracing/events") and not os.path.isdir("/sys/kernel/debug/tracing/events"):
        return "tracefs is not mounted (run scripts/setup)"
    try:
        import bcc  # noqa: F401
    except ImportError:
        return "bcc is not importable (run scripts/setup and use .venv/bin/python)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests of a PREEMPT_RT kernel's own behaviour (`@pytest.mark.rt_kernel`) are deselected on
    other kernels: the kernel matrix runs them in its 6.12-rt legs, where they must pass."""
    if "PREEMPT_RT" in os.uname().version:
        return
    rt_only = [item for item in items if item.get_closest_marker("rt_kernel") is not None]
    if rt_only:
        config.hook.pytest_deselected(items=rt_only)
        items[:] = [item for item in items if item.get_closest_marker("rt_kernel") is None]


@pytest.fixture(autouse=True)
def _kernel_gate(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("kernel") is not None:
        reason = _unavailable(probe=True)
    elif request.node.get_closest_marker("root") is not None:
        reason = _unavailable(probe=False)
    else:
        return
    if reason is None:
        return
    if os.environ.get("OFFCPU_SKIP_KERNEL") == "1" and not os.environ.get("CI"):
        pytest.skip(f"kernel test skipped on request: {reason}")
    pytest.fail(f"kernel test cannot run: {reason} (set OFFCPU_SKIP_KERNEL=1 to skip explicitly)")


@pytest.fixture(scope="module")
def other_users_binary() -> Iterator[Path]:
    """The workload run as nobody from a binary only nobody can read (testkit/as_nobody.py)."""
    with nobody_workload() as wrapper:
        yield wrapper
