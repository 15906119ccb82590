/* A shared library the target loads with dlopen after the symbolizer (or the exporter) started. */
#include <time.h>

__attribute__((noinline)) int symbols_plugin_func(int x) { return x + 7; }

/* Blocks in nanosleep from this very function (inline syscall: glibc has no frame pointers). */
__attribute__((noinline)) void symbols_plugin_sleep(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    long ret;
    __asm__ volatile("syscall" : "=a"(ret) : "a"(35), "D"(&ts), "S"(0) : "rcx", "r11", "memory");
}
