/* A process whose code addresses the symbolizer tests name. It prints "NAME ADDRESS" lines,
 * then "ready", then obeys commands on stdin:
 *   dlopen PATH   load PATH and print the address of its symbols_plugin_func
 *   plugin MS     block for MS milliseconds in the loaded library's symbols_plugin_sleep
 *   jit MS        block for MS milliseconds inside the run-time generated code
 *   sleep MS      block for MS milliseconds in symbols_blocking_sleep (an inline syscall)
 * Built with -O0 -fno-omit-frame-pointer so user stacks walk through these functions. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

__attribute__((noinline)) int symbols_alpha(int x) { return x * 3 + 1; }
static __attribute__((noinline)) int symbols_static_beta(int x) { return x ^ 0x55; }

/* A function of known size followed by 64 bytes that belong to no symbol. */
__asm__(".text\n"
        ".globl symbols_sized\n .type symbols_sized, @function\n"
        "symbols_sized:\n ret\n .size symbols_sized, 1\n"
        " .skip 64, 0xcc\n"
        ".globl symbols_after_gap\n .type symbols_after_gap, @function\n"
        "symbols_after_gap:\n ret\n .size symbols_after_gap, 1\n");
void symbols_sized(void);
void symbols_after_gap(void);

__attribute__((noinline)) void symbols_blocking_sleep(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    long ret;
    __asm__ volatile("syscall" : "=a"(ret) : "a"(35), "D"(&ts), "S"(0) : "rcx", "r11", "memory");
}

/* push rbp; mov rbp,rsp; mov eax,35 (nanosleep); xor esi,esi; syscall; pop rbp; ret
 * rdi (the first argument) is the struct timespec pointer. */
static const unsigned char jit_code[] = {0x55, 0x48, 0x89, 0xe5, 0xb8, 0x23, 0x00, 0x00,
                                         0x00, 0x31, 0xf6, 0x0f, 0x05, 0x5d, 0xc3};

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("symbols_alpha %p\n", (void *)&symbols_alpha);
    printf("symbols_static_beta %p\n", (void *)&symbols_static_beta);
    printf("main %p\n", (void *)&main);
    printf("gap %p\n", (void *)((char *)&symbols_sized + 16));
    printf("symbols_after_gap %p\n", (void *)&symbols_after_gap);
    printf("symbols_blocking_sleep %p\n", (void *)&symbols_blocking_sleep);
    void *vdso = dlopen("linux-vdso.so.1", RTLD_NOW | RTLD_NOLOAD);
    void *vdso_gettime = vdso ? dlsym(vdso, "__vdso_clock_gettime") : NULL;
    printf("vdso_clock_gettime %p\n", vdso_gettime);

    unsigned char *code = mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
                               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (code == MAP_FAILED) return 1;
    memcpy(code, jit_code, sizeof jit_code);
    char path[64];
    snprintf(path, sizeof path, "/tmp/perf-%d.map", (int)getpid());
    FILE *map = fopen(path, "w");
    if (!map) return 1;
    fprintf(map, "%lx %zx jit_nanosleep_stub\n", (unsigned long)code, sizeof jit_code);
    fclose(map);
    printf("jit_nanosleep_stub %p\n", (void *)code);
    printf("ready\n");

    void (*plugin_sleep)(long) = NULL;
    char line[4096];
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = 0;
        if (strncmp(line, "dlopen ", 7) == 0) {
            void *h = dlopen(line + 7, RTLD_NOW);
            void *f = h ? dlsym(h, "symbols_plugin_func") : NULL;
            plugin_sleep = h ? (void (*)(long))dlsym(h, "symbols_plugin_sleep") : NULL;
            printf("symbols_plugin_func %p\n", f);
        } else if (strncmp(line, "plugin ", 7) == 0 && plugin_sleep) {
            plugin_sleep(atol(line + 7));
            printf("done\n");
        } else if (strncmp(line, "jit ", 4) == 0) {
            long ms = atol(line + 4);
            struct timespec ts = {0, 1000000L};
            for (long i = 0; i < ms; i++) ((void (*)(struct timespec *))code)(&ts);
            printf("done\n");
        } else if (strncmp(line, "sleep ", 6) == 0) {
            symbols_blocking_sleep(atol(line + 6));
            printf("done\n");
        }
    }
    return 0;
}
