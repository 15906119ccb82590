"""Builds one object's unwind table in a child process: `python -m offcpu_exporter.unwind.build`.

Parsing a large object's CFI with pyelftools allocates hundreds of MB of Python objects for a
moment (libLLVM: 950,000 rows). In the exporter's own process that memory would stay with it (the
allocator keeps what it once had); in a child it goes back to the system when the child exits, and
the exporter only receives the packed table.

    python -m offcpu_exporter.unwind.build PATH BINARY_PATH ROOT [DEBUG_DIR ...]

writes the table (UnwindTable.to_bytes) to stdout and exits 0, or writes why there is none to stderr
and exits 3.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence

from offcpu_exporter.symbols.elf import ElfInfo
from offcpu_exporter.unwind.objects import ObjectError, object_info, object_table
from offcpu_exporter.unwind.table import UnwindTable

__all__ = ["build_in_child", "main"]

_NO_TABLE = 3
_TIMEOUT = 900.0  # seconds: the largest objects take tens of seconds, under emulation 25 times that


def build_in_child(path: str, info: ElfInfo, binary_path: str, root: str, debug_dirs: Sequence[str]) -> UnwindTable:
    """objects.object_table, computed in a child process (same arguments, same errors)."""
    del info  # the child reads the object's headers itself
    try:
        done = subprocess.run([sys.executable, "-m", "offcpu_exporter.unwind.build", path, binary_path, root,
                               *debug_dirs], capture_output=True, timeout=_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ObjectError(f"table builder failed: {exc}") from None
    if done.returncode == _NO_TABLE:
        raise ObjectError(done.stderr.decode(errors="replace").strip() or "no table")
    if done.returncode != 0:
        last = done.stderr.decode(errors="replace").strip().splitlines()[-1:]
        raise ObjectError(f"table builder exited with {done.returncode}: {' '.join(last)}")
    return UnwindTable.from_bytes(done.stdout)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3:
        sys.stderr.write("usage: python -m offcpu_exporter.unwind.build PATH BINARY_PATH ROOT [DEBUG_DIR ...]\n")
        return 2
    path, binary_path, root, *debug_dirs = args
    try:
        table = object_table(path, object_info(path), binary_path, root, debug_dirs)
    except ObjectError as exc:
        sys.stderr.write(f"{exc}\n")
        return _NO_TABLE
    sys.stdout.buffer.write(table.to_bytes())
    return 0


if __name__ == "__main__":
    sys.exit(main())
