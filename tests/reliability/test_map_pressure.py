"""Map pressure: a workload with many more distinct stacks than --stack-storage-size holds and
more counter keys than --max-counters holds. The exporter keeps running, counts what it lost, and
what it stored plus what it counted as dropped is the workload's own off-CPU time."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from testkit.exporter import ExporterProcess
from testkit.metrics_page import label_sets, samples, total
from testkit.workloads import build

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(120)]

FUNCTIONS, ROUNDS = 400, 3


def _source() -> str:
    """A single thread calling FUNCTIONS distinct functions, each blocking 1 ms in clock_nanosleep
    through `nap`, so every function is its own user stack. It times the run (CLOCK_MONOTONIC) and
    reads its on-CPU time (schedstat) after "go": off-CPU = wall - on-CPU, the ground truth."""
    fns = "\n".join(f"__attribute__((noinline)) void fn_{i}(void) {{ nap(); }}" for i in range(FUNCTIONS))
    table = ", ".join(f"fn_{i}" for i in range(FUNCTIONS))
    return f"""
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
static uint64_t now_ns(void) {{ struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + t.tv_nsec; }}
static uint64_t oncpu_ns(void) {{ unsigned long long v = 0; FILE *f = fopen("/proc/self/schedstat", "r");
    if (f) {{ if (fscanf(f, "%llu", &v) != 1) v = 0; fclose(f); }} return v; }}
static uint64_t max_call_ns;
__attribute__((noinline)) void nap(void) {{
    struct timespec ts = {{ 0, 1000000L }}; long ret; register long r10 __asm__("r10") = 0;
    uint64_t t0 = now_ns();
    __asm__ volatile("syscall" : "=a"(ret) : "a"(SYS_clock_nanosleep), "D"(CLOCK_MONOTONIC), "S"(0),
                     "d"(&ts), "r"(r10) : "rcx", "r11", "memory");
    uint64_t d = now_ns() - t0; if (d > max_call_ns) max_call_ns = d; }}
{fns}
static void (*const fns[])(void) = {{ {table} }};
int main(void) {{
    char line[16];
    printf("ready %d\\n", getpid()); fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) return 1;
    uint64_t w0 = now_ns(), c0 = oncpu_ns();
    for (int r = 0; r < {ROUNDS}; r++) for (int i = 0; i < {FUNCTIONS}; i++) fns[i]();
    uint64_t c1 = oncpu_ns(), w1 = now_ns();
    printf("{{\\"wall_ns\\": %llu, \\"oncpu_ns\\": %llu, \\"max_call_ns\\": %llu}}\\n",
           (unsigned long long)(w1 - w0), (unsigned long long)(c1 - c0), (unsigned long long)max_call_ns);
    return 0; }}
"""


def test_full_stack_and_counter_maps_are_counted_and_the_rest_stays_right(tmp_path: Path) -> None:
    source = tmp_path / "many_stacks.c"
    source.write_text(_source())
    binary = build(source, name="many_stacks")
    proc = subprocess.Popen([str(binary)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().startswith("ready")
        with ExporterProcess(["--pid", str(proc.pid), "--stack-storage-size", "128", "--max-counters", "64",
                              "--flush-interval", "0.2", "--prometheus.top-stacks", "1000",
                              "--prometheus.stack-label"]) as exp:
            time.sleep(0.5)
            proc.stdin.write("go\n")
            proc.stdin.flush()
            known = json.loads(proc.stdout.readline())
            proc.wait(10)
            time.sleep(1.0)  # flushes after the exit
            text = exp.get("/metrics").decode()
            assert exp.proc is not None and exp.proc.poll() is None
            log = exp.log()
    finally:
        proc.kill()
    assert "Traceback" not in log, log
    pid = str(proc.pid)
    # Less the wait for "go": it began before the process was watched (seeded when it was, with the
    # stack /proc shows: fgets() blocked in read(), the workload's only read), and the workload's
    # own figures start at "go".
    before_go_functions = {"read", "[off CPU since before it was watched]"}
    before_go = sum(total(text, "offcpu_stack_seconds_total", **labels)
                    for labels in label_sets(text, "offcpu_stack_seconds_total")
                    if labels.get("pid") == pid and labels.get("user_function") in before_go_functions)
    stored = total(text, "offcpu_seconds_total", pid=pid) - before_go
    dropped = total(text, "offcpu_exporter_dropped_seconds_total")
    dropped_keys = total(text, "offcpu_exporter_map_dropped_total", map="counts")
    lost = sum(samples(text, "offcpu_exporter_lost_stacks_total"))
    off_cpu = (known["wall_ns"] - known["oncpu_ns"]) / 1e9
    print(f"map pressure: stored {stored:.4f} s + dropped {dropped:.4f} s ({dropped_keys:.0f} switches) = "
          f"{stored + dropped:.4f} s; known off-CPU {off_cpu:.4f} s; lost stacks {lost:.0f}")
    assert lost > 0, "the stack map never overflowed: the test did not test"
    assert dropped_keys > 0 and dropped > 0, "the counter map never overflowed: the test did not test"
    assert stored + dropped == pytest.approx(off_cpu, rel=0.05)
    # The histogram counts the blocks that were stored, as the switch counters do (not the dropped ones).
    # It is per container: the one of host processes holds only the one watched process.
    assert total(text, "offcpu_block_duration_seconds_count") == total(text, "offcpu_switches_total", pid=pid)
    # What was stored under a function's own stack is no more than that function's blocking.
    per_function: dict[str, float] = {}
    for labels in label_sets(text, "offcpu_stack_seconds_total"):
        if labels.get("pid") != pid:
            continue
        found = re.findall(r"\bfn_(\d+)\b", labels.get("stack", ""))
        if len(found) == 1:
            value = total(text, "offcpu_stack_seconds_total", **labels)
            per_function[found[0]] = per_function.get(found[0], 0.0) + value
    assert per_function, "no stack was stored with its function"
    limit = ROUNDS * known["max_call_ns"] / 1e9
    assert max(per_function.values()) <= limit * 1.01, (max(per_function.values()), limit)
