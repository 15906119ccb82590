"""KernelFacts: the kernel's version, parsed once from its release, and the features gated on it."""

from __future__ import annotations

import dataclasses
import os

import pytest

from offcpu_exporter.probe.attach import choose_mode
from offcpu_exporter.probe.facts import KernelFacts, kernel_version, probe_kernel

_FACTS = KernelFacts(release="6.1.0-57-amd64", tracefs="/sys/kernel/tracing", btf=True, kprobes=True,
                     sched_switch_tracepoint=True, sched_exit_tracepoint=True, kallsyms_readable=True,
                     finish_task_switch=("finish_task_switch.isra.0",), headers_dir=None, headers_release=None)


@pytest.mark.parametrize(("release", "version"), [
    ("6.1.0-57-amd64", (6, 1)),  # Debian
    ("5.15.0", (5, 15)),
    ("6.12.9+rt", (6, 12)),
    ("5.4.0-1103-aws", (5, 4)),
    ("6.8-rc3", (6, 8)),  # a release candidate: no patch level
    ("6.18.0-0.rc7.60.fc44.x86_64", (6, 18)),
    ("", (0, 0)),  # nothing to parse: every version-gated feature counts as absent
    ("linux", (0, 0)),
])
def test_the_version_is_the_releases_major_and_minor(release: str, version: tuple[int, int]) -> None:
    assert kernel_version(release) == version
    assert dataclasses.replace(_FACTS, release=release).version == version


def test_the_running_kernels_version_by_default() -> None:
    assert kernel_version() >= (4, 0)


@pytest.mark.parametrize(("release", "btf", "raw_sched_switch", "task_regs_btf"), [
    ("6.1.0-57-amd64", True, True, True),
    ("5.18.0", True, True, True),
    ("5.17.15", True, False, True),
    ("5.15.0", True, False, True),
    ("5.14.21", True, False, False),
    ("6.12.9+rt", False, False, False),  # no BTF: neither, whatever the version
])
def test_features_gated_on_the_version_and_btf(release: str, btf: bool, raw_sched_switch: bool,
                                               task_regs_btf: bool) -> None:
    facts = dataclasses.replace(_FACTS, release=release, btf=btf)
    assert (facts.raw_sched_switch, facts.task_regs_btf) == (raw_sched_switch, task_regs_btf)


@pytest.mark.parametrize(("btf", "headers_release", "kprobes", "mode", "why"), [
    # The fleet's usual case: headers of another kernel in the image, BTF in the kernel.
    (True, "6.1.0-57-amd64", True, "kprobe", "task_struct layout from BTF"),
    (True, None, True, "kprobe", "task_struct layout from BTF"),
    (False, "6.12.9+rt", True, "kprobe", "headers that match the kernel"),
    (False, "6.1.0-57-amd64", True, "tracepoint", "no BTF and the kernel headers (6.1.0-57-amd64) do not match"),
    (True, "6.12.9+rt", False, "tracepoint", "kernel has no kprobes"),
])
def test_auto_picks_the_kprobe_wherever_it_reads_task_struct_exactly(
        btf: bool, headers_release: str | None, kprobes: bool, mode: str, why: str) -> None:
    facts = dataclasses.replace(_FACTS, release="6.12.9+rt", btf=btf, kprobes=kprobes,
                                headers_dir="/lib/modules/6.12.9+rt/build", headers_release=headers_release)
    chosen, reason = facts.auto_attach()
    assert chosen == mode
    assert why in reason


@pytest.mark.parametrize(("btf", "release", "mode"), [
    (True, "6.12.9+rt", "tracepoint"),  # the raw tracepoint: a guard of its own
    (True, "5.17.15-rt", "kprobe"),  # no raw sched_switch with prev_state: the perf-event tracepoint
    (False, "6.12.9+rt", "kprobe"),  # shares the kprobe's guard, so it would not be better
])
def test_auto_keeps_the_kprobe_off_preempt_rt_where_the_raw_tracepoint_serves(btf: bool, release: str,
                                                                              mode: str) -> None:
    facts = dataclasses.replace(_FACTS, release=release, btf=btf, preempt_rt=True,
                                headers_dir=f"/lib/modules/{release}/build", headers_release=release)
    chosen, reason = facts.auto_attach()
    assert chosen == mode
    assert ("PREEMPT_RT" in reason) == (mode == "tracepoint")
    assert dataclasses.replace(facts, preempt_rt=False).auto_attach()[0] == "kprobe"


def test_asking_for_the_kprobe_on_preempt_rt_warns_of_the_unseen_switches(caplog: pytest.LogCaptureFixture) -> None:
    rt = dataclasses.replace(_FACTS, release="6.12.9+rt", preempt_rt=True)
    assert choose_mode("kprobe", rt) == ("kprobe", "asked for with --attach")
    assert "offcpu_exporter_probe_skipped_runs_total" in caplog.text
    caplog.clear()
    choose_mode("kprobe", _FACTS)
    choose_mode("tracepoint", rt)
    assert caplog.text == ""


def test_the_running_kernels_preemption_model_is_read() -> None:
    assert probe_kernel().preempt_rt == ("PREEMPT_RT" in os.uname().version)
