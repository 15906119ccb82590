/* Key/value layouts and constants shared by offcpu.bpf.c and offcpu_exporter/probe/layout.py.
 * Only fixed-width types; layout.py mirrors every struct and tests/unit/probe/test_layout.py checks both
 * sides agree (sizes and offsets). */
#ifndef OFFCPU_H
#define OFFCPU_H

/* Why the thread left the CPU, from the task state at switch-out (offcpu_exporter.snapshot.Reason). */
#define OFFCPU_REASON_RUNNABLE        0 /* preempted, still wanted the CPU */
#define OFFCPU_REASON_SLEEPING        1 /* TASK_INTERRUPTIBLE (and TASK_IDLE) */
#define OFFCPU_REASON_UNINTERRUPTIBLE 2 /* TASK_UNINTERRUPTIBLE: I/O, D state */
#define OFFCPU_REASON_OTHER           3 /* stopped, traced, parked */
#define OFFCPU_REASON_STOLEN          4 /* on a CPU that ran something else without a switch: the
                                         * hypervisor's other guests (steal), interrupts (with
                                         * IRQ time accounting), switches the kernel did not report */

/* Indices of the per-CPU `stats` array. */
#define OFFCPU_STAT_COUNTS_DROPPED    0  /* blocks not stored at all: `counts` full */
#define OFFCPU_STAT_COUNTS_DROPPED_NS 1  /* their off-CPU nanoseconds */
#define OFFCPU_STAT_START_DROPPED     2  /* switch-outs not stored: `start` full */
#define OFFCPU_STAT_HIST_DROPPED      3  /* blocks not in the histogram: `hist` full */
#define OFFCPU_STAT_FILTERED          4  /* blocks outside --min-block/--max-block */
#define OFFCPU_STAT_FILTERED_NS       5  /* their off-CPU nanoseconds */
#define OFFCPU_STAT_STACKS_DROPPED    6  /* stack captures not stored: `stacks` full */
#define OFFCPU_STAT_STACK_KEYS_FOLDED 7  /* captured blocks whose per-stack counter could not be
                                          * created: counted under the thread's stackless key */
#define OFFCPU_STAT_BLOCKS            8  /* blocks counted (switch-ins of watched threads) */
#define OFFCPU_STAT_CAPTURES          9  /* blocks whose stacks were captured */
#define OFFCPU_STAT_MISSED_SWITCH_INS 10 /* blocks whose switch-in went unreported */
#define OFFCPU_STAT_PROC_EVENTS_DROPPED 11 /* process events not stored: `proc_events` full */
#define OFFCPU_STAT_WAKERS_DROPPED    12 /* wake-ups not stored (WAKERS): `wakers` full; the block
                                          * is counted without its waker */
#define OFFCPU_STAT_MAX               13

/* Block-duration histogram: slot 0 is < 1 us, slot i (1..25) is [2^(i-1), 2^i) us,
 * slot 26 everything from 2^25 us (~33.5 s) on. */
#define OFFCPU_HIST_SLOTS 27

/* Stack ids are 64-bit hashes of the frames (content-addressed: an id always means the same
 * frames, so user space may cache by id and free ids without a race). Ids below
 * OFFCPU_STACK_RESERVED are not hashes: */
#define OFFCPU_STACK_NOT_CAPTURED 0    /* the block's stacks were not sampled */
#define OFFCPU_STACK_EMPTY        1    /* no frames (a kernel thread's user half) */
#define OFFCPU_STACK_SEEDED       2    /* blocked before it was watched, and this half of its stack
                                        * could not be read from /proc (see OFFCPU_START_SEEDED) */
#define OFFCPU_STACK_STOLEN       3    /* time a running thread lost without a switch
                                        * (OFFCPU_REASON_STOLEN): no stack tells where */
#define OFFCPU_STACK_ERRNO_BASE   1024 /* + errno of a capture that failed (EFAULT, ENOMEM: full) */
#define OFFCPU_STACK_RESERVED     4096
#define OFFCPU_MAX_DEPTH          127  /* PERF_MAX_STACK_DEPTH */

struct offcpu_key {
	__u32 tgid;
	__u32 tid;             /* 0 when aggregating per process */
	__u32 reason;          /* OFFCPU_REASON_* */
	__u32 pad;
	__u64 user_stack;      /* a stack id (see OFFCPU_STACK_*) */
	__u64 kernel_stack;
};

/* Every block adds to `count`/`ns` of exactly one key (exact figures). A block whose stacks were
 * captured with probability 1/w also adds w and w * ns to `wcount`/`wns` (the sampled estimate of
 * the stack; w is 1 without sampling). On a stackless key, `wcount`/`wns` hold captured blocks
 * whose own key could not be created. */
struct offcpu_value {
	__u64 count;
	__u64 ns;
	__u64 wcount;
	__u64 wns;
};

/* A thread that was switched out and has not run since. */
struct offcpu_start {
	__u64 ts_ns;
	__u64 user_stack;      /* captured at switch-out in tracepoint mode, else NOT_CAPTURED */
	__u64 kernel_stack;
	__u32 tgid;
	__u32 reason;
	__u32 weight;          /* 1/probability of the capture; 0 when not captured */
	__u32 flags;           /* OFFCPU_START_* */
};

/* The watched thread running on a CPU, from its switch-in: when, and its run time
 * (task_struct::se.sum_exec_runtime) and switches (nvcsw + nivcsw) then. */
struct offcpu_run {
	__u32 tid;             /* 0: none */
	__u32 pad;
	__u64 ts_ns;
	__u64 runtime_ns;
	__u64 switches;
};

struct offcpu_cpu_runs {
	struct offcpu_run latest;   /* switched in last */
	struct offcpu_run earlier;  /* before it: prev's, until the switch that ends it is handled */
};

/* struct offcpu_waker.context: where the wake-up ran (WAKERS). */
#define OFFCPU_WAKER_NONE      0 /* no wake-up seen: preempted, woken before the probe saw the block,
                                  * or the waker's record was not stored */
#define OFFCPU_WAKER_TASK      1 /* a task woke it: tgid, tid, comm and both stacks are the waker's */
#define OFFCPU_WAKER_INTERRUPT 2 /* woken from interrupt context (a hard or soft IRQ or an NMI, on
                                  * the CPU's interrupt stack): the task it interrupted is not the
                                  * waker; only the kernel stack (e.g. hrtimer_wakeup) is kept */

/* Who ended a block (WAKERS): what the sched_waking hook saw in the waking task. */
struct offcpu_waker {
	__u32 tgid;            /* 0 with OFFCPU_WAKER_NONE or _INTERRUPT */
	__u32 tid;
	__u32 context;         /* OFFCPU_WAKER_* */
	__u32 pad;
	__u64 user_stack;      /* a stack id; OFFCPU_STACK_NOT_CAPTURED when not sampled */
	__u64 kernel_stack;
	char comm[16];
};

/* The `counts` key when built with WAKERS: the block's key and its waker. */
struct offcpu_waker_key {
	struct offcpu_key block;
	struct offcpu_waker waker;
};

/* `wakers` values: the waker of a thread's block in progress, until the block ends. */
struct offcpu_wake {
	__u64 block_ts_ns;     /* offcpu_start.ts_ns of the block it woke: a stale record never
	                        * applies to a later block */
	struct offcpu_waker waker;
};

/* struct offcpu_start.flags */
#define OFFCPU_START_SEEDED 1 /* stored by user space for a thread already off CPU when it became
                               * watched (its stacks read from /proc, or OFFCPU_STACK_SEEDED); the
                               * kernel treats it as any block, the flag tells it apart in a map dump */

/* Written by user space for a thread that is still off CPU at a flush: the block's time up to
 * `until_ns` is already counted, so its switch-in counts from there. Applies only to the block
 * that started at `start_ns`. */
struct offcpu_mark {
	__u64 start_ns;
	__u64 until_ns;
};

/* Written by user space (one element). */
struct offcpu_control {
	__u64 cutoff_ns;       /* non-zero: nothing is counted after this time (a window's end) */
	__u32 marks_active;    /* the `marks` map may hold entries: look them up at switch-in */
	__u32 pad;
};

struct offcpu_stack {
	__u64 ips[OFFCPU_MAX_DEPTH];
};

/* Stack-capture sampling state of one thread: its switch-outs in the current window, and the
 * sampling shift (captures 1 in 2^shift) computed from the previous window. */
struct offcpu_sampler {
	__u64 window_start_ns;
	__u32 switches;
	__u32 shift;
};

/* The same per CPU, over the captures made there: a cap on the whole CPU's capture rate. */
struct offcpu_cpu_sampler {
	__u64 window_start_ns;
	__u32 captures;
	__u32 shift;
};

/* A process forked by a watched process while --follow-children is on. User space reads it to name
 * children that exited before it saw them in /proc (same address space as the parent until exec). */
struct offcpu_child {
	__u64 fork_boot_ns; /* bpf_ktime_get_boot_ns() at fork: the child's start time */
	__u32 parent_tgid;
	__u32 pad;
	char comm[16];      /* inherited from the parent until exec */
};

/* Values of the `targets` map. */
/* `proc_events` values: what happened to a process since user space last drained the map. */
#define OFFCPU_PROC_FORK   1 /* a new process (not a thread) */
#define OFFCPU_PROC_EXEC   2
#define OFFCPU_PROC_EXIT   4 /* its group leader exited */
#define OFFCPU_PROC_RENAME 8 /* its group leader changed its comm (prctl(PR_SET_NAME)) */

#define OFFCPU_TARGET_WATCH   1
#define OFFCPU_TARGET_EXCLUDE 2 /* with WATCH_ALL: everything but these */

/* `hist` value, per process: one entry whatever the spread of its blocks' lengths (an entry per
 * (process, slot) filled a 16,384-entry map at ~2,000 real processes). */
#define OFFCPU_HIST_ROOM 32 /* slots[] has room for any index masked with 31: older verifiers lose a
                             * compare's bounds across the helper calls between it and the access
                             * (6.1: "R0 unbounded memory access"), not a mask's */
struct offcpu_hist {
	__u64 slots[OFFCPU_HIST_ROOM]; /* the first OFFCPU_HIST_SLOTS are used */
};

#endif
