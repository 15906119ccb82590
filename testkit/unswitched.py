"""Time a thread was neither on a CPU nor switched out, measured by a probe of the test's own.

Between a thread's switch-in and its next switch-out (sched_switch), the kernel accounts the run
time it had in sched_entity::sum_exec_runtime, which CLOCK_THREAD_CPUTIME_ID and schedstat report.
The rest of that interval is time the thread did not run although no switch was reported: on a
virtual machine, time the hypervisor gave the vCPU to another guest (with
CONFIG_PARAVIRT_TIME_ACCOUNTING steal time is kept out of the task clock, kernel/sched/core.c
update_rq_clock_task()); on a kernel that hides some switches (see end_unseen_block() in
bpf/offcpu.bpf.c), a preemption by a hidden thread. The exporter counts neither yet, so a truth
test of on-CPU + off-CPU = wall time holds for wall time less this.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from offcpu_exporter.probe.btf import struct_member_offsets

# Shorter gaps are the switch's own cost: the clock is read after the scheduler picked the next
# task and after the probes attached before this one ran (a stack capture: 2-4 us), so each run
# shows a few us more than the run time the scheduler accounted. ~240 runs of a 600 ms window
# summed to ~1 ms that way, which a gap threshold leaves out; a hypervisor's steal is ticks long.
MIN_GAP_NS = 20_000

_PROGRAM = r"""
struct run { u64 ts; u64 runtime; };
struct gap { u32 tid; u32 pad; u64 end; };
BPF_HASH(runs, u32, struct run, 16384);
BPF_HASH(gaps, struct gap, u64, 65536); /* a run's unswitched ns, by when the run ended */

static __always_inline u32 read_u32(void *task, int offset)
{
	u32 v = 0;
	bpf_probe_read_kernel(&v, sizeof(v), (char *)task + offset);
	return v;
}

static __always_inline u64 runtime_of(void *task)
{
	u64 v = 0;
	bpf_probe_read_kernel(&v, sizeof(v), (char *)task + RUNTIME);
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
			u64 elapsed = now - r->ts, ran = runtime_of(prev) - r->runtime;
			if (elapsed > ran + MIN_GAP_NS) {
				struct gap key = { tid, 0, now };
				u64 ns = elapsed - ran;
				gaps.update(&key, &ns);
			}
			runs.delete(&tid);
		}
	}
	if (read_u32(next, TGID) == WATCHED) {
		u32 tid = read_u32(next, PID);
		struct run r = { now, runtime_of(next) };
		runs.update(&tid, &r);
	}
	return 0;
}
"""


class Unswitched:
    """For the threads of process `pid`, from now on: the ns each was neither running nor switched
    out, in runs that ended inside a window."""

    def __init__(self, pid: int) -> None:
        from bcc import BPF  # the real kernel: imported only where a test runs one

        task = struct_member_offsets("task_struct", ["pid", "tgid", "se"])
        entity = struct_member_offsets("sched_entity", ["sum_exec_runtime"])
        cflags = [f"-DWATCHED={pid}", f"-DPID={task['pid']}", f"-DTGID={task['tgid']}",
                  f"-DRUNTIME={task['se'] + entity['sum_exec_runtime']}", f"-DMIN_GAP_NS={MIN_GAP_NS}ull"]
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
