/* A workload for the unwinder tests, built with -O2 -fomit-frame-pointer (and -g for gdb): threads
 * that block again and again several named, non-inlined levels deep, through glibc (which has no
 * frame pointers either), each level with a different kind of frame:
 *   main     nanosleep   main -> run_sleeper -> frame_plain -> frame_vla (rbp-based: alloca)
 *                                -> frame_big (a 64 KiB frame) -> block_nanosleep -> nanosleep
 *   poller   poll()      start_thread -> poller_main -> frame_plain -> ... -> block_poll -> poll
 *   waiter   futex       start_thread -> waiter_main -> ... -> block_condwait -> pthread_cond_timedwait
 *   signal   in a signal handler: start_thread -> signal_main -> raise -> <signal frame>
 *                        -> on_signal -> frame_plain -> ... -> block_nanosleep
 * Each blocking call lasts INTERVAL_MS. Prints "ready" once every thread runs; runs until killed.
 */
#define _GNU_SOURCE
#include <alloca.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))
/* Work after each call keeps it from becoming a tail call (a jump leaves no frame to unwind). */
#define KEEP() asm volatile("" ::: "memory")
#define INTERVAL_MS 20

static volatile int sink;
static int pipe_fds[2];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;

enum block { BLOCK_NANOSLEEP, BLOCK_POLL, BLOCK_CONDWAIT };

NOINLINE void block_nanosleep(void)
{
	struct timespec ts = {0, INTERVAL_MS * 1000000L};
	nanosleep(&ts, NULL);
	KEEP();
}

NOINLINE void block_poll(void)
{
	struct pollfd p = {pipe_fds[0], POLLIN, 0};
	poll(&p, 1, INTERVAL_MS);
	KEEP();
}

NOINLINE void block_condwait(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_nsec += INTERVAL_MS * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec += 1;
		ts.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&lock);
	pthread_cond_timedwait(&cond, &lock, &ts);
	pthread_mutex_unlock(&lock);
	KEEP();
}

NOINLINE void frame_big(enum block how)
{
	volatile char big[65536]; /* CFA = rsp + 64 KiB and more */
	big[how] = 1;
	if (how == BLOCK_POLL)
		block_poll();
	else if (how == BLOCK_CONDWAIT)
		block_condwait();
	else
		block_nanosleep();
	sink = big[how];
}

NOINLINE void frame_vla(enum block how, int n)
{
	char *p = alloca(n); /* a variable-sized frame: the CFA is defined from rbp */
	memset(p, how, n);
	frame_big(how);
	sink = p[n / 2];
}

NOINLINE void frame_plain(enum block how)
{
	frame_vla(how, 64 + (int)how);
	KEEP();
}

NOINLINE void run_sleeper(void)
{
	for (;;) {
		frame_plain(BLOCK_NANOSLEEP);
		KEEP();
	}
}

NOINLINE void *poller_main(void *arg)
{
	(void)arg;
	for (;;) {
		frame_plain(BLOCK_POLL);
		KEEP();
	}
	return NULL;
}

NOINLINE void *waiter_main(void *arg)
{
	(void)arg;
	for (;;) {
		frame_plain(BLOCK_CONDWAIT);
		KEEP();
	}
	return NULL;
}

NOINLINE void on_signal(int sig)
{
	(void)sig;
	frame_plain(BLOCK_NANOSLEEP);
	KEEP();
}

NOINLINE void *signal_main(void *arg)
{
	(void)arg;
	for (;;) {
		raise(SIGUSR1);
		KEEP();
	}
	return NULL;
}

int main(void)
{
	if (pipe(pipe_fds) != 0)
		return 1;
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigaction(SIGUSR1, &sa, NULL);
	pthread_t t;
	pthread_create(&t, NULL, poller_main, NULL);
	pthread_setname_np(t, "poller");
	pthread_create(&t, NULL, waiter_main, NULL);
	pthread_setname_np(t, "waiter");
	pthread_create(&t, NULL, signal_main, NULL);
	pthread_setname_np(t, "signal");
	printf("ready\n");
	fflush(stdout);
	run_sleeper();
	return 0;
}
