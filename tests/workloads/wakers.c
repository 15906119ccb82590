// SPDX-License-Identifier: GPL-2.0
/* A waiting thread whose wake-ups come from a known place, for the tests of --wakers.
 *
 *   wakers MODE [--iterations N] [--interval-ms MS] [--wait-go]
 *
 * MODE:
 *   condvar  the waiter waits on a condition variable that a "producer" thread signals from
 *            producer_signal() every MS ms (the waiter's re-take of the mutex is woken by the
 *            unlock in that same function)
 *   mutex    the waiter blocks on a mutex a "holder" thread holds for MS ms in holder_hold() and
 *            releases there (told that it holds it by a byte the holder writes to a pipe from
 *            holder_hold() too: the waiter's few ms between two holds)
 *   pipe     the waiter reads a pipe a "writer" thread writes one byte to from writer_write()
 *            every MS ms
 *   timer    the waiter sleeps MS ms (clock_nanosleep): a timer wakes it, no thread
 *
 * With --wait-go it prints "ready" and waits for a line on stdin before it starts. At the end it
 * prints one JSON line in testkit/workloads.py's WorkloadResult form: the waiter is threads[0]
 * (function "waiter"), the thread that wakes it threads[1] when there is one.
 * Built with frame pointers (testkit/workloads.py): the waker's user stack is walked by them.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static const char *mode;
static int iterations = 50;
static int interval_ms = 20;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static int ready, done;
static int pipe_fds[2];
static pid_t waiter_tid, helper_tid;

static unsigned long long now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000ULL + ts.tv_nsec;
}

static void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
	while (clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, &ts) != 0)
		;
}

/* libc's calls that wake the waiter, each behind a function of our own: glibc is built without
 * frame pointers, and a frame-pointer walk from inside it (the unwinder's way until the DWARF
 * tables of the process are loaded) skips the frame that called into it. Behind these, that
 * skipped frame is the wrapper and the functions below stay in the stack. */
__attribute__((noinline)) void cond_signal(void)
{
	pthread_cond_signal(&cond);
}

__attribute__((noinline)) void mutex_unlock(void)
{
	pthread_mutex_unlock(&lock);
}

__attribute__((noinline)) void write_byte(void)
{
	char byte = 1;
	if (write(pipe_fds[1], &byte, 1) != 1)
		abort();
}

/* The functions the tests look for in the waker's stack: not inlined, not merged. */
__attribute__((noinline)) void producer_signal(void)
{
	pthread_mutex_lock(&lock);
	ready = 1;
	cond_signal();
	mutex_unlock();
}

__attribute__((noinline)) void holder_hold(void)
{
	pthread_mutex_lock(&lock);
	write_byte();
	sleep_ms(interval_ms);
	mutex_unlock();
}

__attribute__((noinline)) void writer_write(void)
{
	write_byte();
}

static void *helper_main(void *arg)
{
	(void)arg;
	/* Named by itself before it wakes anyone: named by main() after pthread_create(), the holder
	 * (no sleep before its first release) once woke the waiter still under the process's name. */
	pthread_setname_np(pthread_self(), !strcmp(mode, "condvar") ? "producer" :
					   !strcmp(mode, "mutex") ? "holder" : "writer");
	helper_tid = syscall(SYS_gettid);
	for (int i = 0; i < iterations; i++) {
		if (!strcmp(mode, "condvar")) {
			sleep_ms(interval_ms);
			producer_signal();
		} else if (!strcmp(mode, "mutex")) {
			holder_hold();
			sleep_ms(2); /* the waiter takes and drops the mutex meanwhile */
		} else {
			sleep_ms(interval_ms);
			writer_write();
		}
	}
	__atomic_store_n(&done, 1, __ATOMIC_SEQ_CST);
	if (!strcmp(mode, "condvar"))
		producer_signal();
	return NULL;
}

__attribute__((noinline)) void waiter_wait(void)
{
	if (!strcmp(mode, "timer")) {
		for (int i = 0; i < iterations; i++)
			sleep_ms(interval_ms);
	} else if (!strcmp(mode, "condvar")) {
		pthread_mutex_lock(&lock);
		while (!__atomic_load_n(&done, __ATOMIC_SEQ_CST)) {
			while (!ready && !__atomic_load_n(&done, __ATOMIC_SEQ_CST))
				pthread_cond_wait(&cond, &lock);
			ready = 0;
		}
		pthread_mutex_unlock(&lock);
	} else if (!strcmp(mode, "mutex")) {
		char byte;
		for (int i = 0; i < iterations; i++) {
			/* Wait until the holder holds the mutex again, then block on it. */
			if (read(pipe_fds[0], &byte, 1) != 1)
				abort();
			pthread_mutex_lock(&lock);
			pthread_mutex_unlock(&lock);
		}
	} else {
		char byte;
		for (int i = 0; i < iterations; i++)
			if (read(pipe_fds[0], &byte, 1) != 1)
				abort();
	}
}

static void *waiter_main(void *arg)
{
	(void)arg;
	pthread_setname_np(pthread_self(), "waiter");
	waiter_tid = syscall(SYS_gettid);
	waiter_wait();
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s condvar|mutex|pipe|timer [--iterations N] [--interval-ms MS] [--wait-go]\n",
			argv[0]);
		return 2;
	}
	mode = argv[1];
	int wait_go = 0;
	for (int i = 2; i < argc; i++) {
		if (!strcmp(argv[i], "--iterations") && i + 1 < argc)
			iterations = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--interval-ms") && i + 1 < argc)
			interval_ms = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--wait-go"))
			wait_go = 1;
		else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
			i++; /* testkit's Workload passes it: always one waiter here */
	}
	if ((!strcmp(mode, "pipe") || !strcmp(mode, "mutex")) && pipe(pipe_fds) != 0)
		return 1;
	if (wait_go) {
		char line[16];
		printf("ready %d\n", getpid());
		fflush(stdout);
		if (!fgets(line, sizeof(line), stdin))
			return 1;
	}
	unsigned long long start = now_ns();
	pthread_t waiter, helper;
	int helped = strcmp(mode, "timer") != 0;
	pthread_create(&waiter, NULL, waiter_main, NULL);
	if (helped)
		pthread_create(&helper, NULL, helper_main, NULL);
	pthread_join(waiter, NULL);
	if (helped)
		pthread_join(helper, NULL);
	unsigned long long wall = now_ns() - start;
	printf("{\"pid\": %d, \"mode\": \"%s\", \"iterations\": %d, \"interval_ms\": %d, \"wall_ns\": %llu, "
	       "\"threads\": [{\"tid\": %d, \"function\": \"waiter\", \"blocked_ns\": 0, \"calls\": %d, "
	       "\"blocked_off_ns\": 0, \"wall_ns\": %llu, \"oncpu_ns\": 0}",
	       getpid(), mode, iterations, interval_ms, wall, waiter_tid, iterations, wall);
	if (helped)
		printf(", {\"tid\": %d, \"function\": \"%s\", \"blocked_ns\": 0, \"calls\": %d, \"blocked_off_ns\": 0, "
		       "\"wall_ns\": %llu, \"oncpu_ns\": 0}",
		       helper_tid, !strcmp(mode, "condvar") ? "producer_signal" :
				   !strcmp(mode, "mutex") ? "holder_hold" : "writer_write", iterations, wall);
	printf("]}\n");
	return 0;
}
