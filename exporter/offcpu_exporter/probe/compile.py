"""The probe's program: bpf/offcpu.bpf.c's text and the compiler flags the config and the kernel
call for (the hook variant, task_struct's layout read from BTF, the DWARF unwinder's settings), and
its compile and load by bcc."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from offcpu_exporter.probe import layout
from offcpu_exporter.probe.btf import BtfError
from offcpu_exporter.probe.compiler_memory import release_compiler_memory
from offcpu_exporter.probe.config import ProbeConfig, ProbeError
from offcpu_exporter.probe.facts import KernelFacts
from offcpu_exporter.probe.task_layout import TaskLayout, read_task_layout
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
    task = _task_layout(facts)
    if mode == "kprobe" and task is None and not facts.headers_match:
        log.warning(
            "kernel headers are %s but the kernel is %s, and no BTF: task_struct offsets may be wrong in kprobe mode",
            facts.headers_release, facts.release,
        )
    variant = mode
    if mode == "tracepoint" and config.raw_tracepoint is not False:
        if task is not None and facts.raw_sched_switch:
            variant = "raw_tracepoint"
        elif config.raw_tracepoint:
            raise ProbeError("raw tracepoint asked for, but this kernel lacks it (5.18+) or BTF for task_struct")
    if config.wakers and (task is None or task.stack is None):
        raise ProbeError("--wakers on needs the kernel's BTF (task_struct's layout): this kernel has none")
    extra = [] if task is None else task.cflags()
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


def _task_layout(facts: KernelFacts) -> TaskLayout | None:
    """task_struct's layout from BTF, or None (no BTF): then kprobe mode reads the headers' layout
    and the run-time reads (blocks whose switch-in went unreported, time stolen from running
    threads) are left out."""
    if not facts.btf:
        return None
    try:
        return read_task_layout()
    except BtfError as e:
        log.warning("BTF unreadable (%s): task_struct read at the headers' offsets; blocks whose switch-in goes "
                    "unreported, and time stolen from running threads, are not counted", e)
        return None


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
