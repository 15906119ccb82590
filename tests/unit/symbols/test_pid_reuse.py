"""A watched process exits and another gets its pid: the symbolizer keeps naming the first one's
stacks from what it read while it lived, until forget(); then it reads the new one."""

from __future__ import annotations

from pathlib import Path

from offcpu_exporter.symbols import Symbolizer
from testkit.fake_proc import FakeProc

PID = 4242


def _become(proc: FakeProc, start_ticks: int, base: int, name: str) -> None:
    """The process holding PID now: started at `start_ticks`, JIT code `name` at `base`."""
    d = proc.process(PID)
    (d / "stat").write_text(f"{PID} (app) S 1 " + "0 " * 17 + f"{start_ticks} 0 0\n")
    proc.maps(PID, f"{base:x}-{base + 0x10000:x} r-xp 00000000 00:00 0\n")
    (d / "root" / "tmp").mkdir(parents=True, exist_ok=True)
    (d / "root" / "tmp" / f"perf-{PID}.map").write_text(f"{base:x} 100 {name}\n")


def test_a_reused_pid_does_not_rename_the_old_process_until_forgotten(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path / "proc")
    old, new = 0x7F0000000000, 0x7F1000000000
    _become(proc, 100, old, "old_code")
    sym = Symbolizer(str(proc.base), kallsyms_path=str(tmp_path / "no-kallsyms"), maps_refresh_interval=0.0)
    assert [f.name for f in sym.user(PID, [old + 8])] == ["old_code"]
    generation = sym.generation(PID)

    _become(proc, 200, new, "new_code")  # exited; another process started with the same pid
    assert sym.refresh(PID) == generation  # neither its maps nor its perf map were taken
    assert [f.name for f in sym.user(PID, [old + 8, new + 8])] == ["old_code", "[unknown]"]

    sym.forget(PID)  # what the pipeline does when it starts watching the new process
    assert [f.name for f in sym.user(PID, [old + 8, new + 8])] == ["[unknown]", "new_code"]


def test_the_same_process_is_read_again_as_before(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path / "proc")
    base = 0x7F0000000000
    _become(proc, 100, base, "first_name")
    sym = Symbolizer(str(proc.base), kallsyms_path=str(tmp_path / "no-kallsyms"), maps_refresh_interval=0.0)
    generation = sym.generation(PID)
    assert [f.name for f in sym.user(PID, [base + 8, base + 0x208])] == ["first_name", "[unknown]"]
    with open(proc.process(PID) / "root" / "tmp" / f"perf-{PID}.map", "a") as f:
        f.write(f"{base + 0x200:x} 100 compiled_later\n")  # the same process (same start time)
    assert sym.refresh(PID) != generation
    assert [f.name for f in sym.user(PID, [base + 8, base + 0x208])] == ["first_name", "compiled_later"]
