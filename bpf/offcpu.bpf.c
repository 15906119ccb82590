// SPDX-License-Identifier: GPL-2.0
/* Off-CPU time per stack for the watched processes, compiled by bcc at start.
 *
 * Attach modes share one counting logic (switch_out(), switch_in()):
 *  - OFFCPU_ATTACH_KPROBE: a kprobe on finish_task_switch(prev), SkyWalking Rover's and bcc
 *    offcputime's hook. It runs in the task that is switched in, so the stack captured there is
 *    the stack it blocked on, and the block's length is known before the capture is decided.
 *    Reads prev's task_struct at the offsets of the running kernel's BTF (TASK_*_OFFSET), so any
 *    headers do; without BTF at the headers' offsets, which must then match the kernel.
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
 * Every block of a watched thread is counted exactly (count, ns) under (tgid, tid, reason). Its
 * stacks are captured for a sample of blocks only (STACK_SAMPLING): each thread gets about
 * THREAD_BUDGET captures per SAMPLE_WINDOW_NS and each CPU about CPU_BUDGET; a thread that switches
 * less often than its budget has every block captured. A captured block carries its weight (1 /
 * the probability it was captured) into the per-stack estimate, which user space scales to the
 * exact total of its thread and reason. The stack walks are ~90% of the cost of a block.
 *
 * User stacks: with frame pointers (bpf_get_stack), or, for processes user space has described
 * with DWARF CFI tables (OFFCPU_UNWIND, bpf/unwind.h), walked from those tables:
 * complete stacks through code built without frame pointers (most distributions' libraries).
 *
 * Wakers (WAKERS, --wakers on): a raw sched_waking tracepoint, in every attach mode, keeps who woke
 * a watched thread's block in progress (a task, or interrupt context) until the block ends, and
 * the block is counted under its key extended with that waker (struct offcpu_waker_key).
 *
 * Set by the loader with -D: OFFCPU_ATTACH_*, OFFCPU_UNWIND, PER_THREAD, WATCH_ALL, FOLLOW_CHILDREN,
 * MIN_BLOCK_NS, MAX_BLOCK_NS, STACK_SAMPLING, SAMPLE_WINDOW_NS, THREAD_BUDGET, CPU_BUDGET,
 * LONG_BLOCK_NS, STOLEN_MIN_NS, the map sizes MAX_TARGETS, MAX_THREADS, MAX_COUNTS, STACK_STORAGE,
 * MAX_HIST, WAKERS (the sched_waking hook, wakers in the counters' keys), and where BTF has them
 * task_struct's layout (TASK_PID_OFFSET, TASK_TGID_OFFSET,
 * TASK_STATE_OFFSET and _SIZE, TASK_LOAD_BIT, TASK_SE_RUNTIME_OFFSET, TASK_SWITCHES_OFFSET).
 */
#include <uapi/linux/ptrace.h>
#include <linux/sched.h>
#include <uapi/asm-generic/errno-base.h>
#include "offcpu.h"
#if OFFCPU_UNWIND
/* Inlined by the loader (offcpu_exporter/unwind/source.py:bpf_text), not by the preprocessor. */
#include "unwind.h"
#endif

/* What every hook returns. The kernel runs the BPF programs attached to a tracepoint or kprobe
 * before the perf events of that same event, and a 0 from any of them drops the event for every
 * perf user on the host (trace_call_bpf() in kernel/trace/bpf_trace.c: "0 - return from kprobe
 * (event is filtered out)", used by perf_trace_run_bpf_submit() in kernel/events/core.c). With 0
 * here, `perf record -e sched:sched_switch`, `perf sched record` or `perf trace` record nothing
 * while the exporter runs (measured: `perf stat -e sched:sched_switch -a` reads 0). 1 keeps
 * their events; without such perf users it costs nothing. Raw tracepoints ignore the value (their
 * programs do not sit in front of perf's events). */
#define OFFCPU_KEEP_EVENT 1
#define OFFCPU_MAX_SHIFT 16 /* captures 1 in 65536 at most: keeps weight * ns inside 64 bits */

/* Per pid, arrays (a lookup is an inlined index, no hash): whether the process is watched
 * (OFFCPU_TARGET_*), and whether the thread has an entry in `start` (off CPU now). Every context
 * switch on the machine reads both; most of them are of threads nobody watches. MAX_PIDS is the
 * kernel's pid_max; a pid beyond it (pid_max raised later) reads as absent. */
BPF_ARRAY(targets, u8, MAX_PIDS);
BPF_ARRAY(off_cpu, u8, MAX_PIDS);
BPF_HASH(children, u32, struct offcpu_child, MAX_TARGETS);
/* Processes that forked, exec'd, exited or were renamed since user space last drained this map
 * (tgid -> OFFCPU_PROC_* bits): it looks at those instead of rescanning /proc for every process at
 * every refresh (targets.py). Full: counted, and user space rescans /proc. */
BPF_HASH(proc_events, u32, u32, MAX_PROC_EVENTS);
BPF_HASH(start, u32, struct offcpu_start, MAX_THREADS);
#if defined(TASK_SE_RUNTIME_OFFSET) && defined(TASK_SWITCHES_OFFSET)
#define OFFCPU_STOLEN 1
/* The watched thread running on each CPU, from its switch-in (charge_stolen()). Per CPU, not per
 * thread: two array reads and four task reads a run, where a hash map cost a locked update. */
BPF_PERCPU_ARRAY(runs, struct offcpu_cpu_runs, 1);
#endif
BPF_HASH(marks, u32, struct offcpu_mark, MAX_THREADS);
#if WAKERS
/* Blocks counted per (block, waker): see struct offcpu_waker_key. */
BPF_HASH(counts, struct offcpu_waker_key, struct offcpu_value, MAX_COUNTS);
/* Per thread off CPU now: who woke it (the sched_waking hook), until its block ends (switch_in()). */
BPF_HASH(wakers, u32, struct offcpu_wake, MAX_THREADS);
BPF_PERCPU_ARRAY(waking, struct offcpu_wake, 1); /* the record being built */
#else
BPF_HASH(counts, struct offcpu_key, struct offcpu_value, MAX_COUNTS);
#endif
BPF_HASH(hist, u32, struct offcpu_hist, MAX_HIST);
BPF_ARRAY(hist_zero, struct offcpu_hist, 1); /* never written: what a new `hist` entry starts from */
BPF_HASH(stacks, u64, struct offcpu_stack, STACK_STORAGE);
BPF_PERCPU_ARRAY(scratch, struct offcpu_stack, 1);
BPF_ARRAY(control, struct offcpu_control, 1);
BPF_PERCPU_ARRAY(stats, u64, OFFCPU_STAT_MAX);
BPF_PERCPU_ARRAY(building, struct offcpu_start, 1); /* the start entry being built (switch_out()) */
#if STACK_SAMPLING
/* LRU: threads that stop being watched (their process left the targets) never switch out as
 * watched again, so nothing would delete their entries; the LRU map evicts them instead. */
BPF_TABLE("lru_hash", u32, struct offcpu_sampler, sampler, MAX_THREADS);
BPF_PERCPU_ARRAY(cpu_sampler, struct offcpu_cpu_sampler, 1);
#endif

static __always_inline void stat_add(int index, u64 n)
{
	u64 *v = stats.lookup(&index);
	if (v)
		*v += n; /* per-CPU slot: no other writer */
}

/* An update, not `*bits |= event` through the lookup's pointer: user space takes the entries with
 * BPF_MAP_LOOKUP_AND_DELETE_BATCH, which copies and unlinks a bucket's elements under its lock, and
 * a write through a pointer taken before that lands in an element already copied and unlinked: the
 * event (an exit after a fork) was lost. An update takes the bucket lock: it lands before the copy,
 * or after the delete as a new entry for the next take. Two CPUs reporting on one process at once
 * may still lose a bit, not the entry: user space reads the process again whatever the bits say
 * (a lost exit bit leaves a process that looked alive then to the next /proc rescan). */
static __always_inline void note_process(u32 tgid, u32 event)
{
	u32 *bits = proc_events.lookup(&tgid);
	u32 merged = event | (bits ? *bits : 0);
	if (proc_events.update(&tgid, &merged) != 0)
		stat_add(OFFCPU_STAT_PROC_EVENTS_DROPPED, 1);
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

/* Whether `start` may hold an entry for thread `tid` (a pid beyond MAX_PIDS: look it up). */
static __always_inline int maybe_off_cpu(u32 tid)
{
	u8 *o = off_cpu.lookup(&tid);
	return o == NULL || *o;
}

static __always_inline void mark_off_cpu(u32 tid, u8 value)
{
	u8 *o = off_cpu.lookup(&tid);
	if (o)
		*o = value;
}

/* Stores the stack in the per-CPU scratch buffer (n frames, leaf first) under a hash of its frames.
 * Content-addressed ids (unlike bpf_get_stackid()'s bucket indices, which another stack takes over
 * once an id is freed, and which fail with -EEXIST when two stacks share a bucket) let user space
 * free unreferenced stacks at any time: a counter created meanwhile still names the same frames,
 * which user space keeps by id. */
static __always_inline u64 store_stack(struct offcpu_stack *buf, long n)
{
	if (n < 0)
		return OFFCPU_STACK_ERRNO_BASE + ((u64)-n & 0x3ff);
	if (n == 0)
		return OFFCPU_STACK_EMPTY;
	u64 h = 0x9e3779b97f4a7c15ULL ^ n;
	for (int i = 0; i < OFFCPU_MAX_DEPTH; i++) {
		if (i >= n)
			break;
		h ^= buf->ips[i];
		h *= 0xff51afd7ed558ccdULL;
		h ^= h >> 33;
	}
	if (h < OFFCPU_STACK_RESERVED)
		h += OFFCPU_STACK_RESERVED;
	int rc = stacks.insert(&h, buf);
	if (rc != 0 && rc != -EEXIST) {
		stat_add(OFFCPU_STAT_STACKS_DROPPED, 1);
		return OFFCPU_STACK_ERRNO_BASE + ENOMEM;
	}
	return h;
}

static __always_inline struct offcpu_stack *scratch_buffer(void)
{
	int zero = 0;
	return scratch.lookup(&zero);
}

/* The current task's kernel stack. */
static __always_inline u64 capture_kernel_stack(void *ctx)
{
	struct offcpu_stack *buf = scratch_buffer();
	if (!buf)
		return OFFCPU_STACK_ERRNO_BASE + ENOMEM;
	long len = bpf_get_stack(ctx, buf->ips, sizeof(buf->ips), 0); /* zeroes the rest */
	return store_stack(buf, len < 0 ? len : (long)((u64)len / sizeof(u64)));
}

/* The current task's user stack: from the DWARF CFI tables where user space has described the
 * process, else with frame pointers (the kernel's walk, cheaper where it is enough). */
static __always_inline u64 capture_user_stack(void *ctx)
{
	struct offcpu_stack *buf = scratch_buffer();
	if (!buf)
		return OFFCPU_STACK_ERRNO_BASE + ENOMEM;
#if OFFCPU_UNWIND
	u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (unwind_processes.lookup(&tgid)) {
		u32 end = 0;
		int n = unwind_user_stack(buf->ips, &end);
		if (n != -EOPNOTSUPP) {
			if (n >= 0 && n < OFFCPU_MAX_DEPTH)
				buf->ips[n] = 0; /* the frames end here: user space reads up to a 0 */
			return store_stack(buf, n);
		}
		/* A 32-bit task: no 64-bit registers for the tables; the kernel's walk handles it. */
	}
#endif
	long len = bpf_get_stack(ctx, buf->ips, sizeof(buf->ips), BPF_F_USER_STACK); /* zeroes the rest */
	return store_stack(buf, len < 0 ? len : (long)((u64)len / sizeof(u64)));
}

#if STACK_SAMPLING
/* The smallest shift with n >> shift <= budget. */
static __always_inline u32 shift_for(u32 n, u32 budget)
{
	u32 shift = 0;
#pragma unroll
	for (int i = 0; i < OFFCPU_MAX_SHIFT; i++)
		if ((n >> shift) > budget)
			shift++;
	return shift;
}

/* Whether this block of thread `tid` has its stacks captured: 0 (no) or its weight 2^shift. The
 * probability is decided from earlier windows only, so every block's weight is exactly 1 / its
 * probability and the per-stack sums are unbiased estimates. */
static __always_inline u32 sample(u32 tid, u64 now)
{
	u32 shift = 0;
	struct offcpu_sampler *t = sampler.lookup(&tid);
	if (t) {
		/* Only this thread's own switches touch its entry: no other writer at the same time. */
		u64 age = now - t->window_start_ns;
		if (age >= SAMPLE_WINDOW_NS) {
			t->shift = age < 2 * SAMPLE_WINDOW_NS ? shift_for(t->switches, THREAD_BUDGET) : 0;
			t->switches = 0;
			t->window_start_ns = now;
		}
		t->switches++;
		shift = t->shift;
	} else {
		struct offcpu_sampler init = {};
		init.window_start_ns = now;
		init.switches = 1;
		sampler.update(&tid, &init);
	}
	int zero = 0;
	struct offcpu_cpu_sampler *c = cpu_sampler.lookup(&zero);
	if (c) {
		if (now - c->window_start_ns >= SAMPLE_WINDOW_NS) {
			if (c->captures > CPU_BUDGET)
				c->shift += shift_for(c->captures, CPU_BUDGET);
			else if (c->captures < CPU_BUDGET / 4 && c->shift)
				c->shift--;
			if (c->shift > OFFCPU_MAX_SHIFT)
				c->shift = OFFCPU_MAX_SHIFT;
			c->captures = 0;
			c->window_start_ns = now;
		}
		shift += c->shift;
	}
	if (shift > OFFCPU_MAX_SHIFT)
		shift = OFFCPU_MAX_SHIFT;
	if (shift && (bpf_get_prandom_u32() & ((1u << shift) - 1)))
		return 0;
	if (c)
		c->captures++;
	return 1u << shift;
}
#else
static __always_inline u32 sample(u32 tid, u64 now)
{
	return 1;
}
#endif

/* A watched thread leaves the CPU. In tracepoint mode (capture != 0) current is that thread:
 * its stacks are captured here, for a sample of its blocks. */
static __always_inline void switch_out(void *ctx, u32 tid, u32 tgid, u32 reason, u64 now,
				       struct offcpu_control *ctl, int capture)
{
	if (ctl && ctl->cutoff_ns && now >= ctl->cutoff_ns)
		return; /* past the end of the window being measured */
	/* Built in map memory (per CPU), which the verifier does not track value by value: whatever
	 * path led here, one state reaches the stack walks (see capture_at_switch_in()). */
	int zero = 0;
	struct offcpu_start *s = building.lookup(&zero);
	if (!s)
		return;
	s->ts_ns = now;
	s->tgid = tgid;
	s->reason = reason;
	s->weight = capture ? sample(tid, now) : 0;
	s->user_stack = 0;
	s->kernel_stack = 0;
	s->flags = 0;
	if (s->weight) {
		s->user_stack = capture_user_stack(ctx);
		s->kernel_stack = capture_kernel_stack(ctx);
		stat_add(OFFCPU_STAT_CAPTURES, 1);
	}
	if (start.update(&tid, s) != 0)
		stat_add(OFFCPU_STAT_START_DROPPED, 1);
	else
		mark_off_cpu(tid, 1);
}

/* The last switch-out of a thread that exited (do_task_dead()): it never runs again, so nothing
 * stored for it would ever be consumed, and its tid may be reused by a new thread. Done for every
 * thread, watched or not: a group leader's exit takes its tgid out of `targets` before this last
 * switch (sched_process_exit); a block whose switch-in went unseen was counted just before
 * (prev_leaves()). Thread exits are rare next to switches. */
static __always_inline void forget_thread(u32 tid)
{
	start.delete(&tid);
	mark_off_cpu(tid, 0);
	marks.delete(&tid);
#if STACK_SAMPLING
	sampler.delete(&tid);
#endif
#if WAKERS
	wakers.delete(&tid);
#endif
}

/* The stacks a block is counted under: captured at switch-out (tracepoint mode, kept in the
 * thread's start entry) or at switch-in (kprobe mode). weight 0: not captured. */
struct capture {
	u64 user_stack;
	u64 kernel_stack;
	u32 weight;
};

#if WAKERS
/* The waker of thread `tid`'s block that began at `block_ts` (zeroes: none seen). Its stacks go
 * with the block's own: a block counted without stacks (weight 0) is counted without the waker's
 * either, so that the keys stay as few as today's. */
static __always_inline void woken_by(u32 tid, u64 block_ts, u32 weight, struct offcpu_waker *out)
{
	struct offcpu_wake *w = wakers.lookup(&tid);
	if (!w || w->block_ts_ns != block_ts)
		return;
	__builtin_memcpy(out, &w->waker, sizeof(*out));
	if (!weight) {
		out->user_stack = 0;
		out->kernel_stack = 0;
	}
}
#endif

/* Thread `tid`, switched out at s->ts_ns, runs again: count the block under the stacks in `cap`. */
static __always_inline void switch_in(struct offcpu_start *s, u32 tid, u64 now, struct offcpu_control *ctl,
				      struct capture *cap)
{
	u64 from = s->ts_ns;
	if (ctl) {
		if (ctl->cutoff_ns) {
			if (from >= ctl->cutoff_ns)
				goto done;
			if (now > ctl->cutoff_ns)
				now = ctl->cutoff_ns;
		}
		if (ctl->marks_active) {
			struct offcpu_mark *m = marks.lookup(&tid);
			if (m && m->start_ns == s->ts_ns) {
				/* User space counted this block up to until_ns while it lasted. */
				if (m->until_ns > from)
					from = m->until_ns;
				marks.delete(&tid);
			}
		}
	}
	u64 whole = now > s->ts_ns ? now - s->ts_ns : 0;
	u64 delta = now > from ? now - from : 0;
	if (whole < MIN_BLOCK_NS || whole > MAX_BLOCK_NS) {
		stat_add(OFFCPU_STAT_FILTERED, 1);
		stat_add(OFFCPU_STAT_FILTERED_NS, delta);
		goto done;
	}

	u32 weight = cap->weight;
#if WAKERS
	struct offcpu_waker_key full = {};
	struct offcpu_key *key = &full.block;
	woken_by(tid, s->ts_ns, weight, &full.waker);
#else
	struct offcpu_key full = {};
	struct offcpu_key *key = &full;
#endif
	key->tgid = s->tgid;
	key->tid = PER_THREAD ? tid : 0;
	key->reason = s->reason;
	if (weight) {
		key->user_stack = cap->user_stack;
		key->kernel_stack = cap->kernel_stack;
	}

	struct offcpu_value zero = {};
	struct offcpu_value *v = counts.lookup_or_try_init(&full, &zero);
	if (!v && weight) {
		/* Keep the block's exact figures under the thread's stackless key; its weighted part
		 * there tells user space how much stack-attributed time this cost. (Its waker goes too:
		 * the stackless key is the one most likely to exist already.) */
		stat_add(OFFCPU_STAT_STACK_KEYS_FOLDED, 1);
		key->user_stack = 0;
		key->kernel_stack = 0;
#if WAKERS
		__builtin_memset(&full.waker, 0, sizeof(full.waker));
#endif
		v = counts.lookup_or_try_init(&full, &zero);
	}
	if (!v) {
		stat_add(OFFCPU_STAT_COUNTS_DROPPED, 1);
		stat_add(OFFCPU_STAT_COUNTS_DROPPED_NS, delta);
		goto done;
	}
	/* Several CPUs can charge the same key at once (per-process aggregation). */
	__sync_fetch_and_add(&v->count, 1);
	__sync_fetch_and_add(&v->ns, delta);
	if (weight) {
		__sync_fetch_and_add(&v->wcount, weight);
		__sync_fetch_and_add(&v->wns, weight * delta);
	}
	stat_add(OFFCPU_STAT_BLOCKS, 1);

	u64 us = whole / 1000;
	u32 slot = us ? bpf_log2l(us) : 0;
	if (slot >= OFFCPU_HIST_SLOTS)
		slot = OFFCPU_HIST_SLOTS - 1;
	u32 tgid = s->tgid, first = 0;
	struct offcpu_hist *zero_hist = hist_zero.lookup(&first);
	struct offcpu_hist *h = zero_hist ? hist.lookup_or_try_init(&tgid, zero_hist) : NULL;
	if (h) {
		/* Opaque to the compiler, which would otherwise drop the mask as redundant with the
		 * clamp above (libbpf's barrier_var()). */
		asm volatile("" : "+r"(slot));
		__sync_fetch_and_add(&h->slots[slot & (OFFCPU_HIST_ROOM - 1)], 1);
	} else {
		stat_add(OFFCPU_STAT_HIST_DROPPED, 1);
	}
done:
	start.delete(&tid);
	mark_off_cpu(tid, 0);
#if WAKERS
	wakers.delete(&tid);
#endif
}

static __always_inline struct offcpu_control *control_now(void)
{
	int zero = 0;
	return control.lookup(&zero);
}

/* A thread about to switch out (or exiting) that the maps still hold off CPU: the switch-in that
 * ended its last block was never reported. Seen where the sched_switch tracepoint does not fire for
 * some switches: a sandbox's hardened kernel that hides its own agent's threads, so the switch from
 * one of them to a watched thread goes unseen. The block is counted as ending when the thread was
 * last picked to run: now minus the CPU time it has had since (sched_entity::sum_exec_runtime -
 * prev_sum_exec_runtime, brought up to date by the scheduler before the switch is traced; the two
 * differ by the interrupt time in between). It is also counted as missed, so that it shows. The
 * same holds for a block user space seeded (in_progress.py): either its switch-in went unseen so,
 * or the thread woke while it was being seeded (user space then takes the block back, unless it
 * ended here first); either way it was off CPU from the seed's start until that pick, and the pick
 * is never before the seed's start (the max() below). Called before the switch-out's stack walks,
 * like the switch-in of `next`. */
static __always_inline void end_unseen_block(void *task, u32 tid, u64 now, struct offcpu_control *ctl)
{
	struct offcpu_start *s = start.lookup(&tid);
	if (!s)
		return;
	stat_add(OFFCPU_STAT_MISSED_SWITCH_INS, 1);
#ifdef TASK_SE_RUNTIME_OFFSET
	u64 sum = 0, picked = 0;
	bpf_probe_read_kernel(&sum, sizeof(sum), (char *)task + TASK_SE_RUNTIME_OFFSET);
	bpf_probe_read_kernel(&picked, sizeof(picked), (char *)task + TASK_SE_PREV_RUNTIME_OFFSET);
	u64 ran = sum > picked ? sum - picked : 0;
	u64 end = now > s->ts_ns + ran ? now - ran : s->ts_ns;
	struct capture cap = {s->user_stack, s->kernel_stack, s->weight};
	switch_in(s, tid, end, ctl, &cap);
#else
	/* Without BTF the run time cannot be read: the block is not counted. */
	marks.delete(&tid);
	start.delete(&tid);
	mark_off_cpu(tid, 0);
#endif
}

#ifdef OFFCPU_STOLEN
static __always_inline u64 task_u64(void *task, int offset)
{
	u64 v = 0;
	bpf_probe_read_kernel(&v, sizeof(v), (char *)task + offset);
	return v;
}

/* Switches the thread made (task_struct::nvcsw + nivcsw, adjacent): the scheduler counts the
 * switch before the sched_switch tracepoint fires, and before finish_task_switch() runs. */
static __always_inline u64 task_switches(void *task)
{
	u64 both[2] = {};
	bpf_probe_read_kernel(both, sizeof(both), (char *)task + TASK_SWITCHES_OFFSET);
	return both[0] + both[1];
}
#endif

/* A watched thread that was off CPU starts to run (see charge_stolen()). */
static __always_inline void run_starts(void *task, u32 tid, u64 now)
{
#ifdef OFFCPU_STOLEN
	int zero = 0;
	struct offcpu_cpu_runs *r = runs.lookup(&zero);
	if (!r)
		return;
	/* The hooks take next before prev: the run that ends at this switch is kept for prev. */
	r->earlier = r->latest;
	r->latest.tid = tid;
	r->latest.ts_ns = now;
	r->latest.runtime_ns = task_u64(task, TASK_SE_RUNTIME_OFFSET);
	r->latest.switches = task_switches(task);
#endif
}

/* A watched thread's run ends: the part of it the thread did not run is counted as stolen. From its
 * switch-in to its switch-out a thread is current on its CPU, and the scheduler accounts it the
 * run time (sum_exec_runtime, what CLOCK_THREAD_CPUTIME_ID and schedstat report) of all of that
 * but what the CPU spent elsewhere without a switch: a hypervisor's other guests (with
 * CONFIG_PARAVIRT_TIME_ACCOUNTING the steal is kept out of the task clock: update_rq_clock_task()
 * in kernel/sched/core.c) and interrupts (with CONFIG_IRQ_TIME_ACCOUNTING). The thread wanted the
 * CPU all that time: without this, on-CPU + off-CPU fell short of the wall clock by it (1.9% of a
 * thread's 600 ms on a loaded cloud VM). Only a run this CPU saw begin, with exactly one switch
 * since (this one): a run whose switch-out went unreported (end_unseen_block()) may hold blocks
 * counted elsewhere. Gaps up to STOLEN_MIN_NS are the switch's own cost (the clock is read after
 * the scheduler picked the next task). No stack says where in the run the time went: it is
 * counted under OFFCPU_STACK_STOLEN. */
static __always_inline void charge_stolen(void *task, u32 tid, u32 tgid, u64 now, struct offcpu_control *ctl)
{
#ifdef OFFCPU_STOLEN
	int zero = 0;
	struct offcpu_cpu_runs *runs_here = runs.lookup(&zero);
	if (!runs_here)
		return;
	struct offcpu_run *r = runs_here->latest.tid == tid ? &runs_here->latest :
			       runs_here->earlier.tid == tid ? &runs_here->earlier : NULL;
	if (!r)
		return;
	r->tid = 0;
	if (task_switches(task) != r->switches + 1)
		return; /* not one run: a stale entry, or switches the kernel did not report */
	u64 ran = task_u64(task, TASK_SE_RUNTIME_OFFSET) - r->runtime_ns;
	u64 elapsed = now > r->ts_ns ? now - r->ts_ns : 0;
	if ((s64)ran < 0 || elapsed <= ran + STOLEN_MIN_NS)
		return;
	if (ctl && ctl->cutoff_ns && now > ctl->cutoff_ns)
		return; /* after the final flush's cutoff, as switch_in() */
	u64 stolen = elapsed - ran;
#if WAKERS
	struct offcpu_waker_key full = {}; /* no waker: nothing woke a running thread */
	struct offcpu_key *key = &full.block;
#else
	struct offcpu_key full = {};
	struct offcpu_key *key = &full;
#endif
	key->tgid = tgid;
	key->tid = PER_THREAD ? tid : 0;
	key->reason = OFFCPU_REASON_STOLEN;
	key->user_stack = OFFCPU_STACK_STOLEN;
	key->kernel_stack = OFFCPU_STACK_EMPTY;
	struct offcpu_value empty = {};
	struct offcpu_value *v = counts.lookup_or_try_init(&full, &empty);
	if (!v) {
		stat_add(OFFCPU_STAT_COUNTS_DROPPED, 1);
		stat_add(OFFCPU_STAT_COUNTS_DROPPED_NS, stolen);
		return;
	}
	/* Time, not a switch: the count (the switches) stays. Weight 1: all of it is under this one
	 * stack. */
	__sync_fetch_and_add(&v->ns, stolen);
	__sync_fetch_and_add(&v->wns, stolen);
#endif
}

/* prev leaves the CPU. A block the maps still hold for it ended unseen (end_unseen_block()); then
 * either this is its last switch (it exited: its entries go) or, watched, a new block starts. */
static __always_inline void prev_leaves(void *ctx, void *task, u32 tid, u32 tgid, int dead, u32 reason, u64 now,
					int capture)
{
	if (!now)
		now = bpf_ktime_get_ns();
	struct offcpu_control *ctl = control_now();
	if (maybe_off_cpu(tid))
		end_unseen_block(task, tid, now, ctl);
	else if (!dead)
		charge_stolen(task, tid, tgid, now, ctl);
	if (dead)
		forget_thread(tid); /* watched or not: see forget_thread() */
	else
		switch_out(ctx, tid, tgid, reason, now, ctl, capture);
}

/* task_struct::__state bits (include/linux/sched.h), unchanged since 4.14 and written out here
 * so that no hook depends on the headers bcc compiles against. */
#define OFFCPU_TASK_INTERRUPTIBLE   0x0001
#define OFFCPU_TASK_UNINTERRUPTIBLE 0x0002
#define OFFCPU_TASK_DEAD            0x0080
#define OFFCPU_TASK_WAKING          0x0200
#define OFFCPU_TASK_NOLOAD          0x0400
#define OFFCPU_TASK_RTLOCK_WAIT     0x1000 /* PREEMPT_RT: blocked on a sleeping spinlock (5.15+) */
#define OFFCPU_TASK_FROZEN          0x8000 /* the freezer (6.1+) */

#if defined(OFFCPU_ATTACH_KPROBE) || defined(OFFCPU_ATTACH_RAW_TRACEPOINT)
/* A raw task state (what __schedule() read from task_struct::__state) to a reason. The flag bits
 * (TASK_FREEZABLE, TASK_WAKEKILL) ride on a sleep state and do not change it. A PREEMPT_RT
 * sleeping-spinlock wait (TASK_RTLOCK_WAIT) and a frozen task go where the kernel's own reports
 * put them, uninterruptible (__task_state_index() in include/linux/sched.h, what the sched_switch
 * tracepoint and /proc/PID/stat show): the perf-event tracepoint cannot tell them apart, and a
 * thread's reasons must not depend on the hook. */
static __always_inline u32 reason_of_raw_state(u32 state)
{
	if (state == 0)
		return OFFCPU_REASON_RUNNABLE;
	if (state & OFFCPU_TASK_INTERRUPTIBLE)
		return OFFCPU_REASON_SLEEPING;
	if ((state & OFFCPU_TASK_UNINTERRUPTIBLE) && (state & OFFCPU_TASK_NOLOAD))
		return OFFCPU_REASON_SLEEPING; /* TASK_IDLE */
	if (state & (OFFCPU_TASK_UNINTERRUPTIBLE | OFFCPU_TASK_RTLOCK_WAIT | OFFCPU_TASK_FROZEN))
		return OFFCPU_REASON_UNINTERRUPTIBLE;
	return OFFCPU_REASON_OTHER; /* stopped, traced, parked, dead */
}
#endif

#ifdef OFFCPU_ATTACH_KPROBE
/* prev may already be being woken on another CPU while this runs: try_to_wake_up() sets
 * TASK_WAKING before it waits for prev to leave the CPU, and the sleep state is gone. The
 * scheduler recorded at the switch whether that sleep counted to the load average
 * (uninterruptible, not TASK_NOLOAD): task_struct::sched_contributes_to_load, a bitfield found
 * through BTF (TASK_LOAD_BIT). (A PREEMPT_RT lock wait does not count to the load: woken during
 * its switch, it counts as sleeping.) */
static __always_inline u32 reason_of_task_state(struct task_struct *prev, u32 state)
{
	if (state & OFFCPU_TASK_WAKING) {
#ifdef TASK_LOAD_BIT
		u32 word = 0;
		bpf_probe_read_kernel(&word, sizeof(word), (void *)prev + (TASK_LOAD_BIT / 32) * 4);
		if (word & (1u << (TASK_LOAD_BIT % 32)))
			return OFFCPU_REASON_UNINTERRUPTIBLE;
#endif
		return OFFCPU_REASON_SLEEPING;
	}
	return reason_of_raw_state(state);
}

/* prev's tid, tgid and state. With BTF (TASK_*_OFFSET from the loader, offcpu_exporter/probe/
 * task_layout.py) at this kernel's offsets, whatever headers bcc compiled against; without it
 * at the headers' (which must then match the kernel). */
struct prev_task {
	u32 pid;
	u32 tgid;
	u32 state;
};

static __always_inline void read_prev(struct task_struct *prev, struct prev_task *t)
{
#ifdef TASK_TGID_OFFSET
	bpf_probe_read_kernel(&t->pid, sizeof(t->pid), (void *)prev + TASK_PID_OFFSET);
	bpf_probe_read_kernel(&t->tgid, sizeof(t->tgid), (void *)prev + TASK_TGID_OFFSET);
#if TASK_STATE_SIZE == 8
	u64 state = 0; /* `volatile long state` before 5.14 */
	bpf_probe_read_kernel(&state, sizeof(state), (void *)prev + TASK_STATE_OFFSET);
	t->state = state;
#else
	bpf_probe_read_kernel(&t->state, sizeof(t->state), (void *)prev + TASK_STATE_OFFSET);
#endif
#else
	t->pid = prev->pid;
	t->tgid = prev->tgid;
#if LINUX_VERSION_CODE >= KERNEL_VERSION(5, 14, 0)
	t->state = prev->__state;
#else
	t->state = prev->state;
#endif
#endif
}

/* kprobe mode: current has just been switched in and its stacks are the ones it blocked in. Which
 * blocks have them captured is decided from the block's length, before anything else the handler
 * does: the DWARF unwinder is verified once per distinct verifier state that reaches it, and the
 * fewer branches before it, the fewer states (the 1M-instruction verification limit). */
BPF_PERCPU_ARRAY(captures, struct capture, 1);

static __always_inline void capture_at_switch_in(void *ctx, struct offcpu_start *s, u32 tid, u64 now,
						 struct capture *cap)
{
	cap->weight = 0;
	u64 whole = now > s->ts_ns ? now - s->ts_ns : 0;
	if (whole < MIN_BLOCK_NS || whole > MAX_BLOCK_NS)
		return; /* not counted: no stacks needed */
	u32 weight = sample(tid, now);
	if (whole >= LONG_BLOCK_NS)
		weight = 1; /* captured with probability 1 */
	/* Kept in map memory, which the verifier does not track value by value: whatever path led
	 * here, one state reaches the walks below. */
	cap->weight = weight;
	if (!cap->weight)
		return;
	cap->user_stack = capture_user_stack(ctx);
	cap->kernel_stack = capture_kernel_stack(ctx);
	stat_add(OFFCPU_STAT_CAPTURES, 1);
}

int offcpu_finish_task_switch(struct pt_regs *ctx, struct task_struct *prev)
{
	u64 now = bpf_ktime_get_ns();
	u32 tid = bpf_get_current_pid_tgid();
	struct offcpu_start *s = maybe_off_cpu(tid) ? start.lookup(&tid) : NULL;
	int zero = 0;
	struct capture *cap = captures.lookup(&zero);
	if (s && cap) {
		capture_at_switch_in(ctx, s, tid, now, cap);
		switch_in(s, tid, now, control_now(), cap);
		run_starts((void *)bpf_get_current_task(), tid, now);
	}

	struct prev_task t = {};
	read_prev(prev, &t);
	int dead = (t.state & OFFCPU_TASK_DEAD) != 0;
	if (dead || is_target(t.tgid))
		prev_leaves(ctx, prev, t.pid, t.tgid, dead, reason_of_task_state(prev, t.state), now, 0);
	return OFFCPU_KEEP_EVENT;
}
#endif

#ifdef OFFCPU_ATTACH_TRACEPOINT
/* prev_state as the tracepoint reports it (__trace_sched_switch_state): TASK_REPORT_MAX (0x100)
 * when preempted, else one bit per state (1 interruptible, 2 uninterruptible, 0x10 EXIT_DEAD,
 * 0x20 EXIT_ZOMBIE, 0x80 idle, ...). */
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
	u64 now = 0; /* read only when a watched thread is involved: most switches are of others */
	u64 id = bpf_get_current_pid_tgid(); /* current is still prev here */
	u32 tgid = id >> 32;

	/* next first, then prev: the stack walks come last, with little after them to verify again
	 * for each way they can end. */
	u32 next = args->next_pid;
	struct offcpu_start *s = maybe_off_cpu(next) ? start.lookup(&next) : NULL;
	if (s) {
		now = bpf_ktime_get_ns();
		struct capture cap = {s->user_stack, s->kernel_stack, s->weight};
		switch_in(s, next, now, control_now(), &cap);
	}

	long state = args->prev_state;
	int dead = (state & 0xff) && (state & 0x30); /* exit_state reported */
	if (dead || is_target(tgid))
		prev_leaves(args, (void *)bpf_get_current_task(), (u32)id, tgid, dead, reason_of_tracepoint_state(state),
			    now, 1);
	return OFFCPU_KEEP_EVENT;
}
#endif

/* task:task_newtask runs in the parent (current) before the child can run, and its clone_flags
 * tell new threads (same tgid) from processes. */
TRACEPOINT_PROBE(task, task_newtask)
{
	if (args->clone_flags & CLONE_THREAD)
		return OFFCPU_KEEP_EVENT;
	u32 child = args->pid;
	note_process(child, OFFCPU_PROC_FORK);
#if FOLLOW_CHILDREN && !WATCH_ALL
	/* A child process of a watched process is watched from its first instruction: a /proc scan
	 * would miss short-lived ones. */
	u32 parent = bpf_get_current_pid_tgid() >> 32;
	if (!is_target(parent))
		return OFFCPU_KEEP_EVENT;
	u8 watch = OFFCPU_TARGET_WATCH;
	struct offcpu_child c = {};
	c.fork_boot_ns = bpf_ktime_get_boot_ns();
	c.parent_tgid = parent;
	bpf_probe_read_kernel(&c.comm, sizeof(c.comm), args->comm);
	/* children first: user space treats a target it did not add as stale unless it is a child. */
	if (children.update(&child, &c) == 0)
		targets.update(&child, &watch);
#endif
	return OFFCPU_KEEP_EVENT;
}

TRACEPOINT_PROBE(sched, sched_process_exec)
{
	note_process(bpf_get_current_pid_tgid() >> 32, OFFCPU_PROC_EXEC);
	return OFFCPU_KEEP_EVENT;
}

/* The renamed task is current for prctl(PR_SET_NAME), the common way; a write to another task's
 * /proc/PID/comm is seen by user space's periodic rescan. Only the group leader's comm is the
 * process's (/proc/PID/comm, what --comm matches). */
TRACEPOINT_PROBE(task, task_rename)
{
	u64 id = bpf_get_current_pid_tgid();
	if ((u32)id == (u32)(id >> 32))
		note_process(id >> 32, OFFCPU_PROC_RENAME);
	return OFFCPU_KEEP_EVENT;
}

#ifdef OFFCPU_ATTACH_RAW_TRACEPOINT
/* TP_PROTO(bool preempt, struct task_struct *prev, struct task_struct *next, unsigned int
 * prev_state): prev_state is the raw task state (since 5.18), preempt says it was preempted. */
RAW_TRACEPOINT_PROBE(sched_switch)
{
	u64 now = 0; /* read only when a watched thread is involved: most switches are of others */
	u64 id = bpf_get_current_pid_tgid(); /* current is still prev here */
	u32 tgid = id >> 32;

	/* next first, then prev: see the perf-event tracepoint's handler. */
	u32 next = 0;
	bpf_probe_read_kernel(&next, sizeof(next), (void *)ctx->args[2] + TASK_PID_OFFSET);
	struct offcpu_start *s = maybe_off_cpu(next) ? start.lookup(&next) : NULL;
	if (s) {
		now = bpf_ktime_get_ns();
		struct capture cap = {s->user_stack, s->kernel_stack, s->weight};
		switch_in(s, next, now, control_now(), &cap);
		run_starts((void *)ctx->args[2], next, now);
	}

	u64 preempt = ctx->args[0], state = ctx->args[3];
	void *prev = (void *)ctx->args[1];
	int dead = !preempt && (state & OFFCPU_TASK_DEAD); /* do_task_dead(): its last switch */
	if (dead || is_target(tgid))
		prev_leaves(ctx, prev, (u32)id, tgid, dead, preempt ? OFFCPU_REASON_RUNNABLE : reason_of_raw_state(state),
			    now, 1);
	return OFFCPU_KEEP_EVENT; /* ignored for raw tracepoints; kept alike */
}
#endif

#if WAKERS
#ifndef TASK_STACK_OFFSET
#error "wakers need task_struct's layout from BTF (TASK_STACK_OFFSET)"
#endif
#ifndef THREAD_SIZE
#define THREAD_SIZE 16384 /* x86-64 without KASAN; the kernel headers define it */
#endif
#ifndef TOP_OF_KERNEL_STACK_PADDING
#define TOP_OF_KERNEL_STACK_PADDING 0 /* x86-64 without FRED */
#endif

/* Whether this wake-up runs in interrupt context, where the current task is only the one the
 * interrupt landed on. x86-64 runs hard interrupts, the softirqs run at their exit or at
 * local_bh_enable() (do_softirq_own_stack()) and NMIs on the CPU's own stacks, never on the task's
 * (arch/x86/include/asm/irq_stack.h); softirqs run by ksoftirqd run on ksoftirqd's stack, and
 * ksoftirqd is then the waker. preempt_count() would say the same, but it is a per-CPU variable
 * whose address is not in kallsyms without CONFIG_KALLSYMS_ALL, and helpers cannot read it. The
 * program's own locals cannot tell either: since 6.14 programs of this type with a stack of 64
 * bytes or more run on a private per-CPU stack (bpf_enable_priv_stack() in kernel/bpf/verifier.c).
 * The raw tracepoint's argument array is a local of bpf_trace_run1() (kernel/trace/bpf_trace.c),
 * on the stack the tracepoint fired on: outside the task's stack, it is an interrupt's.
 * Except for an interrupt from user mode, which x86-64 runs on the task's (empty) stack
 * (call_on_irqstack_cond() in arch/x86/include/asm/irq_stack.h), softirqs at its exit included:
 * its entry frame is then the task's pt_regs at the top of that stack, with orig_ax -1 (idtentry),
 * where a system call has its number and a kernel thread zeroes. (An exception from user mode, a
 * page fault, has -1 too: a wake-up from its handler is taken for an interrupt's.) */
static __always_inline int in_interrupt_context(void *ctx)
{
	void *task = (void *)bpf_get_current_task();
	u64 base = 0;
	bpf_probe_read_kernel(&base, sizeof(base), (char *)task + TASK_STACK_OFFSET);
	u64 at = 0;
	/* The context pointer's value as a number (a privileged program may read its own pointers). */
	bpf_probe_read_kernel(&at, sizeof(at), &ctx);
	if (base == 0 || at - base >= THREAD_SIZE)
		return 1;
#if defined(PT_REGS_SIZE) && defined(PT_REGS_ORIG_AX_OFFSET)
	s64 orig_ax = 0;
	bpf_probe_read_kernel(&orig_ax, sizeof(orig_ax), (char *)base + THREAD_SIZE - TOP_OF_KERNEL_STACK_PADDING -
			      PT_REGS_SIZE + PT_REGS_ORIG_AX_OFFSET);
	return orig_ax == -1;
#else
	return 0;
#endif
}

#ifdef OFFCPU_ATTACH_KPROBE
/* kprobe mode: whether the block's own stacks are captured is decided at its switch-in, after the
 * wake-up. The waker's are taken for a block already long enough to be captured for sure
 * (LONG_BLOCK_NS), and for the others within the CPU's capture budget: 1 in 2^shift of them at
 * the CPU's sampling shift, counted among its captures (which raise the shift when over budget). */
static __always_inline int waker_capture(struct offcpu_start *s)
{
#if STACK_SAMPLING
	u64 now = bpf_ktime_get_ns();
	if (now - s->ts_ns >= LONG_BLOCK_NS)
		return 1;
	int zero = 0;
	struct offcpu_cpu_sampler *c = cpu_sampler.lookup(&zero);
	if (!c)
		return 0;
	u32 shift = c->shift > OFFCPU_MAX_SHIFT ? OFFCPU_MAX_SHIFT : c->shift;
	if (shift && (bpf_get_prandom_u32() & ((1u << shift) - 1)))
		return 0;
	c->captures++;
#endif
	return 1;
}
#endif

/* TP_PROTO(struct task_struct *p): try_to_wake_up() is waking p, on the waker's CPU and in its
 * context (kernel/sched/core.c); fired once per wake-up that changes p's state. For a watched
 * thread whose block is in progress, the waker is kept until the block ends (switch_in()). Its
 * stacks are taken for the blocks whose own stacks are: in tracepoint mode those with a weight in
 * their start entry; in kprobe mode the decision comes at switch-in, after this: they are taken
 * within the CPU's budget (waker_capture()), and dropped at switch-in with the block's if it is
 * not captured (woken_by()). */
RAW_TRACEPOINT_PROBE(sched_waking)
{
	void *p = (void *)ctx->args[0];
	u32 tid = 0;
	bpf_probe_read_kernel(&tid, sizeof(tid), (char *)p + TASK_PID_OFFSET);
	if (!maybe_off_cpu(tid))
		return 0;
	struct offcpu_start *s = start.lookup(&tid);
	if (!s)
		return 0;
	int zero = 0;
	struct offcpu_wake *w = waking.lookup(&zero);
	if (!w)
		return 0;
	__builtin_memset(w, 0, sizeof(*w));
	w->block_ts_ns = s->ts_ns;
#ifdef OFFCPU_ATTACH_KPROBE
	int capture = waker_capture(s);
#else
	int capture = s->weight != 0;
#endif
	if (in_interrupt_context(ctx)) {
		w->waker.context = OFFCPU_WAKER_INTERRUPT;
		if (capture) {
			/* Not the interrupted task's user stack: it has nothing to do with this wake-up. */
			w->waker.user_stack = OFFCPU_STACK_EMPTY;
			w->waker.kernel_stack = capture_kernel_stack(ctx);
		}
	} else {
		u64 id = bpf_get_current_pid_tgid();
		w->waker.context = OFFCPU_WAKER_TASK;
		w->waker.tgid = id >> 32;
		w->waker.tid = id;
		bpf_get_current_comm(w->waker.comm, sizeof(w->waker.comm));
		if (capture) {
			w->waker.user_stack = capture_user_stack(ctx);
			w->waker.kernel_stack = capture_kernel_stack(ctx);
		}
	}
	/* (Not in OFFCPU_STAT_CAPTURES, the blocks whose stacks were captured: the share of captured
	 * blocks is read from it.) */
	if (wakers.update(&tid, w) != 0)
		stat_add(OFFCPU_STAT_WAKERS_DROPPED, 1);
	return 0;
}
#endif

/* When the group leader exits, stop watching the tgid at once, so that a new process reusing the
 * PID is not counted as the old one before user space decides whether it is a target. (Threads'
 * own entries go at their last switch-out: sched_process_exit runs before it.) */
TRACEPOINT_PROBE(sched, sched_process_exit)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 tid = id;
	u32 tgid = id >> 32;
	if (tid == tgid) {
		u8 none = 0;
		targets.update(&tgid, &none);
		note_process(tgid, OFFCPU_PROC_EXIT);
	}
	return OFFCPU_KEEP_EVENT;
}
