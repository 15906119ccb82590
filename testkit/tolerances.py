"""Tolerances of the real-kernel tests against the kernel's own figures and the workloads' timing."""

from __future__ import annotations

import os

# Under the kernel matrix's emulation (QEMU TCG, ~25x slower, emulated clocks) system calls and
# wake-ups are slow enough that edge effects of a few ms show on 100 ms windows: the tolerances
# double there, and say so in docs/kernel-matrix.md. On a real machine they are the issue's.
EMULATED = "OFFCPU_GUEST_KERNEL" in os.environ
TIME = 0.10 if EMULATED else 0.05  # off-CPU time against the workload's own timing
# On-CPU + off-CPU against wall time. Under TCG the guest's CPU-time accounting and its clocks are
# emulated and its vCPUs are host threads sharing 2 cores: 200 ms windows were seen 9% off there.
WALL = 0.12 if EMULATED else 0.01
COUNT = 0.02  # switch counts against the workload's blocking calls
SLACK = 1 if EMULATED else 0  # switches either way, on top
EDGE = 0.05 if EMULATED else 0.01  # bounds that hold exactly but for clock edges
