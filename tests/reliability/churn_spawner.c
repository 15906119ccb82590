/* Process churn: forks RATE short-lived children per second for SECONDS seconds. Each child names
 * itself "churn_child", sleeps 1-40 ms and exits; the parent reaps them. Prints how many it started. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	int rate = argc > 1 ? atoi(argv[1]) : 200;
	double seconds = argc > 2 ? atof(argv[2]) : 30;
	double start = now(), next = start;
	long started = 0;
	while (now() - start < seconds) {
		pid_t pid = fork();
		if (pid == 0) {
			prctl(PR_SET_NAME, "churn_child", 0, 0, 0);
			usleep(1000 + (unsigned)(started * 7919 % 40) * 1000);
			_exit(0);
		}
		if (pid > 0)
			started++;
		while (waitpid(-1, NULL, WNOHANG) > 0)
			;
		next += 1.0 / rate;
		double wait = next - now();
		if (wait > 0)
			usleep((useconds_t)(wait * 1e6));
	}
	while (wait(NULL) > 0)
		;
	printf("%ld\n", started);
	return 0;
}
