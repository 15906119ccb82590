"""An Unwinder looks again at a process cheaply: a process whose executable mappings did not change
is not described again (its maps read, compared, left), one whose mappings changed is."""

from __future__ import annotations

from pathlib import Path

from offcpu_exporter.unwind.unwinder import FRAME_POINTER, Unwinder

PID = 4242
CODE = "7f0000000000-7f0000001000 r-xp 00000000 00:00 0 \n"
HEAP = "55d000000000-55d000021000 rw-p 00000000 00:00 0                          [heap]\n"
MORE_HEAP = "55d000000000-55d000042000 rw-p 00000000 00:00 0                          [heap]\n"
MORE_CODE = "7f0000100000-7f0000102000 r-xp 00000000 00:00 0 \n"


def _maps(root: Path, *lines: str) -> None:
    (root / str(PID)).mkdir(exist_ok=True)
    (root / str(PID) / "maps").write_text("".join(lines))


def test_a_process_is_described_again_only_when_its_executable_mappings_change(tmp_path: Path) -> None:
    unwinder = Unwinder(None, proc_root=str(tmp_path))
    _maps(tmp_path, HEAP, CODE)
    first = unwinder.update(PID)
    assert first is not None and [(m.start, m.method) for m in first] == [(0x7F0000000000, FRAME_POINTER)]
    assert unwinder.changes == 1
    assert unwinder.update(PID) is first and unwinder.changes == 1  # the same maps: nothing done
    _maps(tmp_path, MORE_HEAP, CODE)  # other text, the same executable mappings
    assert unwinder.update(PID) is first and unwinder.changes == 1
    _maps(tmp_path, MORE_HEAP, CODE, MORE_CODE)  # code mapped since (dlopen, a JIT)
    again = unwinder.update(PID)
    assert unwinder.changes == 2
    assert again is not None and [m.start for m in again] == [0x7F0000000000, 0x7F0000100000]
    assert unwinder.update(PID) is again and unwinder.changes == 2


def test_a_process_gone_is_not_described(tmp_path: Path) -> None:
    unwinder = Unwinder(None, proc_root=str(tmp_path))
    assert unwinder.update(PID) is None
    assert unwinder.changes == 0
