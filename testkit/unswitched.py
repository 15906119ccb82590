"""Time a running thread lost without a context switch, measured by a probe of the test's own.

Between a thread's switch-in and its next switch-out (sched_switch), the kernel accounts it the
run time it had (sched_entity::sum_exec_runtime, which CLOCK_THREAD_CPUTIME_ID and schedstat
report). The rest of that interval the CPU spent elsewhere without a switch: on a virtual machine,
the hypervisor's other guests (with CONFIG_PARAVIRT_TIME_ACCOUNTING steal time is kept out of the
task clock, kernel/sched/core.c update_rq_clock_task()), or interrupts with IRQ time accounting.
The exporter counts it as Reason.STOLEN (charge_stolen() in bpf/offcpu.bpf.c); this is the same
figure taken independently: a hash map per thread instead of the probe's per-CPU slots, and its
own clock reads. The same rules: runs with exactly one switch (the one that ends them), gaps over
layout.STOLEN_MIN_NS.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from offcpu_exporter.probe import layout
from offcpu_exporter.probe.task_layout import read_task_layout

_PROGRAM = r"""
struct run { u64 ts; u64 runtime; u64 switches; };
struct gap { u32 tid; u32 pad; u64 end; };
BPF_HASH(runs, u32, struct run, 16384);
BPF_HASH(gaps, struct gap, u64, 65536); /* a run's unswitched ns, by when the run ended */

static __always_inline u64 read_u64(void *task, int offset)
{
	u64 v = 0;
	bpf_probe_read_kernel(&v, sizeof(v), (char *)task + offset);
	return v;
}

static __always_inline u32 read_u32(void *task, int offset)
{
	u32 v = 0;
	bpf_probe_read_kernel(&v, sizeof(v), (char *)task + offset);
	return v;
}

RAW_TRACEPOINT_PROBE(sched_switch)
{
	void *prev = (void *)ctx->args[1], *next = (void *)ctx->args[2];
	u64 now = bpf_ktime_get_ns();
	if (read_u32(prev, TGID) == WATCHED) {
		u32 tid = read_u32(prev, PID);
		struct run *r = runs.lookup(&tid);
		if (r) {
			u64 switches = read_u64(prev, NVCSW) + read_u64(prev, NIVCSW);
			u64 elapsed = now - r->ts, ran = read_u64(prev, RUNTIME) - r->runtime;
			if (switches == r->switches + 1 && elapsed > ran + MIN_GAP_NS) {
				struct gap key = { tid, 0, now };
				u64 ns = elapsed - ran;
				gaps.update(&key, &ns);
			}
			runs.delete(&tid);
		}
	}
	if (read_u32(next, TGID) == WATCHED) {
		u32 tid = read_u32(next, PID);
		struct run r = { now, read_u64(next, RUNTIME), read_u64(next, NVCSW) + read_u64(next, NIVCSW) };
		runs.update(&tid, &r);
	}
	return 0;
}
"""


class Unswitched:
    """For the threads of process `pid`, from now on: the ns each lost without a switch, in runs
    that ended inside a window."""

    def __init__(self, pid: int) -> None:
        from bcc import BPF  # the real kernel: imported only where a test runs one

        task = read_task_layout()
        assert task.se_runtime is not None and task.switches is not None, task
        cflags = [f"-DWATCHED={pid}", f"-DPID={task.pid}", f"-DTGID={task.tgid}",
                  f"-DRUNTIME={task.se_runtime}", f"-DNVCSW={task.switches}",
                  f"-DNIVCSW={task.switches + 8}", f"-DMIN_GAP_NS={layout.STOLEN_MIN_NS}ull"]
        self._bpf: Any = BPF(text=_PROGRAM.encode(), cflags=cflags)

    def ns(self, tid: int, start_ns: int, end_ns: int) -> int:
        """In runs of `tid` that ended in (start_ns, end_ns] (CLOCK_MONOTONIC)."""
        return sum(v.value for k, v in self._bpf[b"gaps"].items() if k.tid == tid and start_ns < k.end <= end_ns)

    def close(self) -> None:
        self._bpf.cleanup()

    def __enter__(self) -> Unswitched:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
