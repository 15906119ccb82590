"""Where the application waited: the frame of a user stack that names the application's own code.

The innermost user frame of an off-CPU stack is usually not the application's: it is the C library's
system-call wrapper (`read`, `syscall`, `__GI___lll_lock_wait`, `epoll_wait`), the loader, the vDSO,
or an interpreter's own C code. The *wait site* is the innermost frame that is none of those, and
the *call path* is that frame and a few of its callers, so that two code paths that block in the
same wrapper get different labels.

Each frame gets a role from one table (`role`), decided by its module (the mapped file's name) and
by well-known names:

================  ===================================================================================
role              frames
================  ===================================================================================
``PLACEHOLDER``   ``[unknown] ...``, ``[lost stack: ...]``
``WRAPPER``       by module: the C library and its siblings (glibc's libc, libpthread, librt, libdl,
                  libm, libresolv; musl), the dynamic loader, the vDSO, event-loop libraries (glib,
                  libuv, libevent, libev). By name, in any module (static binaries, wrappers a program
                  defines itself): glibc's blocking wrappers and internal names (`_WRAPPER_NAMES`,
                  `_WRAPPER_PREFIXES`: ``syscall``, ``read``, ``__GI___poll``, ``__lll_lock_wait``,
                  ``pthread_*``, ``sem_*``), the C++ and Rust standard libraries (``std::``,
                  ``__gnu_cxx::``, ``core::``: ``condition_variable::wait``, ``this_thread::sleep_for``),
                  parking_lot, libuv (``uv_*``), Go's runtime and syscall packages (``runtime.*``,
                  ``syscall.*``, ``internal/poll.*``)
``RUNTIME``       an interpreter's or VM's own code: its executable or library (python, libpython,
                  ruby, perl, node, libnode, libv8, java, libjvm) and its well-known names in any module
                  (`_RUNTIME_NAMES`: CPython's ``_PyEval_*``/``Py*_``, V8's ``Builtin:``/``Stub:``
                  perf-map entries and ``Builtins_*``, Node's own ``node:`` JavaScript, the standard
                  library's Python functions, HotSpot's parking and the JDK's classes)
``APPLICATION``   everything else: the program's code, its libraries, and JIT frames named from a
                  perf map (``py::fn:file.py`` with ``python -X perf``, ``LazyCompile:*fn`` with
                  ``node --perf-basic-prof``)
================  ===================================================================================

The wait site is the innermost frame of the best role present: an ``APPLICATION`` frame; without
one the innermost ``RUNTIME`` frame (``time_sleep`` says more than libc's ``clock_nanosleep``), then
the innermost ``WRAPPER`` frame, and only when every frame is a placeholder, the innermost
placeholder. The call path is the wait site and its callers whose role ranks at least as high (the
application frames only, when the wait site is one: wrapper and interpreter frames in between are
left out), the innermost `CALL_PATH_FRAMES`, root first and ``;``-separated (a ``;`` inside a name
becomes ``:``). Frame names in both labels are cut at `MAX_NAME` characters, so a label is at most
``frames * MAX_NAME + frames - 1`` characters. Both are functions of the stack, so they add no series
beyond the stacks' own.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from functools import lru_cache

from offcpu_exporter.snapshot import Frame, FrameKind, Stack

__all__ = ["CALL_PATH_FRAMES", "MAX_NAME", "FrameRole", "WaitSite", "role", "wait_site"]

CALL_PATH_FRAMES = 4  # frames in the call path by default
MAX_NAME = 96  # characters of one frame name in a label; longer names end in "…"


class FrameRole(enum.IntEnum):
    """Ranked: a higher role is a better wait site."""

    PLACEHOLDER = 0
    WRAPPER = 1
    RUNTIME = 2
    APPLICATION = 3


# Matched against the mapped file's name (any directory: containers bring their own libraries).
_WRAPPER_MODULES = re.compile(
    r"""(
        lib(c|pthread|rt|dl|m|resolv)(\.so(\.[\d.]+)?|-[\d.]+\.so)   # glibc: libc.so.6, libc-2.31.so
      | ld-linux[-\w]*\.so(\.\d+)* | ld-[\d.]+\.so | ld64\.so(\.\d+)*   # the dynamic loader
      | (libc|ld)\.musl-[\w.]+ | ld-musl-[\w.]+\.so(\.\d+)*             # musl
      | \[vdso\] | linux-vdso\.so(\.\d+)*                               # the vDSO
      | libglib-2\.0\.so[.\d]* | libuv\.so[.\d]* | libevent[-\w.]*\.so[.\d]* | libev\.so[.\d]*  # event loops
    )""",
    re.VERBOSE,
)
_RUNTIME_MODULES = re.compile(
    r"(lib)?(python|ruby|perl)[\d.]*(\.so[.\d]*|d|m|dm)? | node | libnode\.so[.\d]* | libv8[-\w]*\.so[.\d]*"
    r" | libjvm\.so | java",
    re.VERBOSE,
)

# Names of the C library's blocking wrappers, after `_normalized` (``__GI___poll`` -> ``poll``):
# matched in any module, for statically linked programs and wrappers a program defines itself.
_WRAPPER_NAMES = frozenset({
    "syscall", "read", "write", "readv", "writev", "pread", "pread64", "pwrite", "pwrite64", "preadv",
    "pwritev", "recv", "recvfrom", "recvmsg", "recvmmsg", "send", "sendto", "sendmsg", "sendmmsg",
    "accept", "accept4", "connect", "poll", "ppoll", "select", "pselect", "pselect6", "epoll_wait",
    "epoll_pwait", "epoll_pwait2", "nanosleep", "clock_nanosleep", "usleep", "sleep", "pause", "wait",
    "waitpid", "wait3", "wait4", "waitid", "sigsuspend", "sigwait", "sigwaitinfo", "sigtimedwait",
    "fsync", "fdatasync", "syncfs", "sync_file_range", "flock", "fcntl", "fcntl64", "lockf", "open",
    "open64", "openat", "openat64", "close", "msgrcv", "msgsnd", "semop", "semtimedop", "mq_receive",
    "mq_timedreceive", "mq_send", "mq_timedsend", "io_getevents", "io_uring_enter", "futex", "fgets",
    "fread", "getline", "getdelim", "getc", "fgetc", "getchar", "system", "sched_yield",
})
_WRAPPER_PREFIXES = (
    # glibc's internal names (after `_normalized`): __lll_lock_wait, __futex_abstimed_wait_common,
    # ___pthread_cond_wait, __new_sem_wait_slow64, __libc_recv, __syscall_cancel_arch, _IO_getline.
    "pthread_", "sem_", "new_sem_", "old_sem_", "lll_", "futex", "libc_", "IO_", "syscall_cancel",
    "internal_syscall", "condvar_", "do_futex_wait", "thrd_", "cnd_", "mtx_", "call_once",
    # libuv's loop (statically linked into node): uv_run, uv__io_poll.
    "uv_",
    # C++ and Rust standard libraries (demangled): condition_variable::wait, this_thread::sleep_for,
    # mutex::lock (out of line at -O0, in the program's own binary), Rust's std::sync and std::thread.
    "std::", "__gnu_cxx::", "core::", "parking_lot::", "parking_lot_core::",
    # Go: the runtime parks threads (futex, epollwait, usleep) and syscall/internal/poll wrap the rest.
    "runtime.", "runtime/internal/", "internal/runtime/", "syscall.", "internal/poll.", "internal/syscall/",
)
_RUNTIME_NAMES = re.compile(
    r"""_?Py([A-Z][A-Za-z]*)?_ | method_vectorcall | cfunction_(vectorcall|call) | slot_tp_ | pymain_
      | pythread_wrapper$                                                      # CPython's own C code
      | py::[^:]*:(.*/)?lib/python[\d.]+/(?!(site|dist)-packages/)             # python -X perf: the stdlib
      | (Builtin|BytecodeHandler|Stub|Handler|RegExp):                         # V8 perf-map entries
      | .*\ node:                                                              # Node's own JavaScript
      | Builtins_ | v8::internal:: | node::                                    # V8 and Node natives
      | JVM_ | Unsafe_Park | Parker:: | PlatformEvent:: | ObjectMonitor:: | JavaThread:: | JavaCalls::
      | Interpreter$ | L(java|jdk|sun)/                                        # HotSpot, perf-map-agent
    """,
    re.VERBOSE,
)
_COMPILER_SUFFIX = re.compile(r"^([A-Za-z_]\w*)\.(isra|constprop|part|cold|lto_priv|localalias)\b.*")
_GLIBC_ALIAS = re.compile(r"^(__GI_)+")


def _normalized(name: str) -> str:
    """``__GI___clock_nanosleep`` -> ``clock_nanosleep``; ``read@@GLIBC_2.2.5`` -> ``read``;
    ``do_futex_wait.constprop.0`` -> ``do_futex_wait``."""
    name = _COMPILER_SUFFIX.sub(r"\1", name.split("@", 1)[0])
    return _GLIBC_ALIAS.sub("", name).lstrip("_")


# Bounded caches: only the top-K stacks of each process are labelled (2,000 at the defaults).
@lru_cache(maxsize=16384)
def role(frame: Frame) -> FrameRole:
    """The frame's role in deciding the wait site (the table in this module's docstring)."""
    if frame.kind is FrameKind.PLACEHOLDER:
        return FrameRole.PLACEHOLDER
    module = frame.module_basename
    if module and _WRAPPER_MODULES.fullmatch(module):
        return FrameRole.WRAPPER
    name = frame.name
    if frame.kind is not FrameKind.JIT:
        base = _normalized(name)
        # Rust names its impls <Type>::method and <Type as Trait>::method: the type decides.
        qualified = name.lstrip("<")
        if base in _WRAPPER_NAMES or base.startswith(_WRAPPER_PREFIXES) or qualified.startswith(_WRAPPER_PREFIXES):
            return FrameRole.WRAPPER
    if _RUNTIME_NAMES.match(name):
        return FrameRole.RUNTIME
    if frame.kind is not FrameKind.JIT and module and _RUNTIME_MODULES.fullmatch(module):
        return FrameRole.RUNTIME
    return FrameRole.APPLICATION


@dataclass(frozen=True, slots=True)
class WaitSite:
    function: str  # the wait site's name, cut at MAX_NAME
    call_path: str  # root first, ";"-separated


NO_USER_STACK = "[no user stack]"


def wait_site(stack: Stack, frames: int = CALL_PATH_FRAMES) -> WaitSite:
    """The wait site and call path of a stack's user half (leaf first)."""
    return _wait_site(stack.user, frames)


@lru_cache(maxsize=8192)
def _wait_site(user: tuple[Frame, ...], frames: int) -> WaitSite:
    if not user:
        return WaitSite(NO_USER_STACK, NO_USER_STACK)
    roles = [role(f) for f in user]
    best = max(roles)
    at = roles.index(best)  # innermost frame of the best role
    path = [user[at]]
    for frame, r in zip(user[at + 1 :], roles[at + 1 :], strict=True):
        if len(path) >= frames:
            break
        if r >= best:
            path.append(frame)
    name = _label_name(user[at].name)
    return WaitSite(name, ";".join(_label_name(f.name).replace(";", ":") for f in reversed(path)))


def _label_name(name: str) -> str:
    return name if len(name) <= MAX_NAME else name[: MAX_NAME - 1] + "…"
