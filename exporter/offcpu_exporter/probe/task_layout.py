"""Where the probe reads `struct task_struct`, from the running kernel's own BTF.

Every field the BPF program reads from a task (the one switched out in kprobe mode, the one
switched in on the raw tracepoint) is read at these offsets, passed to the compiler as -D flags,
so the program is exact whatever kernel headers bcc compiles against: a container image on a
fleet node carries the headers of some other kernel, and task_struct's layout moves between
releases and configurations (Debian's 6.1 and 6.12 differ; so do a kernel and its PREEMPT_RT
build). Without BTF the program falls back to the headers' layout (kprobe mode; see
compile.build_program) or leaves out what needs it (the run-time reads).

BTF format: https://docs.kernel.org/bpf/btf.html
"""

from __future__ import annotations

from dataclasses import dataclass

from offcpu_exporter.probe.btf import VMLINUX, Btf, BtfError, read_btf

__all__ = ["TaskLayout", "read_task_layout"]


@dataclass(frozen=True)
class TaskLayout:
    """Byte offsets in task_struct (bits for the one bitfield)."""

    pid: int
    tgid: int
    state: int  # __state (unsigned int) since 5.14, `volatile long state` before
    state_size: int  # 4 or 8
    load_bit: int | None  # sched_contributes_to_load, a bitfield: its bit offset
    se_runtime: int | None  # se.sum_exec_runtime
    se_prev_runtime: int | None  # se.prev_sum_exec_runtime
    switches: int | None  # nvcsw, with nivcsw in the next 8 bytes (read as one pair)
    stack: int | None = None  # `void *stack`, the task's kernel stack (wakers: interrupt or task context)
    # struct pt_regs (x86-64): its size and orig_ax's offset (wakers: an interrupt from user mode)
    regs_size: int | None = None
    regs_orig_ax: int | None = None

    def cflags(self) -> list[str]:
        flags = [
            f"-DTASK_PID_OFFSET={self.pid}",
            f"-DTASK_TGID_OFFSET={self.tgid}",
            f"-DTASK_STATE_OFFSET={self.state}",
            f"-DTASK_STATE_SIZE={self.state_size}",
        ]
        if self.load_bit is not None:
            flags.append(f"-DTASK_LOAD_BIT={self.load_bit}")
        if self.se_runtime is not None and self.se_prev_runtime is not None:
            flags += [f"-DTASK_SE_RUNTIME_OFFSET={self.se_runtime}",
                      f"-DTASK_SE_PREV_RUNTIME_OFFSET={self.se_prev_runtime}"]
        if self.switches is not None:
            flags.append(f"-DTASK_SWITCHES_OFFSET={self.switches}")
        if self.stack is not None:
            flags.append(f"-DTASK_STACK_OFFSET={self.stack}")
        if self.regs_size is not None and self.regs_orig_ax is not None:
            flags += [f"-DPT_REGS_SIZE={self.regs_size}", f"-DPT_REGS_ORIG_AX_OFFSET={self.regs_orig_ax}"]
        return flags


def read_task_layout(path: str = VMLINUX) -> TaskLayout:
    """The layout of this kernel's task_struct; BtfError when BTF lacks pid, tgid or the state."""
    btf = read_btf(path)
    task = btf.struct_members(
        "task_struct", ["pid", "tgid", "__state", "state", "sched_contributes_to_load", "se", "nvcsw", "nivcsw",
                      "stack"])
    state = task.get("__state") or task.get("state")
    missing = [name for name, member in (("pid", task.get("pid")), ("tgid", task.get("tgid")), ("__state", state))
               if member is None]
    if missing or state is None or state.size not in (4, 8):
        raise BtfError(f"task_struct in {path} lacks {', '.join(missing) or 'a 4- or 8-byte state'}")
    se_runtime = se_prev_runtime = None
    se = task.get("se")
    if se is not None:
        entity = btf.struct_members("sched_entity", ["sum_exec_runtime", "prev_sum_exec_runtime"])
        if len(entity) == 2:
            se_runtime = (se.bit_offset + entity["sum_exec_runtime"].bit_offset) // 8
            se_prev_runtime = (se.bit_offset + entity["prev_sum_exec_runtime"].bit_offset) // 8
    nvcsw, nivcsw = task.get("nvcsw"), task.get("nivcsw")
    switches = None
    if nvcsw is not None and nivcsw is not None and nivcsw.bit_offset == nvcsw.bit_offset + 64:
        switches = nvcsw.bit_offset // 8
    load = task.get("sched_contributes_to_load")
    stack = task.get("stack")
    return TaskLayout(
        pid=task["pid"].bit_offset // 8,
        tgid=task["tgid"].bit_offset // 8,
        state=state.bit_offset // 8,
        state_size=state.size,
        load_bit=None if load is None else load.bit_offset,
        se_runtime=se_runtime,
        se_prev_runtime=se_prev_runtime,
        switches=switches,
        stack=None if stack is None else stack.bit_offset // 8,
        **_pt_regs(btf),
    )


def _pt_regs(btf: Btf) -> dict[str, int | None]:
    """x86-64's struct pt_regs: its size (its last member, ss, padded to 8 bytes: with FRED's
    fields beside it (6.9+) it is a u16 in a union) and where orig_ax is."""
    try:
        regs = btf.struct_members("pt_regs", ["orig_ax", "ss"])
    except BtfError:
        return {}
    ss, orig_ax = regs.get("ss"), regs.get("orig_ax")
    if ss is None or ss.size is None or orig_ax is None:
        return {}
    end = ss.bit_offset // 8 + ss.size
    return {"regs_size": (end + 7) // 8 * 8, "regs_orig_ax": orig_ax.bit_offset // 8}
