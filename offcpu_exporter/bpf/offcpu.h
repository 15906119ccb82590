/* Key/value layouts and constants shared by offcpu_exporter/bpf/offcpu.bpf.c and offcpu_exporter/probe/layout.py.
 * Only fixed-width types; offcpu_exporter/probe/layout.py mirrors every struct and
 * tests/unit/test_layout.py checks both sides agree (sizes and offsets). */
#ifndef OFFCPU_H
#define OFFCPU_H

/* Why the thread left the CPU, from the task state at switch-out (offcpu_exporter.snapshot.Reason). */
#define OFFCPU_REASON_RUNNABLE        0 /* preempted, still wanted the CPU */
#define OFFCPU_REASON_SLEEPING        1 /* TASK_INTERRUPTIBLE (and TASK_IDLE) */
#define OFFCPU_REASON_UNINTERRUPTIBLE 2 /* TASK_UNINTERRUPTIBLE: I/O, D state */
#define OFFCPU_REASON_OTHER           3 /* stopped, traced, parked, dead */

/* Indices of the per-CPU `stats` array. */
#define OFFCPU_STAT_COUNTS_DROPPED    0 /* switches not stored: `counts` full */
#define OFFCPU_STAT_COUNTS_DROPPED_NS 1 /* their off-CPU nanoseconds */
#define OFFCPU_STAT_START_DROPPED     2 /* switch-outs not stored: `start` full */
#define OFFCPU_STAT_HIST_DROPPED      3 /* blocks not stored: `hist` full */
#define OFFCPU_STAT_FILTERED          4 /* blocks outside --min-block/--max-block */
#define OFFCPU_STAT_STACKS_SPILLED    5 /* stack captures stored in `stack_spill` (collided) */
#define OFFCPU_STAT_MAX               6

/* Block-duration histogram: slot 0 is < 1 us, slot i (1..25) is [2^(i-1), 2^i) us,
 * slot 26 everything from 2^25 us (~33.5 s) on. */
#define OFFCPU_HIST_SLOTS 27

struct offcpu_key {
	__u32 tgid;
	__u32 tid;             /* 0 when aggregating per process */
	__s32 user_stack_id;   /* negative: -errno of bpf_get_stackid (lost stack); from
	                        * STACK_SPILL_BASE on: an id in `stack_spill` plus that base */
	__s32 kernel_stack_id;
	__u32 reason;          /* OFFCPU_REASON_* */
};

struct offcpu_value {
	__u64 count;    /* switches (the reference's Times) */
	__u64 total_ns; /* off-CPU nanoseconds (the reference's Deltas) */
};

/* A thread that was switched out and has not run since. */
struct offcpu_start {
	__u64 ts_ns;
	__u32 tgid;
	__u32 reason;
	__s32 user_stack_id;   /* captured at switch-out in tracepoint mode */
	__s32 kernel_stack_id;
};

/* A process forked by a watched one while --follow-children is on. User space reads it to name
 * children that exited before it saw them in /proc (same address space as the parent until exec). */
struct offcpu_child {
	__u64 fork_boot_ns; /* bpf_ktime_get_boot_ns() at fork: the child's start time */
	__u32 parent_tgid;
	__u32 pad;
	char comm[16];      /* inherited from the parent until exec */
};

/* Values of the `targets` map. */
#define OFFCPU_TARGET_WATCH   1
#define OFFCPU_TARGET_EXCLUDE 2 /* with WATCH_ALL: everything but these */

struct offcpu_hist_key {
	__u32 tgid;
	__u32 slot;
};

#endif
