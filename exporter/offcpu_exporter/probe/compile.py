"""The probe's program: bpf/offcpu.bpf.c's text and the compiler flags the config and the kernel
call for (the hook variant, task_struct offsets read from BTF, the DWARF unwinder's settings), and
its compile and load by bcc."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from offcpu_exporter.probe import layout
from offcpu_exporter.probe.btf import BtfError, struct_member_bit_offsets, struct_member_offsets
from offcpu_exporter.probe.compiler_memory import release_compiler_memory
from offcpu_exporter.probe.config import ProbeConfig, ProbeError
from offcpu_exporter.probe.facts import KernelFacts
from offcpu_exporter.unwind import UnwindConfig, bpf_text

__all__ = ["Program", "build_program", "import_bcc", "load"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Program:
    variant: str  # the hook it is built for: kprobe, tracepoint or raw_tracepoint (-DOFFCPU_ATTACH_*)
    text: str
    cflags: tuple[str, ...]
    unwind: UnwindConfig | None  # the DWARF unwinder's build settings; None: user stacks by frame pointers


def import_bcc():  # type: ignore[no-untyped-def]
    try:
        import bcc
    except ImportError as e:
        raise ProbeError(
            "the bcc Python module is missing: install Debian's python3-bpfcc (scripts/setup does) and run "
            "from a virtualenv made with --system-site-packages; PyPI's 'bcc' is an unrelated package"
        ) from e
    return bcc


def build_program(config: ProbeConfig, facts: KernelFacts, mode: str) -> Program:
    """The program for attach `mode` ("kprobe" or "tracepoint") on this kernel."""
    if facts.headers_dir is None:
        raise ProbeError(
            f"no kernel headers for {facts.release} under /lib/modules/{facts.release}/build: "
            "run scripts/setup (installs linux-headers or links Debian's generic ones)"
        )
    if mode == "kprobe" and not facts.headers_match:
        log.warning(
            "kernel headers are %s but the kernel is %s: task_struct offsets may be wrong in kprobe mode",
            facts.headers_release, facts.release,
        )
    variant, extra = mode, []
    if mode == "tracepoint" and config.raw_tracepoint is not False:
        pid_offset = _task_pid_offset(facts)
        if pid_offset is not None:
            variant, extra = "raw_tracepoint", [f"-DTASK_PID_OFFSET={pid_offset}"]
        elif config.raw_tracepoint:
            raise ProbeError("raw tracepoint asked for, but task_struct.pid is not in /sys/kernel/btf/vmlinux")
    if mode == "kprobe":
        extra = _task_load_bit(facts)
    extra = [*extra, *_task_runtime_offsets(facts)]
    text = (layout.BPF_DIR / layout.SOURCE).read_text()
    unwind = _unwind_config(config, facts)
    if unwind is not None:
        text = bpf_text(text)
        extra = [*extra, "-DOFFCPU_UNWIND=1", *unwind.cflags()]
    else:
        extra = [*extra, "-DOFFCPU_UNWIND=0"]
    return Program(variant, text, tuple(config.cflags(variant, extra)), unwind)


def load(bcc: Any, program: Program) -> Any:
    """The program compiled and loaded into the kernel (bcc.BPF); tracepoint programs are attached
    as they load, kprobes are not."""
    try:
        bpf = bcc.BPF(text=program.text.encode(), cflags=list(program.cflags))
    except Exception as e:  # bcc raises a bare Exception with the compiler's message
        raise ProbeError(f"the BPF program failed to compile or load: {e}") from e
    released = release_compiler_memory()
    log.debug("compiler memory released: %d MB of code advised out", released >> 20)
    return bpf


def _task_pid_offset(facts: KernelFacts) -> int | None:
    if not facts.raw_sched_switch:
        return None
    try:
        bits = struct_member_bit_offsets("task_struct", ["pid"]).get("pid")
    except BtfError as e:
        log.warning("BTF unreadable (%s): using the perf-event tracepoint", e)
        return None
    return None if bits is None else bits // 8


def _unwind_config(config: ProbeConfig, facts: KernelFacts) -> UnwindConfig | None:
    """The unwinder's build settings, or None when user stacks stay with frame pointers. The
    walk reads the task's saved user registers: through BTF (5.15+), or else at the kernel
    headers' offsets, which only matching headers give."""
    if not config.unwind:
        return None
    if facts.task_regs_btf:
        return UnwindConfig(regs_btf=True)
    if facts.headers_match:
        return UnwindConfig(regs_btf=False)
    log.warning("user stacks with frame pointers only: no BTF (5.15+) and no headers matching the kernel "
                "to find a task's user registers for the DWARF unwinder")
    return None


def _task_runtime_offsets(facts: KernelFacts) -> list[str]:
    """Where a task's run time and its switches are (task_struct::se.sum_exec_runtime,
    se.prev_sum_exec_runtime, nvcsw and nivcsw): the end of a block whose switch-in the kernel
    did not report (end_unseen_block() in the BPF program), and the time a running thread lost
    without a switch (charge_stolen()). Without BTF neither is counted."""
    if not facts.btf:
        return []
    try:
        task = struct_member_offsets("task_struct", ["se", "nvcsw", "nivcsw"])
        runtime = struct_member_offsets("sched_entity", ["sum_exec_runtime", "prev_sum_exec_runtime"])
    except BtfError as e:
        log.warning("BTF unreadable (%s): blocks whose switch-in goes unreported, and time stolen from running "
                    "threads, are not counted", e)
        return []
    se = task.get("se")
    if se is None or len(runtime) != 2:
        return []
    flags = [f"-DTASK_SE_RUNTIME_OFFSET={se + runtime['sum_exec_runtime']}",
             f"-DTASK_SE_PREV_RUNTIME_OFFSET={se + runtime['prev_sum_exec_runtime']}"]
    if "nvcsw" in task and task.get("nivcsw") == task["nvcsw"] + 8:  # read as one pair
        flags.append(f"-DTASK_SWITCHES_OFFSET={task['nvcsw']}")
    return flags


def _task_load_bit(facts: KernelFacts) -> list[str]:
    """Where task_struct::sched_contributes_to_load is: the reason of a task that is being woken
    while it switches out (see reason_of_task_state() in the BPF program)."""
    if not facts.btf:
        return []
    try:
        bit = struct_member_bit_offsets("task_struct", ["sched_contributes_to_load"]).get(
            "sched_contributes_to_load")
    except BtfError as e:
        log.warning("BTF unreadable (%s): blocks woken during their switch count as sleeping", e)
        return []
    return [] if bit is None else [f"-DTASK_LOAD_BIT={bit}"]
