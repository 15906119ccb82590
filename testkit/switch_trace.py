"""The kernel's own record of a workload's context switches: the sched_switch trace event through
tracefs (ftrace's ring buffer, no BPF), a truth independent of the probe.

Where the kernel's per-thread CPU clock (sum_exec_runtime: schedstat, CLOCK_THREAD_CPUTIME_ID)
cannot serve as the truth, this can: on the kernel matrix's PREEMPT_RT guest the CPU clock charges a
run from before the thread's switch-in (docs/kernel-matrix.md), so on-CPU + off-CPU exceeds wall
time there whatever the probe does, while the time between the thread's own switch-out and
switch-in events is what the probe counts. One trace at a time on a machine: tracefs is global.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

TRACEFS = Path("/sys/kernel/tracing")
# "<idle>-0 [001] d..2. 55.900633: sched_switch: prev_comm=a prev_pid=1 prev_prio=120
#  prev_state=S ==> next_comm=b next_pid=2 next_prio=120" (timestamps in s.us with trace_clock mono)
_EVENT = re.compile(r"\s(\d+)\.(\d+): sched_switch: .*?prev_pid=(\d+) .*?prev_state=(\S+) ==> .*?next_pid=(\d+) ")


@dataclass(frozen=True)
class Switch:
    ts_ns: int  # CLOCK_MONOTONIC (trace_clock "mono"), microsecond resolution
    prev: int
    prev_state: str  # as the event prints it: S, D, R, R+, ...
    next: int


@dataclass
class SwitchTrace:
    """Records sched_switch events of the tasks named `comm` while entered; `switches` after."""

    comm: str
    buffer_kb: int = 16384  # per CPU: ~200,000 events, far more than a test's workload makes
    switches: list[Switch] = field(default_factory=list)
    lost: int = 0  # events the ring buffer overwrote (must be 0 for the record to be a truth)
    _saved: dict[str, str] = field(default_factory=dict)

    def __enter__(self) -> SwitchTrace:
        if not (TRACEFS / "trace").exists():
            subprocess.run(["mount", "-t", "tracefs", "nodev", str(TRACEFS)], check=True)
        self._saved = {name: self._read(name) for name in ("trace_clock", "buffer_size_kb")}
        self._write("tracing_on", "0")
        self._write("trace_clock", "mono")
        self._write("buffer_size_kb", str(self.buffer_kb))
        self._write("events/sched/sched_switch/filter", f'prev_comm == "{self.comm}" || next_comm == "{self.comm}"')
        self._write("trace", "")
        self._write("events/sched/sched_switch/enable", "1")
        self._write("tracing_on", "1")
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._write("tracing_on", "0")
        self._write("events/sched/sched_switch/enable", "0")
        text = (TRACEFS / "trace").read_text()
        self._write("events/sched/sched_switch/filter", "0")
        self._write("trace", "")
        # trace_clock reads "[local] global mono ...": the bracketed one is in use.
        clock = re.search(r"\[(\w+)\]", self._saved["trace_clock"])
        self._write("trace_clock", clock.group(1) if clock else "local")
        self._write("buffer_size_kb", self._saved["buffer_size_kb"].split()[0])
        written = re.search(r"entries-in-buffer/entries-written: (\d+)/(\d+)", text)
        self.lost = int(written.group(2)) - int(written.group(1)) if written else 0
        for match in _EVENT.finditer(text):
            seconds, micros, prev, state, nxt = match.groups()
            self.switches.append(Switch(int(seconds) * 1_000_000_000 + int(micros.ljust(9, "0")[:9]),
                                        int(prev), state, int(nxt)))

    def off_cpu(self, tid: int, start_ns: int, end_ns: int) -> int:
        """Thread `tid`'s time off CPU inside [start_ns, end_ns] (from each of its switch-outs to
        its next switch-in, clipped to the window). Raises if its switches do not alternate out,
        in: the record is then no truth."""
        return sum(max(0, min(back, end_ns) - max(out, start_ns)) for out, back in self._blocks(tid))

    def blocks_ending(self, tid: int, start_ns: int, end_ns: int) -> int:
        """Thread `tid`'s blocks (switch-out to switch-in) that end inside [start_ns, end_ns]: where
        the probe counts a block."""
        return sum(1 for _, back in self._blocks(tid) if start_ns <= back <= end_ns)

    def _blocks(self, tid: int) -> list[tuple[int, int]]:
        """(switch-out, switch-in) times of the thread's blocks."""
        blocks = []
        out_at: int | None = None
        running: bool | None = None  # unknown before its first event
        for s in self.switches:
            if s.prev == tid:
                if running is False:
                    raise AssertionError(f"thread {tid} switched out twice without a switch-in ({s})")
                running, out_at = False, s.ts_ns
            if s.next == tid:
                if running is True:
                    raise AssertionError(f"thread {tid} switched in twice without a switch-out ({s})")
                if out_at is not None:
                    blocks.append((out_at, s.ts_ns))
                running, out_at = True, None
        return blocks

    @staticmethod
    def _read(name: str) -> str:
        return (TRACEFS / name).read_text().strip()

    @staticmethod
    def _write(name: str, value: str) -> None:
        (TRACEFS / name).write_text(value)
