"""Where the probe hooks the scheduler: the attach mode (`auto` chooses from the kernel's facts),
whether this kernel has that hook, and the kprobes on finish_task_switch."""

from __future__ import annotations

import logging
from typing import Any

from offcpu_exporter.probe.config import ProbeError
from offcpu_exporter.probe.facts import KernelFacts

__all__ = ["ATTACH_MODES", "attach", "check_mode", "choose_mode"]

log = logging.getLogger(__name__)

ATTACH_MODES = ("auto", "kprobe", "tracepoint")


def choose_mode(attach: str, facts: KernelFacts) -> tuple[str, str]:
    """The mode to attach in ("kprobe" or "tracepoint") for --attach `attach`, and why."""
    if attach == "auto":
        return facts.auto_attach()
    if attach == "kprobe" and facts.kprobe_runs_skipped:
        log.warning("kprobe mode on a PREEMPT_RT kernel: switches made while a BPF system call is preempted go "
                    "unseen (counted in offcpu_exporter_probe_skipped_runs_total); --attach auto uses the raw "
                    "tracepoint here")
    return attach, "asked for with --attach"


def check_mode(mode: str, facts: KernelFacts) -> None:
    """Raise ProbeError, saying what to do, when this kernel lacks the hook `mode` needs."""
    if facts.tracefs is None:
        raise ProbeError("tracefs is not mounted: mount -t tracefs tracefs /sys/kernel/tracing")
    if mode == "tracepoint" and not facts.sched_switch_tracepoint:
        raise ProbeError(f"no sched:sched_switch tracepoint under {facts.tracefs}/events (CONFIG_TRACEPOINTS?)")
    if mode == "kprobe" and not facts.kprobes:
        raise ProbeError("this kernel has no kprobes (CONFIG_KPROBES): use --attach tracepoint or auto")


def attach(bpf: Any, variant: str, facts: KernelFacts, *, wakers: bool = False) -> tuple[str, ...]:
    """Attach the loaded program built for `variant` (compile.Program.variant); returns what it is
    hooked on. Tracepoint programs were attached by bcc as it loaded them (the wakers' raw
    sched_waking one too): only kprobes are left."""
    waking = ("raw_tp:sched_waking",) if wakers else ()
    if variant == "kprobe":
        return (*_attach_kprobes(bpf, facts), *waking)
    if variant == "raw_tracepoint":
        return ("raw_tp:sched_switch", *waking)
    return ("sched:sched_switch", *waking)


def _attach_kprobes(bpf: Any, facts: KernelFacts) -> tuple[str, ...]:
    symbols = facts.finish_task_switch
    if not symbols:
        log.warning("no finish_task_switch symbol found in /proc/kallsyms; trying finish_task_switch")
        symbols = ("finish_task_switch",)
    hooked: list[str] = []
    for symbol in symbols:
        try:
            bpf.attach_kprobe(event=symbol.encode(), fn_name=b"offcpu_finish_task_switch")
            hooked.append(symbol)
        except Exception as e:
            log.warning("kprobe on %s failed: %s", symbol, e)
    if not hooked:
        raise ProbeError(f"no kprobe could be attached to any of {', '.join(symbols)}")
    return tuple(hooked)
