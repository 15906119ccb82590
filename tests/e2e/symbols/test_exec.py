"""A watched process that exec's another program: from the next targets scan on, its stacks are
named from the new program (real processes and symbolizer; kernel maps held in memory)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from offcpu_exporter.core import CoreConfig, build_core
from offcpu_exporter.pipeline import Pipeline
from offcpu_exporter.probe import layout
from offcpu_exporter.snapshot import Reason
from offcpu_exporter.targets import TargetRules
from testkit.kernel_maps import MemoryMaps, exact
from testkit.kernel_maps import key as stack_key
from testkit.symbol_programs import Program, compile_c


def _user_names(pipeline: Pipeline) -> list[str]:
    snapshot = pipeline.flush()
    (sample,) = [s for s in snapshot.samples if s.increase.count and s.stack.user]
    return [f.name for f in sample.stack.user]


def test_stacks_after_an_exec_are_named_from_the_new_program(
    tmp_path: Path, run: Callable[..., Program]
) -> None:
    first = compile_c(tmp_path / "first", "symbols_exec.c", "-no-pie", "-DWAIT_NAME=first_program_wait")
    second = compile_c(tmp_path / "second", "symbols_exec.c", "-no-pie", "-DWAIT_NAME=second_program_wait")
    program = run(first)
    address = program.addresses["wait_function"]
    kernel = MemoryMaps()
    core = build_core(CoreConfig(rules=TargetRules(pids=(program.pid,))), probe=kernel)
    assert core.problems == []
    table, pipeline = core.processes, core.pipeline
    pipeline.sync_targets()

    no_kernel_stack = layout.STACK_ERRNO_BASE + 14  # -EFAULT
    key = stack_key(program.pid, 0x1_0000, no_kernel_stack, Reason.SLEEPING.value)
    kernel.stacks[0x1_0000] = (address,)
    kernel.counts[key] = exact(1, 1_000)
    assert _user_names(pipeline) == ["first_program_wait"]

    program.command(f"exec {second}", until="ready")
    assert program.addresses["wait_function"] == address, "the two builds differ in layout: no overlap to test"
    pipeline.sync_targets()
    info = table.info(program.pid)
    assert info is not None and info.exe == str(second)
    del kernel.counts[key]
    kernel.stacks[0x2_0000] = (address,)
    kernel.counts[stack_key(program.pid, 0x2_0000, no_kernel_stack, Reason.SLEEPING.value)] = exact(1, 1_000)
    assert _user_names(pipeline) == ["second_program_wait"]
