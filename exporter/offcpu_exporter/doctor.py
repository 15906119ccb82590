"""`offcpu-exporter doctor`: what this kernel supports, which attach mode `auto` picks, and what
to do about each missing piece."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TextIO

from offcpu_exporter.privileges import CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN, kept_after_attach
from offcpu_exporter.probe.facts import probe_kernel

__all__ = ["run_doctor"]


def _line(out: TextIO, ok: bool | None, what: str, detail: str = "") -> None:
    mark = {True: "ok  ", False: "MISS", None: "warn"}[ok]
    out.write(f"[{mark}] {what}{': ' + detail if detail else ''}\n")


def describe_stacks(pid: int, out: TextIO) -> bool:
    """What each executable mapping of `pid` relies on for its user stacks; False if it is gone."""
    from offcpu_exporter.unwind import Unwinder

    described = Unwinder(None).update(pid)
    if described is None:
        _line(out, False, f"process {pid}", "not found")
        return False
    out.write(f"process {pid}: user stacks, per executable mapping (DWARF unwinder, docs/unwinding.md)\n")
    for m in described:
        out.write(f"  {m.start:#014x}-{m.end:#014x} {m.method:<13} {m.path}  ({m.why})\n")
    return True


def run_doctor(attach: str = "auto", load: bool = False, out: TextIO = sys.stdout, pids: Sequence[int] = ()) -> int:
    facts = probe_kernel()
    caps = facts.capabilities
    out.write(f"kernel {facts.release}\n")
    try:
        import bcc

        _line(out, True, "bcc Python module", getattr(bcc, "__file__", ""))
        has_bcc = True
    except ImportError:
        _line(out, False, "bcc Python module", "apt-get install python3-bpfcc; use a venv with --system-site-packages")
        has_bcc = False
    needed = {CAP_BPF: "CAP_BPF", CAP_PERFMON: "CAP_PERFMON"}
    missing = [name for bit, name in needed.items() if bit not in caps]
    if missing and CAP_SYS_ADMIN not in caps:
        _line(out, False, "capabilities", f"missing {', '.join(missing)} (or CAP_SYS_ADMIN): run as root")
    else:
        _line(out, True, "capabilities", "BPF and perf events allowed")
    # What the attached exporter still uses (kept by --drop-privileges; see SECURITY.md).
    for kept in kept_after_attach(release=facts.version):
        if kept.capability in caps:
            _line(out, True, kept.name, f"kept by --drop-privileges to {kept.why}")
        else:
            _line(out, None, kept.name, f"missing: cannot {kept.why}")
    _line(out, facts.tracefs is not None, "tracefs", facts.tracefs or "mount -t tracefs tracefs /sys/kernel/tracing")
    _line(out, facts.btf, "BTF", "/sys/kernel/btf/vmlinux" if facts.btf else "absent (not needed by bcc)")
    _line(out, facts.sched_switch_tracepoint, "tracepoint sched:sched_switch",
          "" if facts.sched_switch_tracepoint else "CONFIG_TRACEPOINTS missing: no tracepoint mode")
    _line(out, facts.sched_exit_tracepoint, "tracepoint sched:sched_process_exit")
    _line(out, facts.kprobes, "kprobes", "" if facts.kprobes else "CONFIG_KPROBES not set: kprobe mode unavailable")
    _line(out, bool(facts.finish_task_switch), "finish_task_switch in kallsyms",
          ", ".join(facts.finish_task_switch) or "not found")
    _line(out, facts.kallsyms_readable, "kallsyms addresses",
          "" if facts.kallsyms_readable else "zeroed by kptr_restrict: run as root or set kernel.kptr_restrict=0")
    if facts.headers_dir is None:
        _line(out, False, "kernel headers", "none: run scripts/setup (installs linux-headers)")
    elif facts.headers_match:
        _line(out, True, "kernel headers", f"{facts.headers_dir} ({facts.headers_release})")
    elif facts.btf:
        _line(out, True, "kernel headers",
              f"{facts.headers_release} at {facts.headers_dir}, not {facts.release}'s: enough, task_struct's "
              "layout is read from BTF")
    else:
        _line(out, None, "kernel headers",
              f"{facts.headers_release} at {facts.headers_dir} do not match {facts.release} and there is no BTF: "
              "tracepoint mode is exact, kprobe mode may read task_struct wrongly")
    mode, why = facts.auto_attach()
    chosen = mode if attach == "auto" else attach
    out.write(f"attach mode: {chosen}" + (f" (auto: {why})" if attach == "auto" else " (asked for)") + "\n")
    can_run = has_bcc and facts.tracefs is not None and facts.headers_dir is not None and (
        facts.kprobes if chosen == "kprobe" else facts.sched_switch_tracepoint)
    if load and can_run:
        from offcpu_exporter.probe.loader import Probe, ProbeConfig, ProbeError

        probe = Probe(ProbeConfig(attach=attach), facts)
        try:
            probe.start()
            _line(out, True, "probe loaded", f"{probe.mode} on {', '.join(probe.hooked)}")
        except ProbeError as e:
            _line(out, False, "probe loaded", str(e))
            can_run = False
        finally:
            probe.close()
    for pid in pids:
        describe_stacks(pid, out)
    out.write("verdict: " + ("the exporter can run here\n" if can_run else "the exporter cannot run here yet\n"))
    return 0 if can_run else 1
