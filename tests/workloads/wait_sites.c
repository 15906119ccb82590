/* The workload of issue 16: three code paths that block through one helper.
 *
 *   hold_in_nanosleep       sleeps MS ms, N times                          (thread "sleeper")
 *   wait_for_pipe_message   reads a pipe until the quit byte               (thread "reader")
 *   feed_pipe_periodically  sleeps MS ms, then writes a byte, N times      (thread "feeder")
 *
 * Each calls syscall() below for its blocking system call: the leaf user frame of every stack is
 * that one helper, and two of the three stacks (the sleeps) also share the kernel frame
 * (do_nanosleep), as in the issue. The helper is named like the C library's wrapper on purpose: it
 * stands for the libc leaf of real programs, with a frame pointer (Debian's glibc has none, so a
 * stack walked through it loses its caller). Built with -O0 -fno-omit-frame-pointer; the system call
 * is an inline `syscall` instruction, so the helper is the leaf frame.
 *
 * Usage: wait_sites paths [--threads N] [--iterations N] [--interval-ms MS] [--wait-go]
 *   --threads N: N threads of each code path (each reader has its own feeder and pipe)
 * With --wait-go it prints "ready <pid>" and waits for a line on stdin. At the end it prints one JSON
 * line: per thread its tid, name, code path (function), the time spent inside its blocking calls
 * (CLOCK_MONOTONIC around each call) and of that the part off CPU (minus the thread's CPU time in
 * the call), its calls, and its wall and on-CPU time from its first to its last instruction of work.
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MAX_PER_PATH 16

static int per_path = 1, iterations = 50, interval_ms = 20;

struct thread_result {
	long tid;
	const char *name;
	const char *function;
	int fd; /* the reader's read end, the feeder's write end */
	uint64_t blocked_ns, blocked_off_ns, calls;
	uint64_t start_ns, end_ns, oncpu_start_ns, oncpu_end_ns;
};
static struct thread_result results[3 * MAX_PER_PATH];

static uint64_t clock_ns(clockid_t clock)
{
	struct timespec ts;
	clock_gettime(clock, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

/* Named as the C library's wrapper (same prototype, so it replaces it in this program). */
long syscall(long number, ...)
{
	va_list ap;
	va_start(ap, number);
	long a = va_arg(ap, long), b = va_arg(ap, long), c = va_arg(ap, long), d = va_arg(ap, long);
	va_end(ap);
	long ret;
	register long r10 __asm__("r10") = d;
	__asm__ volatile("syscall" : "=a"(ret) : "a"(number), "D"(a), "S"(b), "d"(c), "r"(r10)
			 : "rcx", "r11", "memory");
	return ret;
}

/* A system call through the helper, timed: wall time inside it, and of that the part off CPU. A
 * macro, not a function: the code path's own function must be the helper's caller on the stack. */
#define TIMED_SYSCALL(r, ...)                                                                         \
	({                                                                                            \
		uint64_t c0_ = clock_ns(CLOCK_THREAD_CPUTIME_ID), t0_ = clock_ns(CLOCK_MONOTONIC);    \
		long ret_ = syscall(__VA_ARGS__);                                                     \
		uint64_t dt_ = clock_ns(CLOCK_MONOTONIC) - t0_;                                       \
		uint64_t dc_ = clock_ns(CLOCK_THREAD_CPUTIME_ID) - c0_;                               \
		(r)->blocked_ns += dt_;                                                               \
		(r)->blocked_off_ns += dt_ > dc_ ? dt_ - dc_ : 0;                                     \
		(r)->calls++;                                                                         \
		ret_;                                                                                 \
	})

static struct timespec interval(void)
{
	return (struct timespec){ interval_ms / 1000, (long)(interval_ms % 1000) * 1000000L };
}

__attribute__((noinline)) void hold_in_nanosleep(struct thread_result *r)
{
	struct timespec ts = interval();
	for (int i = 0; i < iterations; i++)
		TIMED_SYSCALL(r, SYS_clock_nanosleep, CLOCK_MONOTONIC, 0, (long)&ts, 0);
}

__attribute__((noinline)) void wait_for_pipe_message(struct thread_result *r)
{
	char c = 0;
	while (c != 'q' && TIMED_SYSCALL(r, SYS_read, r->fd, (long)&c, 1, 0) == 1)
		;
}

__attribute__((noinline)) void feed_pipe_periodically(struct thread_result *r)
{
	struct timespec ts = interval();
	for (int i = 0; i <= iterations; i++) {
		TIMED_SYSCALL(r, SYS_clock_nanosleep, CLOCK_MONOTONIC, 0, (long)&ts, 0);
		/* One byte never blocks; timed too, since waking the reader may preempt this thread. */
		TIMED_SYSCALL(r, SYS_write, r->fd, (long)(i < iterations ? "x" : "q"), 1, 0);
	}
}

static void *thread_main(void *arg)
{
	struct thread_result *r = arg;
	pthread_setname_np(pthread_self(), r->name);
	r->tid = syscall(SYS_gettid);
	r->oncpu_start_ns = clock_ns(CLOCK_THREAD_CPUTIME_ID);
	r->start_ns = clock_ns(CLOCK_MONOTONIC);
	if (!strcmp(r->function, "hold_in_nanosleep"))
		hold_in_nanosleep(r);
	else if (!strcmp(r->function, "wait_for_pipe_message"))
		wait_for_pipe_message(r);
	else
		feed_pipe_periodically(r);
	r->end_ns = clock_ns(CLOCK_MONOTONIC);
	r->oncpu_end_ns = clock_ns(CLOCK_THREAD_CPUTIME_ID);
	return NULL;
}

int main(int argc, char **argv)
{
	static const struct option options[] = {
		{ "threads", required_argument, NULL, 't' },
		{ "iterations", required_argument, NULL, 'n' },
		{ "interval-ms", required_argument, NULL, 'i' },
		{ "wait-go", no_argument, NULL, 'g' },
		{ 0 },
	};
	int wait_go = 0, opt;
	while ((opt = getopt_long(argc, argv, "", options, NULL)) != -1) {
		switch (opt) {
		case 't': per_path = atoi(optarg); break;
		case 'n': iterations = atoi(optarg); break;
		case 'i': interval_ms = atoi(optarg); break;
		case 'g': wait_go = 1; break;
		default: return 2; /* getopt printed why */
		}
	}
	if (optind != argc - 1 || strcmp(argv[optind], "paths")) {
		fprintf(stderr, "usage: %s paths [--threads N] [--iterations N] [--interval-ms MS] [--wait-go]\n",
			argv[0]);
		return 2;
	}
	if (per_path < 1 || per_path > MAX_PER_PATH) {
		fprintf(stderr, "--threads must be 1..%d\n", MAX_PER_PATH);
		return 2;
	}
	int n = 3 * per_path;
	for (int i = 0; i < per_path; i++) {
		int fds[2];
		if (pipe(fds) != 0)
			return 1;
		results[3 * i] = (struct thread_result){ .name = "sleeper", .function = "hold_in_nanosleep" };
		results[3 * i + 1] = (struct thread_result){ .name = "reader", .function = "wait_for_pipe_message",
							      .fd = fds[0] };
		results[3 * i + 2] = (struct thread_result){ .name = "feeder", .function = "feed_pipe_periodically",
							      .fd = fds[1] };
	}
	if (wait_go) {
		char line[16];
		printf("ready %d\n", getpid());
		fflush(stdout);
		if (!fgets(line, sizeof(line), stdin))
			return 1;
	}
	uint64_t t0 = clock_ns(CLOCK_MONOTONIC);
	pthread_t tids[3 * MAX_PER_PATH];
	for (int i = 0; i < n; i++)
		pthread_create(&tids[i], NULL, thread_main, &results[i]);
	for (int i = 0; i < n; i++)
		pthread_join(tids[i], NULL);
	uint64_t t1 = clock_ns(CLOCK_MONOTONIC);
	printf("{\"pid\": %d, \"mode\": \"paths\", \"iterations\": %d, \"interval_ms\": %d, \"wall_ns\": %llu, "
	       "\"threads\": [", getpid(), iterations, interval_ms, (unsigned long long)(t1 - t0));
	for (int i = 0; i < n; i++) {
		struct thread_result *r = &results[i];
		printf("%s{\"tid\": %ld, \"name\": \"%s\", \"function\": \"%s\", \"blocked_ns\": %llu, "
		       "\"blocked_off_ns\": %llu, \"calls\": %llu, \"wall_ns\": %llu, \"oncpu_ns\": %llu}",
		       i ? ", " : "", r->tid, r->name, r->function, (unsigned long long)r->blocked_ns,
		       (unsigned long long)r->blocked_off_ns, (unsigned long long)r->calls,
		       (unsigned long long)(r->end_ns - r->start_ns),
		       (unsigned long long)(r->oncpu_end_ns - r->oncpu_start_ns));
	}
	printf("]}\n");
	fflush(stdout);
	return 0;
}
