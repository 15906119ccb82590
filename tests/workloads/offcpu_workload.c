/* Test workloads with known blocking, for the end-to-end tests.
 *
 * Built with -O0 -fno-omit-frame-pointer. Every blocking system call is made with an inline
 * `syscall` instruction from a named function, so that the leaf user frame of the off-CPU stack is
 * that function even though Debian's glibc has no frame pointers. Frames above it are our own
 * functions (with frame pointers) up to main / the thread start routine.
 *
 * Usage: offcpu_workload MODE [--threads N] [--iterations N] [--interval-ms MS] [--wait-go]
 *   sleep   each thread: N x clock_nanosleep(MS)                        in offcpu_sleep_ms
 *   pipe    each thread blocks in read() of a pipe; a writer thread writes every MS ms
 *                                                                        in offcpu_pipe_read
 *   mutex   threads contend on a futex lock held MS ms by each holder    in offcpu_lock_wait
 *   child   forks N short-lived children, each sleeps MS ms once           in offcpu_child_sleep
 *   churn   creates and joins N short-lived threads one after another (--iterations N), each
 *           sleeping MS ms once before it exits                         in offcpu_sleep_ms
 *   bucket  for N x MS ms, threads take one futex hash bucket's lock as fast as they can (a
 *           FUTEX_WAIT whose value never matches returns at once, after the lock): on PREEMPT_RT
 *           that spinlock_t sleeps (TASK_RTLOCK_WAIT) when its holder was preempted
 *                                                                        in offcpu_lock_wait
 *
 * With --wait-go it prints "ready <pid>" and waits for a line on stdin before working, so that the
 * probe is attached first. At the end it prints one JSON line: per thread, its tid, the named
 * blocking function, the time spent inside that function's system calls (CLOCK_MONOTONIC around
 * each call) and wall/on-CPU figures from schedstat.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_THREADS 64

static int threads = 1, iterations = 50, interval_ms = 20;
static const char *mode;
static int pipe_fds[2];
static atomic_int lock_word;

struct thread_result {
	long tid;
	const char *function;
	uint64_t blocked_ns;  /* time inside the blocking system calls */
	uint64_t blocked_off_ns; /* of that, off CPU: wall minus the thread's CPU time around each call */
	uint64_t calls;       /* number of blocking calls that returned */
	uint64_t blocks;      /* of those, the ones that had to wait (so left the CPU once) */
	uint64_t start_ns, end_ns;
	uint64_t oncpu_start_ns, oncpu_end_ns; /* /proc/self/task/TID/schedstat field 1 */
	uint64_t runq_start_ns, runq_end_ns;   /* field 2: run-queue wait */
	uint64_t slices_start, slices_end;     /* field 3: times switched in */
	uint64_t hist[27];                     /* blocking calls per log2(us) slot, as bpf/offcpu.h */
};
static struct thread_result results[MAX_THREADS];

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static uint64_t thread_cpu_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static long raw_syscall4(long nr, long a, long b, long c, long d)
{
	long ret;
	register long r10 __asm__("r10") = d;
	__asm__ volatile("syscall" : "=a"(ret) : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10)
			 : "rcx", "r11", "memory");
	return ret;
}

/* Each named function below issues its own syscall instruction: it is the leaf user frame. */
__attribute__((noinline)) void offcpu_sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
	long ret;
	register long r10 __asm__("r10") = 0;
	__asm__ volatile("syscall" : "=a"(ret)
			 : "a"(SYS_clock_nanosleep), "D"(CLOCK_MONOTONIC), "S"(0), "d"(&ts), "r"(r10)
			 : "rcx", "r11", "memory");
}

__attribute__((noinline)) long offcpu_pipe_read(int fd, char *buf, long len)
{
	long ret;
	__asm__ volatile("syscall" : "=a"(ret) : "a"(SYS_read), "D"(fd), "S"(buf), "d"(len)
			 : "rcx", "r11", "memory");
	return ret;
}

__attribute__((noinline)) long offcpu_lock_wait(atomic_int *word)
{
	long ret;
	register long r10 __asm__("r10") = 0;
	__asm__ volatile("syscall" : "=a"(ret)
			 : "a"(SYS_futex), "D"(word), "S"(FUTEX_WAIT_PRIVATE), "d"(2), "r"(r10)
			 : "rcx", "r11", "memory");
	return ret;
}

static atomic_int bucket_word; /* stays 0: every wait on it (for 2) mismatches */

__attribute__((noinline)) void offcpu_child_sleep(int ms)
{
	offcpu_sleep_ms(ms);
}

static void lock_acquire(struct thread_result *r)
{
	int c = 0;
	if (atomic_compare_exchange_strong(&lock_word, &c, 1))
		return;
	if (c != 2)
		c = atomic_exchange(&lock_word, 2);
	while (c != 0) {
		uint64_t c0 = thread_cpu_ns(), t0 = now_ns();
		long ret = offcpu_lock_wait(&lock_word);
		uint64_t dt = now_ns() - t0, dc = thread_cpu_ns() - c0;
		r->blocked_ns += dt;
		r->blocked_off_ns += dt > dc ? dt - dc : 0;
		r->calls++;
		if (ret != -EAGAIN) /* EAGAIN: the word changed before the call; it never slept */
			r->blocks++;
		c = atomic_exchange(&lock_word, 2);
	}
}

static void lock_release(void)
{
	if (atomic_fetch_sub(&lock_word, 1) != 1) {
		atomic_store(&lock_word, 0);
		raw_syscall4(SYS_futex, (long)&lock_word, FUTEX_WAKE_PRIVATE, 1, 0);
	}
}

static void busy_ms(int ms)
{
	uint64_t end = now_ns() + (uint64_t)ms * 1000000ull;
	while (now_ns() < end)
		;
}

static void count_block(struct thread_result *r, uint64_t ns, uint64_t cpu_ns)
{
	r->blocked_off_ns += ns > cpu_ns ? ns - cpu_ns : 0;
	uint64_t us = ns / 1000;
	int slot = 0;
	while (us) { /* slot i holds [2^(i-1), 2^i) us */
		slot++;
		us >>= 1;
	}
	r->hist[slot > 26 ? 26 : slot]++;
	r->blocked_ns += ns;
	r->calls++;
	r->blocks++;
}

__attribute__((noinline)) void sleep_worker(struct thread_result *r)
{
	for (int i = 0; i < iterations; i++) {
		uint64_t c0 = thread_cpu_ns(), t0 = now_ns();
		offcpu_sleep_ms(interval_ms);
		uint64_t t1 = now_ns();
		count_block(r, t1 - t0, thread_cpu_ns() - c0);
	}
}

__attribute__((noinline)) void pipe_worker(struct thread_result *r)
{
	char c;
	for (;;) {
		int ready = 0;
		ioctl(pipe_fds[0], FIONREAD, &ready); /* a byte already there: this read will not wait */
		if (ready == 0)
			r->blocks++;
		uint64_t c0 = thread_cpu_ns(), t0 = now_ns();
		long n = offcpu_pipe_read(pipe_fds[0], &c, 1);
		uint64_t dt = now_ns() - t0, dc = thread_cpu_ns() - c0;
		r->blocked_ns += dt;
		r->blocked_off_ns += dt > dc ? dt - dc : 0;
		r->calls++;
		if (n <= 0 || c == 'q')
			break;
	}
}

__attribute__((noinline)) void bucket_worker(struct thread_result *r)
{
	uint64_t end = now_ns() + (uint64_t)iterations * interval_ms * 1000000ull;
	while (now_ns() < end) {
		uint64_t c0 = thread_cpu_ns(), t0 = now_ns();
		offcpu_lock_wait(&bucket_word);
		uint64_t dt = now_ns() - t0, dc = thread_cpu_ns() - c0;
		r->blocked_ns += dt;
		r->blocked_off_ns += dt > dc ? dt - dc : 0;
		r->calls++;
	}
}

__attribute__((noinline)) void mutex_worker(struct thread_result *r)
{
	for (int i = 0; i < iterations; i++) {
		lock_acquire(r);
		busy_ms(interval_ms);
		lock_release();
	}
}

/* System calls issued from the calling function itself (no libc, no vDSO): a preemption at any
 * point of the edge code below has that function as its leaf user frame, whatever unwinds the stack
 * (a frame-pointer walk through libc or the vDSO, built without frame pointers, would skip it). */
static __always_inline long edge_syscall3(long nr, long a, long b, long c)
{
	long ret;
	__asm__ volatile("syscall" : "=a"(ret) : "a"(nr), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
	return ret;
}

static __always_inline uint64_t edge_clock(clockid_t clock)
{
	struct timespec ts = { 0, 0 };
	edge_syscall3(SYS_clock_gettime, clock, (long)&ts, 0);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

/* Fields 2 and 3 of /proc/self/task/TID/schedstat (run-queue ns, times switched in), without libc.
 * Its on-CPU figure (field 1) lags by up to a slice for a running thread: on-CPU time is
 * CLOCK_THREAD_CPUTIME_ID (the same sum_exec_runtime, brought up to date). */
static __always_inline void edge_schedstat(const char *path, uint64_t *runq, uint64_t *slices)
{
	char buf[96];
	uint64_t field[3] = { 0, 0, 0 };
	long fd = edge_syscall3(SYS_open, (long)path, O_RDONLY, 0), n = 0;
	if (fd >= 0) {
		n = edge_syscall3(SYS_read, fd, (long)buf, sizeof(buf) - 1);
		edge_syscall3(SYS_close, fd, 0, 0);
	}
	for (long i = 0, f = 0; i < n && f < 3; i++) {
		if (buf[i] >= '0' && buf[i] <= '9')
			field[f] = field[f] * 10 + (uint64_t)(buf[i] - '0');
		else if (buf[i] == ' ')
			f++;
	}
	*runq = field[1];
	*slices = field[2];
}

/* Marks the edges of a thread's measured window with a short sleep under its own name, and takes
 * the window's edges (wall clock, CPU time, schedstat) inside this same function, right next to
 * the sleep. An off-CPU interval is charged when it ends (switch-in): the opening mark's sleep ends
 * just before the window opens, the closing mark's just after it closes, and every other counted
 * interval of the thread ends inside it. Tests leave out the samples of this function, and those
 * outside thread_main (the thread's start and exit paths): a preemption while the edges are taken
 * is one of them, and it lies outside the window (before its start, after its end) but for the few
 * instructions between the clock read and the return, or the call and the clock read. (With the
 * edges taken by the caller, a preemption between the mark and the clock read was counted in the
 * window though outside it: 4.5 ms over in a CI run; a preemption in the new thread's
 * schedule_tail, 30 ms on the emulated PREEMPT_RT guest, was counted before the exit paths were
 * left out.) The opening mark also reads the thread's id, so that nothing of thread_main's precedes
 * it. */
__attribute__((noinline)) void offcpu_window_mark(struct thread_result *r, int opening)
{
	struct timespec ts = { 0, 1000000L }; /* 1 ms, its own syscall: no other named frame below */
	if (opening)
		r->tid = edge_syscall3(SYS_gettid, 0, 0, 0);
	char path[48] = "/proc/self/task/";
	int at = 16;
	char digits[20];
	int nd = 0;
	for (long t = r->tid; t > 0 && nd < 20; t /= 10)
		digits[nd++] = (char)('0' + t % 10);
	while (nd > 0)
		path[at++] = digits[--nd];
	const char *tail = "/schedstat";
	for (int i = 0; tail[i]; i++)
		path[at++] = tail[i];
	path[at] = 0;
	if (!opening) {
		r->end_ns = edge_clock(CLOCK_MONOTONIC);
		r->oncpu_end_ns = edge_clock(CLOCK_THREAD_CPUTIME_ID);
		edge_schedstat(path, &r->runq_end_ns, &r->slices_end);
	}
	long ret;
	register long r10 __asm__("r10") = 0;
	__asm__ volatile("syscall" : "=a"(ret)
			 : "a"(SYS_clock_nanosleep), "D"(CLOCK_MONOTONIC), "S"(0), "d"(&ts), "r"(r10)
			 : "rcx", "r11", "memory");
	if (opening) {
		edge_schedstat(path, &r->runq_start_ns, &r->slices_start);
		r->oncpu_start_ns = edge_clock(CLOCK_THREAD_CPUTIME_ID);
		r->start_ns = edge_clock(CLOCK_MONOTONIC);
	}
}

static void *thread_main(void *arg)
{
	struct thread_result *r = arg;
	/* The worker is chosen before the window opens: inside it, a preemption in a frameless libc
	 * callee of thread_main's (strcmp) walks by frame pointers to start_thread, skipping
	 * thread_main, and tests would take it for the thread's start (seen on the PREEMPT_RT guest). */
	void (*worker)(struct thread_result *);
	if (!strcmp(mode, "sleep")) {
		r->function = "offcpu_sleep_ms";
		worker = sleep_worker;
	} else if (!strcmp(mode, "pipe")) {
		r->function = "offcpu_pipe_read";
		worker = pipe_worker;
	} else if (!strcmp(mode, "bucket")) {
		r->function = "offcpu_lock_wait";
		worker = bucket_worker;
	} else {
		r->function = "offcpu_lock_wait";
		worker = mutex_worker;
	}
	offcpu_window_mark(r, 1);
	worker(r);
	offcpu_window_mark(r, 0);
	return NULL;
}

/* A sleep whose timer fires before the thread reaches schedule() (its vCPU stolen by the host, or
 * the thread preempted in between) never leaves the CPU as a sleep: each thread counts the voluntary
 * switches its sleep really made, the truth a test compares with. */
static atomic_ulong churn_slept;

static void *churn_thread(void *arg)
{
	(void)arg;
	struct rusage before, after;
	getrusage(RUSAGE_THREAD, &before);
	offcpu_sleep_ms(interval_ms);
	getrusage(RUSAGE_THREAD, &after);
	atomic_fetch_add(&churn_slept, (unsigned long)(after.ru_nvcsw - before.ru_nvcsw));
	return NULL;
}

/* Thread churn: every thread's last switch-out is its exit (do_task_dead()). */
static void run_churn(void)
{
	struct thread_result *r = &results[0];
	r->tid = syscall(SYS_gettid);
	r->function = "offcpu_sleep_ms";
	r->start_ns = now_ns();
	for (int i = 0; i < iterations; i++) {
		pthread_t t;
		if (pthread_create(&t, NULL, churn_thread, NULL) != 0)
			exit(1);
		pthread_join(t, NULL);
		r->calls++;
	}
	r->blocks = atomic_load(&churn_slept); /* the threads' sleeps that left the CPU */
	r->end_ns = now_ns();
}

static void run_children(void)
{
	struct thread_result *r = &results[0];
	/* Each child times its own sleep into memory shared with the parent. */
	uint64_t *blocked = mmap(NULL, sizeof(uint64_t) * (size_t)iterations, PROT_READ | PROT_WRITE,
				 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (blocked == MAP_FAILED)
		exit(1);
	r->tid = getpid();
	r->function = "offcpu_child_sleep";
	r->start_ns = now_ns();
	for (int i = 0; i < iterations; i++) {
		pid_t pid = fork();
		if (pid == 0) {
			uint64_t c0 = thread_cpu_ns(), t0 = now_ns();
			offcpu_child_sleep(interval_ms);
			uint64_t dt = now_ns() - t0, dc = thread_cpu_ns() - c0;
			blocked[i] = dt > dc ? dt - dc : 0; /* off CPU inside the sleep */
			_exit(0);
		}
		int status;
		waitpid(pid, &status, 0);
		r->calls++;
		r->blocks++;
		r->blocked_ns += blocked[i];
	}
	r->end_ns = now_ns();
}

int main(int argc, char **argv)
{
	int wait_go = 0;
	if (argc < 2) {
		fprintf(stderr, "usage: %s sleep|pipe|mutex|child|churn [--threads N] [--iterations N] "
				"[--interval-ms MS] [--wait-go]\n", argv[0]);
		return 2;
	}
	mode = argv[1];
	for (int i = 2; i < argc; i++) {
		if (!strcmp(argv[i], "--threads") && i + 1 < argc)
			threads = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--iterations") && i + 1 < argc)
			iterations = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--interval-ms") && i + 1 < argc)
			interval_ms = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--wait-go"))
			wait_go = 1;
		else {
			fprintf(stderr, "unknown argument %s\n", argv[i]);
			return 2;
		}
	}
	if (threads < 1 || threads > MAX_THREADS)
		threads = 1;
	if (wait_go) {
		char line[16];
		printf("ready %d\n", getpid());
		fflush(stdout);
		if (!fgets(line, sizeof(line), stdin))
			return 1;
	}
	uint64_t t0 = now_ns(), joined = 0;
	int n = threads;
	if (!strcmp(mode, "child")) {
		n = 1;
		run_children();
	} else if (!strcmp(mode, "churn")) {
		n = 1;
		run_churn();
	} else {
		pthread_t tids[MAX_THREADS], writer = 0;
		if (!strcmp(mode, "pipe") && pipe(pipe_fds) != 0)
			return 1;
		for (int i = 0; i < n; i++)
			pthread_create(&tids[i], NULL, thread_main, &results[i]);
		if (!strcmp(mode, "pipe")) {
			(void)writer;
			for (int i = 0; i < iterations; i++) {
				busy_ms(0);
				struct timespec ts = { interval_ms / 1000, (long)(interval_ms % 1000) * 1000000L };
				nanosleep(&ts, NULL);
				for (int t = 0; t < n; t++)
					if (write(pipe_fds[1], "x", 1) != 1)
						return 1;
			}
			/* The quit byte comes a tick later too: every read of a single reader blocks. */
			struct timespec ts = { interval_ms / 1000, (long)(interval_ms % 1000) * 1000000L };
			nanosleep(&ts, NULL);
			for (int t = 0; t < n; t++)
				if (write(pipe_fds[1], "q", 1) != 1)
					return 1;
		}
		joined = now_ns();
		for (int i = 0; i < n; i++)
			pthread_join(tids[i], NULL);
	}
	uint64_t t1 = now_ns();
	printf("{\"pid\": %d, \"mode\": \"%s\", \"iterations\": %d, \"interval_ms\": %d, \"wall_ns\": %llu, "
	       "\"joined_ns\": %llu, \"threads\": [", getpid(), mode, iterations, interval_ms,
	       (unsigned long long)(t1 - t0), (unsigned long long)joined);
	for (int i = 0; i < n; i++) {
		struct thread_result *r = &results[i];
		printf("%s{\"hist\": [", i ? ", " : "");
		for (int h = 0; h < 27; h++)
			printf("%s%llu", h ? ", " : "", (unsigned long long)r->hist[h]);
		printf("], \"tid\": %ld, \"function\": \"%s\", \"blocked_ns\": %llu, \"calls\": %llu, "
		       "\"blocks\": %llu, \"blocked_off_ns\": %llu, "
		       "\"wall_ns\": %llu, \"oncpu_ns\": %llu, \"runq_ns\": %llu, \"switches\": %llu, \"opened_ns\": %llu}",
		       r->tid, r->function, (unsigned long long)r->blocked_ns,
		       (unsigned long long)r->calls, (unsigned long long)r->blocks,
		       (unsigned long long)(r->blocked_off_ns ? r->blocked_off_ns : r->blocked_ns), (unsigned long long)(r->end_ns - r->start_ns),
		       (unsigned long long)(r->oncpu_end_ns - r->oncpu_start_ns),
		       (unsigned long long)(r->runq_end_ns - r->runq_start_ns),
		       (unsigned long long)(r->slices_end - r->slices_start), (unsigned long long)r->start_ns);
	}
	printf("]}\n");
	fflush(stdout);
	return 0;
}
