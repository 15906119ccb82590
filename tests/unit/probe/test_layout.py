"""bpf/offcpu.h and probe/layout.py (in offcpu_exporter/) describe the same structs: checked with the C compiler."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

from offcpu_exporter.probe import layout

PROGRAM = """
#include <stdio.h>
#include <stddef.h>
#include <linux/types.h>
#include "offcpu.h"
#define S(t) printf("%s size %zu\\n", #t, sizeof(struct t));
#define F(t, f) printf("%s.%s %zu\\n", #t, #f, offsetof(struct t, f));
int main(void) {
  S(offcpu_key) F(offcpu_key, tgid) F(offcpu_key, tid) F(offcpu_key, reason) F(offcpu_key, user_stack)
  F(offcpu_key, kernel_stack)
  S(offcpu_value) F(offcpu_value, count) F(offcpu_value, ns) F(offcpu_value, wcount) F(offcpu_value, wns)
  S(offcpu_start) F(offcpu_start, ts_ns) F(offcpu_start, user_stack) F(offcpu_start, kernel_stack)
  F(offcpu_start, tgid) F(offcpu_start, reason) F(offcpu_start, weight) F(offcpu_start, flags)
  S(offcpu_mark) F(offcpu_mark, start_ns) F(offcpu_mark, until_ns)
  S(offcpu_run) F(offcpu_run, tid) F(offcpu_run, ts_ns) F(offcpu_run, runtime_ns) F(offcpu_run, switches)
  S(offcpu_cpu_runs) F(offcpu_cpu_runs, latest) F(offcpu_cpu_runs, earlier)
  S(offcpu_control) F(offcpu_control, cutoff_ns) F(offcpu_control, marks_active)
  S(offcpu_stack) F(offcpu_stack, ips)
  S(offcpu_sampler) F(offcpu_sampler, window_start_ns) F(offcpu_sampler, switches) F(offcpu_sampler, shift)
  S(offcpu_cpu_sampler) F(offcpu_cpu_sampler, window_start_ns) F(offcpu_cpu_sampler, captures)
  F(offcpu_cpu_sampler, shift)
  S(offcpu_hist) F(offcpu_hist, slots)
  S(offcpu_child) F(offcpu_child, fork_boot_ns) F(offcpu_child, parent_tgid) F(offcpu_child, comm)
  printf("const STAT_MAX %d\\n", OFFCPU_STAT_MAX);
  printf("const HIST_SLOTS %d\\n", OFFCPU_HIST_SLOTS);
  printf("const HIST_ROOM %d\\n", OFFCPU_HIST_ROOM);
  printf("const MAX_DEPTH %d\\n", OFFCPU_MAX_DEPTH);
  printf("const STACK_NOT_CAPTURED %d\\n", OFFCPU_STACK_NOT_CAPTURED);
  printf("const STACK_EMPTY %d\\n", OFFCPU_STACK_EMPTY);
  printf("const STACK_SEEDED %d\\n", OFFCPU_STACK_SEEDED);
  printf("const STACK_STOLEN %d\\n", OFFCPU_STACK_STOLEN);
  printf("const START_SEEDED %d\\n", OFFCPU_START_SEEDED);
  printf("const STACK_ERRNO_BASE %d\\n", OFFCPU_STACK_ERRNO_BASE);
  printf("const STACK_RESERVED %d\\n", OFFCPU_STACK_RESERVED);
  printf("const STAT_COUNTS_DROPPED %d\\n", OFFCPU_STAT_COUNTS_DROPPED);
  printf("const STAT_COUNTS_DROPPED_NS %d\\n", OFFCPU_STAT_COUNTS_DROPPED_NS);
  printf("const STAT_START_DROPPED %d\\n", OFFCPU_STAT_START_DROPPED);
  printf("const STAT_HIST_DROPPED %d\\n", OFFCPU_STAT_HIST_DROPPED);
  printf("const STAT_FILTERED %d\\n", OFFCPU_STAT_FILTERED);
  printf("const STAT_FILTERED_NS %d\\n", OFFCPU_STAT_FILTERED_NS);
  printf("const STAT_STACKS_DROPPED %d\\n", OFFCPU_STAT_STACKS_DROPPED);
  printf("const STAT_STACK_KEYS_FOLDED %d\\n", OFFCPU_STAT_STACK_KEYS_FOLDED);
  printf("const STAT_BLOCKS %d\\n", OFFCPU_STAT_BLOCKS);
  printf("const STAT_CAPTURES %d\\n", OFFCPU_STAT_CAPTURES);
  printf("const STAT_MISSED_SWITCH_INS %d\\n", OFFCPU_STAT_MISSED_SWITCH_INS);
  printf("const STAT_PROC_EVENTS_DROPPED %d\\n", OFFCPU_STAT_PROC_EVENTS_DROPPED);
  printf("const PROC_FORK %d\\n", OFFCPU_PROC_FORK);
  printf("const PROC_EXEC %d\\n", OFFCPU_PROC_EXEC);
  printf("const PROC_EXIT %d\\n", OFFCPU_PROC_EXIT);
  printf("const PROC_RENAME %d\\n", OFFCPU_PROC_RENAME);
  printf("const TARGET_WATCH %d\\n", OFFCPU_TARGET_WATCH);
  printf("const TARGET_EXCLUDE %d\\n", OFFCPU_TARGET_EXCLUDE);
  printf("reason RUNNABLE %d\\nreason SLEEPING %d\\nreason UNINTERRUPTIBLE %d\\nreason OTHER %d\\n",
         OFFCPU_REASON_RUNNABLE, OFFCPU_REASON_SLEEPING, OFFCPU_REASON_UNINTERRUPTIBLE, OFFCPU_REASON_OTHER);
  printf("reason STOLEN %d\\n", OFFCPU_REASON_STOLEN);
  return 0;
}
"""


def _c_layout(tmp_path: Path) -> list[list[str]]:
    src = tmp_path / "layout.c"
    src.write_text(PROGRAM)
    exe = tmp_path / "layout"
    subprocess.run(["gcc", f"-I{layout.BPF_DIR}", "-o", str(exe), str(src)], check=True)
    return [line.split() for line in subprocess.run([str(exe)], check=True, capture_output=True,
                                                    text=True).stdout.splitlines()]


def test_header_and_python_layouts_agree(tmp_path: Path) -> None:
    from offcpu_exporter.snapshot import Reason

    structs = layout.STRUCTS
    checked = 0
    for words in _c_layout(tmp_path):
        if words[0] == "const":
            assert getattr(layout, words[1]) == int(words[2]), words
        elif words[0] == "reason":
            assert Reason[words[1]].value == int(words[2]), words
        elif words[1] == "size":
            assert ctypes.sizeof(structs[words[0]]) == int(words[2]), words
        else:
            struct, field = words[0].split(".")
            assert getattr(structs[struct], field).offset == int(words[1]), words
        checked += 1
    assert checked >= 60


def test_bpf_source_declares_the_maps_python_reads() -> None:
    source = (layout.BPF_DIR / layout.SOURCE).read_text()
    for name in (layout.MAP_TARGETS, layout.MAP_CHILDREN, layout.MAP_START, layout.MAP_MARKS, layout.MAP_COUNTS,
                 layout.MAP_HIST, layout.MAP_STACKS, layout.MAP_CONTROL, layout.MAP_STATS):
        assert f"({name}," in source, name
    assert f", {layout.MAP_SAMPLER}," in source
