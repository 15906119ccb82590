// SPDX-License-Identifier: GPL-2.0
/* Off-CPU time per stack for the watched processes, compiled by bcc at start.
 *
 * Attach modes share one counting logic (account()):
 *  - OFFCPU_ATTACH_KPROBE: a kprobe on finish_task_switch(prev), SkyWalking Rover's and bcc
 *    offcputime's hook. It runs in the task that is switched in, so the stack captured there is
 *    the stack it blocked on. Reads prev's task_struct: needs headers that match the kernel.
 *  - OFFCPU_ATTACH_TRACEPOINT: sched:sched_switch, where current is still prev: the stack is
 *    captured at switch-out and the time is charged at switch-in (next_pid). Uses only the
 *    tracepoint's own fields, so it is exact with any headers.
 *  - OFFCPU_ATTACH_RAW_TRACEPOINT: the same hook and logic as a raw tracepoint (what tracepoint
 *    mode uses when the kernel has BTF). Perf-event tracepoints and kprobes share one per-CPU
 *    guard, bpf_prog_active, with map system calls: a task preempted inside one (a map read by any
 *    BPF user on the machine) leaves the guard taken on that CPU and every switch there is skipped
 *    until it runs again. Raw tracepoints guard each program on its own. next's pid is read at
 *    TASK_PID_OFFSET, taken from the running kernel's BTF, so headers do not matter here either.
 *
 * The kernel side only counts. Filtering comes first so that unwatched tasks cost one lookup.
 * Set by the loader with -D: OFFCPU_ATTACH_*, PER_THREAD, WATCH_ALL, FOLLOW_CHILDREN,
 * MIN_BLOCK_NS, MAX_BLOCK_NS and the map sizes MAX_TARGETS, MAX_THREADS, MAX_COUNTS,
 * STACK_STORAGE, STACK_SPILL, STACK_SPILL_BASE, MAX_HIST.
 */
#include <uapi/linux/ptrace.h>
#include <linux/sched.h>
#include <uapi/asm-generic/errno-base.h>
#include "offcpu.h"

/* What every hook returns. The kernel runs the BPF programs attached to a tracepoint or kprobe
 * before the perf events of that same event, and a 0 from any of them drops the event for every
 * perf user on the host (trace_call_bpf() in kernel/trace/bpf_trace.c: "0 - return from kprobe
 * (event is filtered out)", used by perf_trace_run_bpf_submit() in kernel/events/core.c). With 0
 * here, `perf record -e sched:sched_switch`, `perf sched record` or `perf trace` record nothing
 * while the exporter runs (measured: `perf stat -e sched:sched_switch -a` reads 0). 1 keeps
 * their events; without such perf users it costs nothing. Raw tracepoints ignore the value (their
 * programs do not sit in front of perf's events). */
#define OFFCPU_KEEP_EVENT 1

BPF_HASH(targets, u32, u8, MAX_TARGETS);
BPF_HASH(children, u32, struct offcpu_child, MAX_TARGETS);
BPF_HASH(start, u32, struct offcpu_start, MAX_THREADS);
BPF_HASH(counts, struct offcpu_key, struct offcpu_value, MAX_COUNTS);
BPF_HASH(hist, struct offcpu_hist_key, u64, MAX_HIST);
BPF_STACK_TRACE(stack_traces, STACK_STORAGE);
BPF_STACK_TRACE(stack_spill, STACK_SPILL);
BPF_PERCPU_ARRAY(stats, u64, OFFCPU_STAT_MAX);

static __always_inline void stat_add(int index, u64 n)
{
	u64 *v = stats.lookup(&index);
	if (v)
		*v += n; /* per-CPU slot: no other writer */
}

/* bpf_get_stackid() hashes a stack to one bucket and, without BPF_F_REUSE_STACKID, fails with
 * -EEXIST when another stack holds it (__bpf_get_stackid() in kernel/bpf/stackmap.c). Reusing
 * the bucket would rename the stack that held it under every counter keyed by its id. By the
 * birthday bound such collisions are common long before the map is full: K stacks in N buckets
 * collide in about K^2/2N pairs (1% of runs with 20 stacks in 16384 buckets, a quarter of 5,000
 * stacks lost). A collided stack goes to a second, smaller map instead, where it collides again
 * only with another collided stack; its ids there are offset by the first map's bucket count. */
static __always_inline int stack_id(void *ctx, u64 flags)
{
	int id = stack_traces.get_stackid(ctx, flags);
	if (id != -EEXIST)
		return id;
	int spilled = stack_spill.get_stackid(ctx, flags);
	if (spilled < 0)
		return spilled;
	stat_add(OFFCPU_STAT_STACKS_SPILLED, 1);
	return spilled + STACK_SPILL_BASE;
}

static __always_inline int is_target(u32 tgid)
{
	if (tgid == 0)
		return 0; /* the idle task */
	u8 *t = targets.lookup(&tgid);
#if WATCH_ALL
	return t == NULL || *t != OFFCPU_TARGET_EXCLUDE;
#else
	return t != NULL && *t == OFFCPU_TARGET_WATCH;
#endif
}

static __always_inline void account(struct offcpu_start *s, u32 tid, u64 now,
				    int user_stack_id, int kernel_stack_id)
{
	u64 delta = now - s->ts_ns;
	if (delta < MIN_BLOCK_NS || delta > MAX_BLOCK_NS) {
		stat_add(OFFCPU_STAT_FILTERED, 1);
		return;
	}

	struct offcpu_key key = {};
	key.tgid = s->tgid;
	key.tid = PER_THREAD ? tid : 0;
	key.user_stack_id = user_stack_id;
	key.kernel_stack_id = kernel_stack_id;
	key.reason = s->reason;

	struct offcpu_value zero = {};
	struct offcpu_value *v = counts.lookup_or_try_init(&key, &zero);
	if (v) {
		/* Several CPUs can charge the same key at once (per-process aggregation). */
		__sync_fetch_and_add(&v->count, 1);
		__sync_fetch_and_add(&v->total_ns, delta);
	} else {
		stat_add(OFFCPU_STAT_COUNTS_DROPPED, 1);
		stat_add(OFFCPU_STAT_COUNTS_DROPPED_NS, delta);
	}

	u64 us = delta / 1000;
	struct offcpu_hist_key hk = {};
	hk.tgid = s->tgid;
	hk.slot = us ? bpf_log2l(us) : 0;
	if (hk.slot >= OFFCPU_HIST_SLOTS)
		hk.slot = OFFCPU_HIST_SLOTS - 1;
	u64 zero64 = 0;
	u64 *c = hist.lookup_or_try_init(&hk, &zero64);
	if (c)
		__sync_fetch_and_add(c, 1);
	else
		stat_add(OFFCPU_STAT_HIST_DROPPED, 1);
}

static __always_inline void store_start(u32 tid, struct offcpu_start *s)
{
	if (start.update(&tid, s) != 0)
		stat_add(OFFCPU_STAT_START_DROPPED, 1);
}

#ifdef OFFCPU_ATTACH_KPROBE
/* Raw task state (task_struct::__state since 5.14) to a reason. prev may already have been
 * woken on another CPU by the time finish_task_switch() runs: then it reads as runnable. */
static __always_inline u32 reason_of_task_state(long state)
{
	if (state == 0)
		return OFFCPU_REASON_RUNNABLE;
	if (state & TASK_INTERRUPTIBLE)
		return OFFCPU_REASON_SLEEPING;
	if ((state & TASK_UNINTERRUPTIBLE) && (state & TASK_NOLOAD))
		return OFFCPU_REASON_SLEEPING; /* TASK_IDLE */
	if (state & TASK_UNINTERRUPTIBLE)
		return OFFCPU_REASON_UNINTERRUPTIBLE;
	return OFFCPU_REASON_OTHER;
}

int offcpu_finish_task_switch(struct pt_regs *ctx, struct task_struct *prev)
{
	u64 now = bpf_ktime_get_ns();
	u32 prev_tgid = prev->tgid;

	if (is_target(prev_tgid)) {
		struct offcpu_start s = {};
		s.ts_ns = now;
		s.tgid = prev_tgid;
#if LINUX_VERSION_CODE >= KERNEL_VERSION(5, 14, 0)
		s.reason = reason_of_task_state(prev->__state);
#else
		s.reason = reason_of_task_state(prev->state);
#endif
		u32 prev_tid = prev->pid;
		store_start(prev_tid, &s);
	}

	u32 tid = bpf_get_current_pid_tgid();
	struct offcpu_start *s = start.lookup(&tid);
	if (!s)
		return OFFCPU_KEEP_EVENT;
	/* Switched back in: the stacks here are the ones it blocked in. */
	int user_stack_id = stack_id(ctx, BPF_F_USER_STACK);
	int kernel_stack_id = stack_id(ctx, 0);
	account(s, tid, now, user_stack_id, kernel_stack_id);
	start.delete(&tid);
	return OFFCPU_KEEP_EVENT;
}
#endif

#ifdef OFFCPU_ATTACH_TRACEPOINT
/* prev_state as the tracepoint reports it (__trace_sched_switch_state): TASK_REPORT_MAX when
 * preempted, else one bit per state (1 interruptible, 2 uninterruptible, 0x80 idle, ...). */
static __always_inline u32 reason_of_tracepoint_state(long state)
{
	if ((state & 0xff) == 0)
		return OFFCPU_REASON_RUNNABLE;
	if (state & 0x01)
		return OFFCPU_REASON_SLEEPING;
	if (state & 0x80)
		return OFFCPU_REASON_SLEEPING; /* TASK_IDLE reported as TASK_REPORT_IDLE */
	if (state & 0x02)
		return OFFCPU_REASON_UNINTERRUPTIBLE;
	return OFFCPU_REASON_OTHER;
}

TRACEPOINT_PROBE(sched, sched_switch)
{
	u64 now = bpf_ktime_get_ns();
	u64 id = bpf_get_current_pid_tgid(); /* current is still prev here */
	u32 tgid = id >> 32;

	if (is_target(tgid)) {
		struct offcpu_start s = {};
		s.ts_ns = now;
		s.tgid = tgid;
		s.reason = reason_of_tracepoint_state(args->prev_state);
		s.user_stack_id = stack_id(args, BPF_F_USER_STACK);
		s.kernel_stack_id = stack_id(args, 0);
		store_start((u32)id, &s);
	}

	u32 next = args->next_pid;
	struct offcpu_start *s = start.lookup(&next);
	if (!s)
		return OFFCPU_KEEP_EVENT;
	account(s, next, now, s->user_stack_id, s->kernel_stack_id);
	start.delete(&next);
	return OFFCPU_KEEP_EVENT;
}
#endif

#if FOLLOW_CHILDREN && !WATCH_ALL
/* A child process of a watched process is watched from its first instruction: a /proc scan
 * would miss short-lived ones. task:task_newtask runs in the parent (current) before the child
 * can run, and its clone_flags tell new threads (same tgid, already covered) from processes. */
TRACEPOINT_PROBE(task, task_newtask)
{
	if (args->clone_flags & CLONE_THREAD)
		return OFFCPU_KEEP_EVENT;
	u32 parent = bpf_get_current_pid_tgid() >> 32;
	if (!is_target(parent))
		return OFFCPU_KEEP_EVENT;
	u32 child = args->pid;
	u8 watch = OFFCPU_TARGET_WATCH;
	struct offcpu_child c = {};
	c.fork_boot_ns = bpf_ktime_get_boot_ns();
	c.parent_tgid = parent;
	bpf_probe_read_kernel(&c.comm, sizeof(c.comm), args->comm);
	/* children first: user space treats a target it did not add as stale unless it is a child. */
	if (children.update(&child, &c) == 0)
		targets.update(&child, &watch);
	return OFFCPU_KEEP_EVENT;
}
#endif

#ifdef OFFCPU_ATTACH_RAW_TRACEPOINT
/* TP_PROTO(bool preempt, struct task_struct *prev, struct task_struct *next, unsigned int
 * prev_state): prev_state is the raw task state (since 5.18), preempt says it was preempted. */
static __always_inline u32 reason_of_raw_state(u64 preempt, u64 state)
{
	if (preempt || (state & 0xff) == 0)
		return OFFCPU_REASON_RUNNABLE;
	if (state & 0x0001) /* TASK_INTERRUPTIBLE */
		return OFFCPU_REASON_SLEEPING;
	if ((state & 0x0002) && (state & 0x0400)) /* TASK_IDLE = UNINTERRUPTIBLE | NOLOAD */
		return OFFCPU_REASON_SLEEPING;
	if (state & 0x0002)
		return OFFCPU_REASON_UNINTERRUPTIBLE;
	return OFFCPU_REASON_OTHER;
}

RAW_TRACEPOINT_PROBE(sched_switch)
{
	u64 now = bpf_ktime_get_ns();
	u64 id = bpf_get_current_pid_tgid(); /* current is still prev here */
	u32 tgid = id >> 32;

	if (is_target(tgid)) {
		struct offcpu_start s = {};
		s.ts_ns = now;
		s.tgid = tgid;
		s.reason = reason_of_raw_state(ctx->args[0], ctx->args[3]);
		s.user_stack_id = stack_id(ctx, BPF_F_USER_STACK);
		s.kernel_stack_id = stack_id(ctx, 0);
		store_start((u32)id, &s);
	}

	u32 next = 0;
	bpf_probe_read_kernel(&next, sizeof(next), (void *)ctx->args[2] + TASK_PID_OFFSET);
	struct offcpu_start *s = start.lookup(&next);
	if (!s)
		return OFFCPU_KEEP_EVENT; /* ignored for raw tracepoints; kept alike */
	account(s, next, now, s->user_stack_id, s->kernel_stack_id);
	start.delete(&next);
	return OFFCPU_KEEP_EVENT;
}
#endif

/* An exiting thread never switches in again: drop its pending switch-out. When the group leader
 * exits, stop watching the tgid at once, so that a new process reusing the PID is not counted
 * as the old one before user space decides whether it is a target. */
TRACEPOINT_PROBE(sched, sched_process_exit)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 tid = id;
	u32 tgid = id >> 32;
	start.delete(&tid);
	if (tid == tgid)
		targets.delete(&tgid);
	return OFFCPU_KEEP_EVENT;
}
