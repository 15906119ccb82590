"""Switch counts against the kernel's own schedstat run counts (field 3), on this machine's
kernel. Not part of the kernel matrix: Debian 6.1's schedstat counts only switch-ins after a
wake-up, and under emulation its figures do not line up with the workload's own (see
docs/kernel-matrix.md)."""

from __future__ import annotations

import pytest

from offcpu_exporter.probe.loader import Probe
from offcpu_exporter.snapshot import Reason
from testkit.inprocess import in_window, observe, total
from testkit.tolerances import COUNT, SLACK
from testkit.workloads import Workload

pytestmark = pytest.mark.kernel


def test_switch_counts_match_schedstat(probe: Probe) -> None:
    """The kernel's own count of a thread's runs (schedstat field 3) against the probe's switches.
    Newer kernels (6.18 here) count every switch-in there; 6.1 counts only those after a wake-up
    (a preempted task is re-queued without the timestamp sched_info_arrive() needs). So it lies
    between the probe's blocking switches and all its switches: fewer means lost blocks, more means
    lost or doubled switches. Immune to CPU load."""
    with Workload("mutex", threads=3, iterations=20, interval_ms=5) as w:
        result, snap = observe(w, probe=probe)
    slack = 2 + 2 * SLACK  # the schedstat reads sit inside the window, a switch or so from its edges
    for thread in result.threads:
        window = in_window(snap, thread.tid)
        every = total(window).count
        blocking = total([s for s in window if s.reason is not Reason.RUNNABLE]).count
        assert blocking - slack <= thread.switches <= every + slack, (blocking, every, thread)
        # This machine's kernel counts preemptions too: all switches, one for one.
        assert abs(every - thread.switches) <= max(slack, COUNT * thread.switches), thread
