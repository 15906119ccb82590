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
import threading
from collections.abc import Sequence

from offcpu_exporter.symbols.elf import ElfInfo
from offcpu_exporter.unwind.objects import ObjectError, object_info, object_table
from offcpu_exporter.unwind.table import UnwindTable

__all__ = ["allow_builds", "build_in_child", "cancel_builds", "main"]

_NO_TABLE = 3
_TIMEOUT = 900.0  # seconds: the largest objects take tens of seconds, under emulation 25 times that

_running: set[subprocess.Popen[bytes]] = set()
_running_lock = threading.Lock()
_cancelled = threading.Event()


def cancel_builds() -> None:
    """Stop the builders running now and refuse new ones (the exporter is stopping): a build takes
    up to tens of seconds, and a SIGTERM must not wait for it."""
    _cancelled.set()
    with _running_lock:
        for child in _running:
            child.kill()


def allow_builds() -> None:
    """Builders may start again (a describer starts)."""
    _cancelled.clear()


def build_in_child(path: str, info: ElfInfo, binary_path: str, root: str, debug_dirs: Sequence[str]) -> UnwindTable:
    """objects.object_table, computed in a child process (same arguments, same errors)."""
    del info  # the child reads the object's headers itself
    with _running_lock:
        if _cancelled.is_set():
            raise ObjectError("table builder not started: stopping")
        try:
            child = subprocess.Popen([sys.executable, "-m", "offcpu_exporter.unwind.build", path, binary_path, root,
                                      *debug_dirs], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as exc:
            raise ObjectError(f"table builder failed: {exc}") from None
        _running.add(child)
    try:
        out, err = child.communicate(timeout=_TIMEOUT)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        raise ObjectError(f"table builder took more than {_TIMEOUT:.0f} s") from None
    finally:
        with _running_lock:
            _running.discard(child)
    if child.returncode == _NO_TABLE:
        raise ObjectError(err.decode(errors="replace").strip() or "no table")
    if child.returncode != 0:
        last = err.decode(errors="replace").strip().splitlines()[-1:]
        raise ObjectError(f"table builder exited with {child.returncode}: {' '.join(last)}")
    return UnwindTable.from_bytes(out)


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
