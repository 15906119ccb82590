/* Context-switch ping-pong for bench/sched_overhead.py: two threads of one process pass a byte
 * back and forth over two pipes, so that every round trip is two voluntary context switches
 * (when both threads share one CPU: run it under `taskset -c CPU`).
 *
 * The blocking read is made with an inline `syscall` instruction from a function called at
 * recursion depth --depth (compiled with -fno-omit-frame-pointer), so that the user stack a
 * profiler walks has --depth + a few frames, as in a real program, instead of stopping in libc.
 *
 * Usage: pingpong [--round-trips N] [--depth D] [--wait-go]
 * With --wait-go it prints "ready <pid>" and waits for a line on stdin before the timed part.
 * At the end it prints one JSON line: round trips, elapsed ns of the timed part, the CPU time of
 * the process in it (CLOCK_PROCESS_CPUTIME_ID: all threads; a probe's work inside the switch is
 * charged to the workload's threads, time other jobs run on the CPU is not), and the context
 * switches of the process during it (getrusage: voluntary + involuntary, all threads).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static long round_trips = 200000;
static int depth = 16;
static int ping[2], pong[2];

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static long raw_syscall3(long nr, long a, long b, long c)
{
	long ret;
	__asm__ volatile("syscall" : "=a"(ret) : "a"(nr), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
	return ret;
}

__attribute__((noinline)) static void pingpong_block_read(int fd)
{
	char c;
	if (raw_syscall3(SYS_read, fd, (long)&c, 1) != 1)
		abort();
}

__attribute__((noinline)) static void pingpong_write(int fd)
{
	char c = 'x';
	if (raw_syscall3(SYS_write, fd, (long)&c, 1) != 1)
		abort();
}

/* Recurse to the wanted depth, then run the loop there: every block has the same deep stack. */
__attribute__((noinline)) static void pingpong_nest(int level, void (*loop)(void))
{
	if (level > 0)
		pingpong_nest(level - 1, loop);
	else
		loop();
	__asm__ volatile("" ::: "memory"); /* not a tail call: keep the frame */
}

static void echo_loop(void)
{
	for (long i = 0; i < round_trips; i++) {
		pingpong_block_read(ping[0]);
		pingpong_write(pong[1]);
	}
}

static void serve_loop(void)
{
	for (long i = 0; i < round_trips; i++) {
		pingpong_write(ping[1]);
		pingpong_block_read(pong[0]);
	}
}

static void *echo_thread(void *arg)
{
	(void)arg;
	pingpong_nest(depth, echo_loop);
	return NULL;
}

static uint64_t process_cpu_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static long switches(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_nvcsw + ru.ru_nivcsw;
}

int main(int argc, char **argv)
{
	int wait_go = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--round-trips") && i + 1 < argc)
			round_trips = atol(argv[++i]);
		else if (!strcmp(argv[i], "--depth") && i + 1 < argc)
			depth = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--wait-go"))
			wait_go = 1;
		else {
			fprintf(stderr, "usage: %s [--round-trips N] [--depth D] [--wait-go]\n", argv[0]);
			return 2;
		}
	}
	if (pipe(ping) || pipe(pong)) {
		perror("pipe");
		return 1;
	}
	if (wait_go) {
		char line[16];
		printf("ready %d\n", getpid());
		fflush(stdout);
		if (!fgets(line, sizeof(line), stdin))
			return 1;
	}
	pthread_t t;
	long s0 = switches();
	uint64_t t0 = now_ns(), c0 = process_cpu_ns();
	pthread_create(&t, NULL, echo_thread, NULL);
	pingpong_nest(depth, serve_loop);
	pthread_join(t, NULL);
	uint64_t t1 = now_ns(), c1 = process_cpu_ns();
	long s1 = switches();
	printf("{\"round_trips\": %ld, \"depth\": %d, \"elapsed_ns\": %llu, \"cpu_ns\": %llu, \"switches\": %ld}\n",
	       round_trips, depth, (unsigned long long)(t1 - t0), (unsigned long long)(c1 - c0), s1 - s0);
	return 0;
}
