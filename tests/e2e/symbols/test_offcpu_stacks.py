"""Symbolized frames in real off-CPU stacks: the probe records the test programs while they block
in run-time generated code (named only by their perf map), in a library dlopen'ed after the
exporter started, and in a stripped binary deleted from disk whose symbols come from its
debuglink file. Off-CPU time per stack is checked against what the programs know they slept."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.symbol_programs import Program, Recorder, compile_c, need, off_cpu_us

pytestmark = pytest.mark.kernel

RunProgram = Callable[..., Program]
BLOCK_MS = 800


def test_jit_dlopen_and_stripped_deleted_frames(run: RunProgram, tmp_path: Path) -> None:
    need("objcopy")
    target = compile_c(tmp_path / "symjit", "symbols_target.c", "-fPIE", "-pie")
    plugin = tmp_path / "libsymbols_plugin.so"
    subprocess.run(
        [need("gcc"), "-shared", "-fPIC", "-O0", "-fno-omit-frame-pointer", "-o", str(plugin),
         str(Path(__file__).parent / "symbols_plugin.c")],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    # A stripped copy whose symbols are only in a debuglink file, deleted from disk once running.
    stripped = tmp_path / "symstrip"
    debug = tmp_path / "symstrip.debug"
    subprocess.run(["objcopy", "--only-keep-debug", str(target), str(debug)], check=True, timeout=60)
    subprocess.run(["objcopy", "--strip-all", f"--add-gnu-debuglink={debug}", str(target), str(stripped)],
                   check=True, cwd=tmp_path, timeout=60)  # fmt: skip
    jit_program = run(target)
    stripped_program = run(stripped)
    stripped.unlink()

    recorder = Recorder([jit_program.pid, stripped_program.pid], duration=3 * BLOCK_MS / 1000 + 3)
    recorder.wait_attached()
    started = time.monotonic()
    jit_program.command(f"dlopen {plugin}", "symbols_plugin_func")  # after the exporter started
    stripped_program.proc.stdin.write(f"sleep {BLOCK_MS}\n".encode())  # type: ignore[union-attr]
    stripped_program.proc.stdin.flush()  # type: ignore[union-attr]
    jit_program.command(f"jit {BLOCK_MS}", "done")  # BLOCK_MS x 1 ms inside the generated code
    jit_program.command(f"plugin {BLOCK_MS}", "done")
    stripped_program.read_until("done")
    elapsed_us = (time.monotonic() - started) * 1e6
    folded = recorder.result()

    shown = "\n".join(sorted(folded)[:40]) + "\n" + recorder.log_tail()
    jit_us = off_cpu_us(folded, "symjit", "jit_nanosleep_stub")
    plugin_us = off_cpu_us(folded, "symjit", "symbols_plugin_sleep")
    stripped_us = off_cpu_us(folded, "symstrip", "symbols_blocking_sleep")
    # Each blocked at least BLOCK_MS (sleeps never end early) and at most the whole command time.
    assert BLOCK_MS * 1000 * 0.97 <= jit_us <= elapsed_us, shown
    assert BLOCK_MS * 1000 * 0.97 <= plugin_us <= elapsed_us, shown
    assert BLOCK_MS * 1000 * 0.97 <= stripped_us <= elapsed_us, shown
    # The frames below the leaf are named too.
    assert any(";main;jit_nanosleep_stub;" in s for s in folded), shown
    assert any(";main;symbols_plugin_sleep;" in s for s in folded), shown
    assert any(";main;symbols_blocking_sleep;" in s for s in folded), shown
    shutil.rmtree(tmp_path, ignore_errors=True)
