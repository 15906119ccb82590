/* Many tiny processes for bench/scale.py: each blocks once per period in clock_nanosleep and does
 * nothing else, so that the number of processes on the node can grow while the total switch rate
 * stays the same (COUNT processes at period P make COUNT / P blocks per second).
 *
 * Usage: sleeper PERIOD_NS COUNT
 * The process forks COUNT - 1 copies of itself (one fork() each is far faster than starting
 * thousands of programs from Python) and stays in their process group, so that one killpg() ends
 * them all. Once every copy is forked and asleep it prints one line, "ready PID PID ...", with
 * the pids of all COUNT processes, and closes its stdout.
 *
 * Forks go in batches, each waiting until its copies have reached their first sleep: forked
 * faster than they get a CPU, thousands of new processes would wait runnable at once, and the
 * load average (which bench/scale.py reads to tell whether other jobs shared the machine) would
 * jump for minutes after.
 *
 * On SIGTERM the first process ends its copies BATCH at a time, reaping each batch before the
 * next, then exits. Signalled all at once (killpg), thousands of processes would be runnable at
 * the same moment on their way out, which the load average would show for minutes; and orphans
 * would be left to init, which here reaps them only every few seconds, holding pids and showing
 * in /proc meanwhile. The pids of children not yet reaped cannot have been reused.
 *
 * Each process first sleeps a random phase in [0, PERIOD_NS), so that the wake-ups of the whole
 * group spread evenly over the period instead of coming in one burst. Deadlines are absolute: a
 * late wake-up does not shift the next one, and wake-ups missed on a busy machine are skipped
 * rather than run back to back (a deadline already past would return without blocking).
 *
 * Built statically and without threads to keep each copy small: the copies share the parent's
 * pages until they write to them, which leaves the kernel's own structures as most of the cost.
 * If the parent (bench/scale.py) dies, PR_SET_PDEATHSIG takes the group down with it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BATCH 64

static volatile sig_atomic_t stopping;

static void on_term(int sig)
{
	(void)sig;
	stopping = 1;
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* splitmix64: a good spread from consecutive seeds (the pids of the copies are consecutive). */
static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static void die_with(pid_t parent)
{
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	/* The parent may have died before the call above: then nothing would ever signal us. */
	if (getppid() != parent)
		_exit(1);
}

/* Returns on SIGTERM, which only the first process handles: the copies die of it. */
static void sleep_periodically(uint64_t period)
{
	uint64_t next = now_ns() + mix((uint64_t)getpid() ^ now_ns()) % period;
	while (!stopping) {
		struct timespec ts = {.tv_sec = (time_t)(next / 1000000000ull), .tv_nsec = (long)(next % 1000000000ull)};
		if (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
			continue;
		next += period;
		uint64_t now = now_ns();
		if (next <= now)
			next += ((now - next) / period + 1) * period;
	}
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: %s PERIOD_NS COUNT\n", argv[0]);
		return 2;
	}
	uint64_t period = strtoull(argv[1], NULL, 10);
	long count = strtol(argv[2], NULL, 10);
	if (period == 0 || count < 1) {
		fprintf(stderr, "PERIOD_NS and COUNT must be positive\n");
		return 2;
	}
	die_with(getppid());
	pid_t *pids = calloc((size_t)count, sizeof(pid_t));
	int started[2];
	if (pids == NULL || pipe(started) != 0)
		return 1;
	pid_t self = getpid();
	pids[0] = self;
	long waiting = 0;
	for (long i = 1; i < count; i++) {
		pid_t pid = fork();
		if (pid < 0) {
			perror("fork");
			/* Our copies die with us (PR_SET_PDEATHSIG). */
			return 1;
		}
		if (pid == 0) {
			die_with(self);
			/* Written just before the first sleep: the copy no longer needs a CPU. */
			char c = 1;
			if (write(started[1], &c, 1) != 1)
				_exit(1);
			close(started[0]);
			close(started[1]);
			sleep_periodically(period);
			_exit(0);
		}
		pids[i] = pid;
		if (++waiting == BATCH || i == count - 1) {
			char buf[BATCH];
			while (waiting > 0) {
				ssize_t n = read(started[0], buf, (size_t)waiting);
				if (n <= 0) {
					perror("read");
					return 1;
				}
				waiting -= n;
			}
		}
	}
	close(started[0]);
	close(started[1]);
	struct sigaction sa = {.sa_handler = on_term};
	sigaction(SIGTERM, &sa, NULL);
	fputs("ready", stdout);
	for (long i = 0; i < count; i++)
		printf(" %d", (int)pids[i]);
	putchar('\n');
	fclose(stdout);
	sleep_periodically(period);
	for (long first = 1; first < count; first += BATCH) {
		long end = first + BATCH < count ? first + BATCH : count;
		for (long i = first; i < end; i++)
			kill(pids[i], SIGTERM);
		for (long i = first; i < end; i++)
			while (waitpid(pids[i], NULL, 0) < 0 && errno == EINTR)
				;
	}
	free(pids);
	return 0;
}
