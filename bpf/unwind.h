/* User-stack unwinding from DWARF CFI tables, for code built without frame pointers.
 *
 * A drop-in for bpf_get_stack(ctx, ips, size, BPF_F_USER_STACK) in a program that runs in the
 * context of the task whose stack it wants (sched_switch at switch-out, finish_task_switch at
 * switch-in): unwind_user_stack(ips, &end) fills ips with the current task's user stack, leaf first
 * (the pc the task will resume at, then return addresses), and returns the number of frames, or a
 * negative errno when the task has no user registers (kernel thread, 32-bit task).
 *
 * Each frame is looked up in the process's mappings (unwind_processes says where in
 * unwind_mappings they are; both written by offcpu_exporter/unwind/ from /proc/PID/maps), the
 * mapping's page index (unwind_pages) and its rows (unwind_rows): the row gives the CFA and where
 * rbp was saved, the return address is at CFA - 8. Code without a table (JIT code, objects without CFI, processes user space has not
 * described yet) is stepped with the frame pointer instead, so mixed stacks go on through it.
 *
 * Written for the verifier's complexity limit (1M instructions explored; bpf_loop callbacks are
 * not relocated by bcc): one bounded loop over frames, and inside it two fixed-step binary searches
 * without data-dependent branches (the next index is computed with masks), so that every path
 * through a frame reaches the loop head with the same verifier state and is pruned there.
 *
 * The including program defines, like the rest of the probe (-D):
 *   UNWIND_MAX_FRAMES     frames per stack, the length of the caller's ips buffer (<= 127)
 *   UNWIND_MAX_ROWS       entries of unwind_rows (12 bytes each)
 *   UNWIND_MAX_PAGES      entries of unwind_pages (8 bytes each)
 *   UNWIND_MAX_PROCESSES  processes with tables (unwind_processes, allocated on use: 8 bytes each)
 *   UNWIND_MAX_MAPPING_SLOTS  entries of unwind_mappings, all processes' together (32 bytes each)
 *   UNWIND_REGS_BTF       1: user registers through bpf_task_pt_regs(bpf_get_current_task_btf())
 *                         (BTF, 5.15+); 0: from task->stack with the kernel headers' layout
 */
#ifndef UNWIND_H
#define UNWIND_H

#include <uapi/linux/ptrace.h>
#include <linux/sched.h>
#include <uapi/asm-generic/errno-base.h>
#include "unwind_table.h"

#ifndef UNWIND_MAX_FRAMES
#define UNWIND_MAX_FRAMES 127
#endif

BPF_ARRAY(unwind_rows, struct unwind_row, UNWIND_MAX_ROWS);
BPF_ARRAY(unwind_pages, struct unwind_page, UNWIND_MAX_PAGES);
BPF_ARRAY(unwind_mappings, struct unwind_mapping, UNWIND_MAX_MAPPING_SLOTS);
BPF_F_TABLE("hash", u32, struct unwind_process, unwind_processes, UNWIND_MAX_PROCESSES, BPF_F_NO_PREALLOC);
BPF_PERCPU_ARRAY(unwind_stats, u64, UNWIND_STAT_MAX);

/* struct rt_sigframe on x86-64 (arch/x86/include/asm/sigframe.h): after the handler's return
 * address comes a ucontext whose uc_mcontext (struct sigcontext) starts 40 bytes in; these are
 * the offsets from the trampoline's rsp of the interrupted rbp, rsp and rip (what glibc's CFI for
 * __restore_rt says with DW_CFA_expression rules). */
#define UNWIND_SIGFRAME_RBP 120
#define UNWIND_SIGFRAME_RSP 160
#define UNWIND_SIGFRAME_RIP 168

static __always_inline void unwind_stat(u32 index)
{
	u64 *v = unwind_stats.lookup(&index);
	if (v)
		*v += 1; /* per-CPU slot: no other writer */
}

/* 1 when a <= b, for values below 2^63 (user addresses), without a branch. */
static __always_inline u64 unwind_le(u64 a, u64 b)
{
	return 1 ^ ((b - a) >> 63);
}

/* The mapping holding pc: the last one starting at or before it, by halving (count <= 256). */
static __always_inline struct unwind_mapping *unwind_find_mapping(struct unwind_process *proc, u64 pc)
{
	u32 n = proc->count;
	u32 first = proc->first;
	if (n == 0 || n > UNWIND_MAX_MAPPINGS)
		return NULL;
	u32 lo = 0;
#pragma unroll
	for (int k = 0; k < UNWIND_MAX_MAPPINGS_SHIFT; k++) {
		u32 half = n >> 1;
		u32 mid = first + lo + half;
		struct unwind_mapping *probe = unwind_mappings.lookup(&mid);
		if (!probe)
			return NULL;
		u64 take = unwind_le(probe->start, pc);
		lo += half & (u32)-take;
		n = half + ((n & 1) & (u32)take);
	}
	u32 at = first + lo;
	struct unwind_mapping *m = unwind_mappings.lookup(&at);
	if (!m || pc < m->start || pc >= m->end)
		return NULL;
	return m;
}

/* The row in effect at table address `addr` of mapping m; false when there is none. */
static __always_inline bool unwind_find_row(struct unwind_mapping *m, u64 addr, struct unwind_row *out)
{
	u64 page = addr >> UNWIND_PAGE_SHIFT;
	if (page >= m->page_count)
		return false;
	u32 page_index = m->page_first + (u32)page;
	struct unwind_page *pg = unwind_pages.lookup(&page_index);
	if (!pg)
		return false;
	u32 lo = pg->first;
	u32 n = pg->count;
	if (n == 0 || n > (1 << UNWIND_SEARCH_STEPS))
		return false;
#pragma unroll
	for (int k = 0; k < UNWIND_SEARCH_STEPS; k++) {
		u32 half = n >> 1;
		u32 mid = lo + half;
		struct unwind_row *row = unwind_rows.lookup(&mid);
		if (!row)
			return false;
		u64 take = unwind_le(row->pc, addr);
		lo += half & (u32)-take;
		n = half + ((n & 1) & (u32)take);
	}
	struct unwind_row *row = unwind_rows.lookup(&lo);
	if (!row)
		return false;
	*out = *row;
	return true;
}

struct unwind_regs {
	u64 ip;
	u64 sp;
	u64 bp;
};

/* The current task's user registers, saved at kernel entry (task_pt_regs). */
static __always_inline int unwind_user_regs(struct unwind_regs *r)
{
	struct pt_regs *regs;
#if UNWIND_REGS_BTF
	regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
#else
	/* task_pt_regs() on x86-64: the top of the task's kernel stack (TOP_OF_KERNEL_STACK_PADDING
	 * is 0 there since 4.1). Reads task_struct.stack at the headers' offset: needs matching headers. */
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	void *stack = NULL;
	bpf_probe_read_kernel(&stack, sizeof(stack), &task->stack);
	if (!stack)
		return -EFAULT;
	regs = (struct pt_regs *)(stack + THREAD_SIZE) - 1;
#endif
	u64 cs = 0;
	if (bpf_probe_read_kernel(&cs, sizeof(cs), &regs->cs) != 0)
		return -EFAULT;
	/* A kernel thread's saved registers are not user ones; __USER32_CS (0x23) is a compat task,
	 * whose stack these 64-bit tables do not describe. __USER_CS is 0x33. */
	if (cs != 0x33)
		return -EOPNOTSUPP;
	if (bpf_probe_read_kernel(&r->ip, sizeof(r->ip), &regs->ip) != 0 ||
	    bpf_probe_read_kernel(&r->sp, sizeof(r->sp), &regs->sp) != 0 ||
	    bpf_probe_read_kernel(&r->bp, sizeof(r->bp), &regs->bp) != 0)
		return -EFAULT;
	return 0;
}

/* Fills ips[0 .. UNWIND_MAX_FRAMES) with the current task's user stack, leaf first, and returns
 * the number of frames (or -EOPNOTSUPP / -EFAULT: no user stack). *end says why the walk stopped
 * (UNWIND_END_*): UNWIND_END_ROOT means the stack is complete up to its outermost frame. */
static __always_inline int unwind_user_stack(u64 *ips, u32 *end)
{
	struct unwind_regs r = {};
	int err = unwind_user_regs(&r);
	if (err) {
		*end = UNWIND_END_NO_REGS;
		unwind_stat(UNWIND_END_NO_REGS);
		return err;
	}
	u32 tgid = bpf_get_current_pid_tgid() >> 32;
	struct unwind_process *proc = unwind_processes.lookup(&tgid);
	if (!proc)
		unwind_stat(UNWIND_STAT_NO_PROCESS);

	u64 pc = r.ip, sp = r.sp, bp = r.bp;
	u64 after_call = 0; /* 1 when pc is a return address: look up the call instruction (pc - 1) */
	u32 how = UNWIND_END_DEPTH;
	int n = 0;
	for (int i = 0; i < UNWIND_MAX_FRAMES; i++) {
		ips[i] = pc;
		n = i + 1;

		struct unwind_row row = {};
		u64 lookup = pc - after_call;
		struct unwind_mapping *m = proc ? unwind_find_mapping(proc, lookup) : NULL;
		if (m && !unwind_find_row(m, lookup - m->bias, &row))
			row.cfa_rule = UNWIND_CFA_NONE;

		u64 cfa;
		u8 rule = row.cfa_rule;
		if (rule == UNWIND_CFA_END) {
			how = UNWIND_END_ROOT;
			break;
		}
		if (rule == UNWIND_CFA_SIGNAL) {
			u64 saved[3] = {};
			if (bpf_probe_read_user(&saved[0], 8, (void *)(sp + UNWIND_SIGFRAME_RBP)) != 0 ||
			    bpf_probe_read_user(&saved[1], 16, (void *)(sp + UNWIND_SIGFRAME_RSP)) != 0) {
				how = UNWIND_END_FAULT;
				break;
			}
			unwind_stat(UNWIND_STAT_FRAMES_SIGNAL);
			bp = saved[0];
			sp = saved[1];
			pc = saved[2];
			after_call = 0; /* the interrupted instruction itself */
			if (pc == 0) {
				how = UNWIND_END_FP_ZERO;
				break;
			}
			continue;
		}
		if (rule == UNWIND_CFA_RSP) {
			cfa = sp + row.cfa_offset;
		} else if (rule == UNWIND_CFA_RBP) {
			cfa = bp + row.cfa_offset;
		} else if (rule == UNWIND_CFA_PLT) {
			cfa = sp + 8 + (((pc & 15) >= (u64)row.cfa_offset) << 3);
		} else {
			/* No usable row: the frame pointer, as bpf_get_stack would. */
			if (bp == 0) {
				how = UNWIND_END_FP_ZERO;
				break;
			}
			cfa = bp + 16;
			row.rbp_rule = UNWIND_RBP_OFFSET;
			row.rbp_offset = -16;
		}
		if (rule == UNWIND_CFA_RSP || rule == UNWIND_CFA_RBP || rule == UNWIND_CFA_PLT)
			unwind_stat(UNWIND_STAT_FRAMES_CFI);
		else if (rule == UNWIND_CFA_BAD)
			unwind_stat(UNWIND_STAT_FRAMES_BAD);
		else
			unwind_stat(UNWIND_STAT_FRAMES_FP);
		if (cfa <= sp) {
			how = UNWIND_END_BAD_FRAME;
			break;
		}
		u64 ra = 0;
		if (bpf_probe_read_user(&ra, sizeof(ra), (void *)(cfa - 8)) != 0) {
			how = UNWIND_END_FAULT;
			break;
		}
		if (row.rbp_rule == UNWIND_RBP_OFFSET &&
		    bpf_probe_read_user(&bp, sizeof(bp), (void *)(cfa + row.rbp_offset)) != 0) {
			how = UNWIND_END_FAULT;
			break;
		}
		if (ra == 0) {
			how = UNWIND_END_FP_ZERO;
			break;
		}
		sp = cfa;
		pc = ra;
		after_call = 1;
	}
	*end = how;
	unwind_stat(how);
	return n;
}

#endif
