"""Node with --perf-basic-prof: what off-CPU stacks of a JIT runtime look like.

- Preempted while running JS (CPU shared with a busy loop on the same core): the user stack starts
  in JIT code, V8 keeps frame pointers there, so every frame is named: JS functions from the perf
  map (with --interpreted-frames-native-stack also the interpreted ones), then node/V8 C++ frames.
- Blocked in a syscall (Atomics.wait -> futex): the syscall is made inside glibc, which Debian
  builds without frame pointers, so the walk stops at the libc function (see docs/symbols.md).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.symbol_programs import Program, Recorder

pytestmark = pytest.mark.kernel
HERE = Path(__file__).parent
RunProgram = Callable[..., Program]
# The scripts run until killed at the end of the test (300 s at most): attaching the probe can take
# half a minute on a loaded machine.


def node() -> str:
    path = shutil.which("node") or shutil.which("nodejs")
    if path is None:
        pytest.fail("node is not installed (scripts/setup --test installs nodejs)")
    return path


def user_frames(stack: str) -> list[str]:
    """User frames root..leaf of a folded line (the kernel half starts at its entry point)."""
    frames = stack.split(";")[1:]
    for i, frame in enumerate(frames):
        if frame.startswith(("entry_SYSCALL", "asm_", "ret_from_fork")):
            return frames[:i]
    return frames


def test_preempted_js_frames_are_named(run: RunProgram, tmp_path: Path) -> None:
    taskset = shutil.which("taskset")
    if taskset is None:
        pytest.fail("taskset (util-linux) is missing")
    program = run(
        taskset,
        "-c",
        "0",
        node(),
        "--perf-basic-prof",
        "--interpreted-frames-native-stack",
        str(HERE / "node_spin.js"),
        "300000",
        cwd=tmp_path,
    )  # cwd: V8 writes isolate-*.log files there
    # One busy loop on the same CPU: node is preempted (runnable) about half of the time.
    hog = subprocess.Popen([taskset, "-c", "0", "sh", "-c", "while :; do :; done"])
    try:
        recorder = Recorder([program.pid], duration=3.0)
        recorder.wait_attached()
        started = time.monotonic()
        folded = recorder.result()
        elapsed_us = (time.monotonic() - started) * 1e6
    finally:
        hog.kill()
        hog.wait()
    js_us = 0
    for stack, us in folded.items():
        frames = user_frames(stack)
        # TurboFan may inline innerSpin into outerSpin: either is a leaf of ours.
        if frames and frames[-1].startswith("JS:") and "Spin " in frames[-1] and "node_spin.js" in frames[-1]:
            assert any(f.startswith("JS:") and "outerSpin" in f for f in frames), stack
            assert not any(f.startswith("[unknown]") for f in frames), stack + "\n" + recorder.log_tail()
            js_us += us
    # Sharing one CPU with a busy loop, node waits for it roughly half the time; most of that
    # while in innerSpin. Wide bounds: the machine is shared.
    assert 0.1 * elapsed_us <= js_us <= elapsed_us, "\n".join(sorted(folded)[:30]) + recorder.log_tail()


def test_blocking_in_libc_goes_on_through_it_to_the_js_frames_and_the_root(run: RunProgram, tmp_path: Path) -> None:
    """node's libc has no frame pointers: the DWARF unwinder walks through it (and node's C++) to the
    JIT-compiled JS frames (frame pointers, named by the perf map) and down to _start."""
    program = run(node(), "--perf-basic-prof", str(HERE / "node_block.js"), "300000", cwd=tmp_path)
    recorder = Recorder([program.pid], duration=2.5)
    recorder.wait_attached()
    folded = recorder.result()
    futex_us = 0
    for stack, us in folded.items():
        if "futex_wait" not in stack or not stack.startswith("node;"):
            continue
        frames = user_frames(stack)
        # Only Atomics.wait's stacks: node's other threads (V8's workers, also named "node") may
        # have been blocked since before the unwind tables were built, their stacks captured then
        # with frame pointers (one libc frame), and their blocks still going on in the window.
        if not any("Builtin_AtomicsWait" in f for f in frames):
            continue
        if frames and not frames[-1].startswith("[unknown]") and "futex" in frames[-1]:
            futex_us += us
            # Through libc to V8's own frames (Atomics.wait's builtin), and on to JS's entry and
            # the process's first function. (The JS functions themselves show as JIT frames once
            # compiled, as the interpreter's trampoline before: test_preempted_js_frames_are_named.)
            assert frames[0] == "_start", stack
            assert "Builtins_JSEntry" in frames, stack
    assert futex_us >= 1_000_000, "\n".join(sorted(folded)[:30]) + recorder.log_tail()
