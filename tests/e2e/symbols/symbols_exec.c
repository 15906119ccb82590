/* A program that exec's another build of itself: built twice without PIE, with WAIT_NAME set to
 * two different names, its wait function sits at the same address in both programs, so a
 * symbolizer that kept the first program's maps would keep naming it after the exec. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

void __attribute__((noinline)) WAIT_NAME(void) { usleep(1000); }

int main(void) {
	char line[4096];
	setvbuf(stdout, NULL, _IONBF, 0);
	printf("wait_function %p\n", (void *)WAIT_NAME);
	printf("ready\n");
	while (fgets(line, sizeof line, stdin)) {
		line[strcspn(line, "\n")] = 0;
		if (strncmp(line, "exec ", 5) == 0) {
			char *argv[] = {line + 5, NULL};
			execv(line + 5, argv);
			perror("execv");
			return 1;
		}
		WAIT_NAME();
	}
	return 0;
}
