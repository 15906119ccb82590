// SPDX-License-Identifier: GPL-2.0
/* Test harness for bpf/unwind.h: for the threads of the processes in `targets`,
 * captures the user stack with unwind_user_stack() and with bpf_get_stack() (frame pointers) where
 * the probe will (HARNESS_RAW_TRACEPOINT / HARNESS_TRACEPOINT: sched_switch at switch-out;
 * HARNESS_KPROBE: finish_task_switch at switch-in), times both, and sends one event per block to
 * user space when the thread runs again, with its off-CPU time. */
#include "unwind.h"

struct harness_capture {
	u64 off_ns;      /* how long the thread was off CPU after this capture */
	u32 tgid;
	u32 tid;
	s32 frames;      /* unwind_user_stack() */
	u32 end;         /* UNWIND_END_* */
	s32 fp_bytes;    /* bpf_get_stack(): bytes, or -errno */
	u32 pad;
	u64 unwind_ns;   /* time each of the two took */
	u64 fp_ns;
	u64 ips[UNWIND_MAX_FRAMES];
	u64 fp_ips[UNWIND_MAX_FRAMES];
};

BPF_HASH(targets, u32, u8, 1024);
BPF_HASH(pending, u32, struct harness_capture, 4096);
BPF_HASH(switched_out, u32, u64, 4096);
BPF_PERCPU_ARRAY(scratch, struct harness_capture, 1);
BPF_PERF_OUTPUT(captures);

static __always_inline struct harness_capture *capture(void *ctx, u64 id)
{
	u32 zero = 0;
	struct harness_capture *c = scratch.lookup(&zero);
	if (!c)
		return NULL;
	c->tgid = id >> 32;
	c->tid = id;
	u64 t0 = bpf_ktime_get_ns();
	c->frames = unwind_user_stack(c->ips, &c->end);
	u64 t1 = bpf_ktime_get_ns();
	c->fp_bytes = bpf_get_stack(ctx, c->fp_ips, sizeof(c->fp_ips), BPF_F_USER_STACK);
	u64 t2 = bpf_ktime_get_ns();
	c->unwind_ns = t1 - t0;
	c->fp_ns = t2 - t1;
	return c;
}

#if defined(HARNESS_RAW_TRACEPOINT) || defined(HARNESS_TRACEPOINT)
static __always_inline void switch_out(void *ctx)
{
	u64 id = bpf_get_current_pid_tgid(); /* current is still prev */
	u32 tgid = id >> 32;
	if (!targets.lookup(&tgid))
		return;
	struct harness_capture *c = capture(ctx, id);
	if (!c)
		return;
	c->off_ns = bpf_ktime_get_ns(); /* the switch-out time until the thread runs again */
	u32 tid = id;
	pending.update(&tid, c);
}

static __always_inline void switch_in(void *ctx, u32 next)
{
	struct harness_capture *c = pending.lookup(&next);
	if (!c)
		return;
	c->off_ns = bpf_ktime_get_ns() - c->off_ns;
	captures.perf_submit(ctx, c, sizeof(*c));
	pending.delete(&next);
}
#endif

#ifdef HARNESS_RAW_TRACEPOINT
RAW_TRACEPOINT_PROBE(sched_switch)
{
	switch_out(ctx);
	u32 next = 0;
	bpf_probe_read_kernel(&next, sizeof(next), (void *)ctx->args[2] + TASK_PID_OFFSET);
	switch_in(ctx, next);
	return 0;
}
#endif

#ifdef HARNESS_TRACEPOINT
TRACEPOINT_PROBE(sched, sched_switch)
{
	switch_out(args);
	switch_in(args, args->next_pid);
	return 1;
}
#endif

#ifdef HARNESS_KPROBE
int harness_finish_task_switch(struct pt_regs *ctx, struct task_struct *prev)
{
	u64 now = bpf_ktime_get_ns();
	u32 prev_tgid = prev->tgid;
	if (targets.lookup(&prev_tgid)) {
		u32 prev_tid = prev->pid;
		switched_out.update(&prev_tid, &now);
	}
	u64 id = bpf_get_current_pid_tgid(); /* the task switched in: its stacks are where it blocked */
	u32 tid = id;
	u64 *out = switched_out.lookup(&tid);
	if (!out)
		return 0;
	u64 off = now - *out;
	switched_out.delete(&tid);
	struct harness_capture *c = capture(ctx, id);
	if (!c)
		return 0;
	c->off_ns = off;
	captures.perf_submit(ctx, c, sizeof(*c));
	return 0;
}
#endif
