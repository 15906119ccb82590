"""The wait-site table: which frame of a user stack names the application's code, and the call path."""

from __future__ import annotations

import pytest

from offcpu_exporter.series.wait_site import CALL_PATH_FRAMES, MAX_NAME, FrameRole, role, wait_site
from offcpu_exporter.snapshot import Frame, FrameKind, Stack

LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"
APP = "/usr/sbin/nginx"
PYTHON = "/usr/bin/python3.11"


def native(name: str, module: str = APP) -> Frame:
    return Frame(name, FrameKind.NATIVE, module)


def jit(name: str) -> Frame:
    return Frame(name, FrameKind.JIT, "[jit]")


def user(*frames: Frame) -> Stack:
    """Frames given root first (as people read them); stacks hold them leaf first."""
    return Stack(tuple(reversed(frames)), (Frame("do_nanosleep", FrameKind.KERNEL, "[kernel]"),))


@pytest.mark.parametrize(
    ("frame", "expected"),
    [
        # The C library, loader and vDSO, by module (any directory: containers bring their own).
        (native("epoll_wait", LIBC), FrameRole.WRAPPER),
        (native("anything", "/var/lib/containers/x/rootfs/lib/libc-2.31.so"), FrameRole.WRAPPER),
        (native("__pthread_cond_wait", "/lib/x86_64-linux-gnu/libpthread.so.0"), FrameRole.WRAPPER),
        (native("_dl_start", "/lib64/ld-linux-x86-64.so.2"), FrameRole.WRAPPER),
        (native("__vdso_clock_gettime", "[vdso]"), FrameRole.WRAPPER),
        (native("x", "/lib/ld-musl-x86_64.so.1"), FrameRole.WRAPPER),
        (native("g_main_context_iterate", "/usr/lib/x86_64-linux-gnu/libglib-2.0.so.0"), FrameRole.WRAPPER),
        # ... but not libraries whose names merely start like them.
        (native("cap_get_proc", "/usr/lib/x86_64-linux-gnu/libcap.so.2"), FrameRole.APPLICATION),
        (native("crypt_r", "/usr/lib/x86_64-linux-gnu/libcrypt.so.1"), FrameRole.APPLICATION),
        # glibc's names wherever they are linked (a static binary, or a wrapper the program defines).
        (native("syscall"), FrameRole.WRAPPER),
        (native("__GI___clock_nanosleep"), FrameRole.WRAPPER),
        (native("read@@GLIBC_2.2.5"), FrameRole.WRAPPER),
        (native("__lll_lock_wait"), FrameRole.WRAPPER),
        (native("__futex_abstimed_wait_common"), FrameRole.WRAPPER),
        (native("do_futex_wait.constprop.0"), FrameRole.WRAPPER),
        (native("___pthread_cond_wait"), FrameRole.WRAPPER),
        (native("__libc_recv"), FrameRole.WRAPPER),
        # libstdc++'s and Rust's standard-library waits, Go's runtime, libuv's loop.
        (native("std::condition_variable::wait(std::unique_lock<std::mutex>&)",
                "/usr/lib/x86_64-linux-gnu/libstdc++.so.6"), FrameRole.WRAPPER),
        (native("std::mutex::lock()"), FrameRole.WRAPPER),
        (native("std::thread::sleep"), FrameRole.WRAPPER),
        (native("<std::thread::thread::Thread>::park_timeout"), FrameRole.WRAPPER),
        (native("<std::sync::mpmc::Receiver<alloc::string::String>>::recv"), FrameRole.WRAPPER),
        (native("<myapp::Feed as std::io::Read>::read"), FrameRole.APPLICATION),  # the program's impl
        (native("runtime.futex", "/usr/bin/goapp"), FrameRole.WRAPPER),
        (native("uv__io_poll", "/usr/bin/node"), FrameRole.WRAPPER),
        # Interpreters' own code, by module and by name.
        (native("_PyEval_EvalFrameDefault", PYTHON), FrameRole.RUNTIME),
        (native("time_sleep", PYTHON), FrameRole.RUNTIME),
        (native("PyObject_Vectorcall", "/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0"), FrameRole.RUNTIME),
        (native("_PyEval_EvalFrameDefault", "/opt/app/bin/embedded"), FrameRole.RUNTIME),
        (jit("py::wait:/usr/lib/python3.12/threading.py"), FrameRole.RUNTIME),
        (jit("Builtin:InterpreterEntryTrampoline"), FrameRole.RUNTIME),
        (jit("LazyCompile:~listOnTimeout node:internal/timers:512"), FrameRole.RUNTIME),
        (native("Builtins_JSEntry", "/usr/bin/node"), FrameRole.RUNTIME),
        # The application: its own code and libraries, JIT code named from its perf map.
        (native("ngx_process_events_and_timers"), FrameRole.APPLICATION),
        (native("main.worker", "/usr/bin/goapp"), FrameRole.APPLICATION),
        (native("pq_recvbuf", "/usr/lib/postgresql/15/bin/postgres"), FrameRole.APPLICATION),
        (jit("py::hold:/srv/app/jobs.py"), FrameRole.APPLICATION),
        (jit("py::get:/usr/lib/python3/dist-packages/requests/api.py"), FrameRole.APPLICATION),
        (jit("LazyCompile:*poll /srv/app/index.js:12"), FrameRole.APPLICATION),
        # Placeholders.
        (Frame("[unknown] nginx+0x1a2b", FrameKind.PLACEHOLDER, APP), FrameRole.PLACEHOLDER),
        (Frame("[lost stack: not captured]", FrameKind.PLACEHOLDER), FrameRole.PLACEHOLDER),
    ],
    ids=lambda v: v.name if isinstance(v, Frame) else None,
)
def test_frame_roles(frame: Frame, expected: FrameRole) -> None:
    assert role(frame) is expected


def test_a_libc_leaf_is_skipped_for_the_application_frame() -> None:
    # What the issue saw on Debian's services: the leaf is the C library's wrapper.
    site = wait_site(user(native("main"), native("ngx_worker_process_cycle"), native("ngx_process_events_and_timers"),
                          native("ngx_epoll_process_events"), native("epoll_wait", LIBC)))
    assert site.function == "ngx_epoll_process_events"
    assert site.call_path == "main;ngx_worker_process_cycle;ngx_process_events_and_timers;ngx_epoll_process_events"


def test_three_code_paths_through_one_helper_get_three_label_pairs() -> None:
    # The workload: each thread calls the same syscall helper; two of them in nanosleep.
    def through(fn: str) -> Stack:
        return user(native("clone3", LIBC), native("start_thread", LIBC), native("thread_main"), native(fn),
                    native("syscall"))

    sites = [wait_site(through(fn)) for fn in ("hold_in_nanosleep", "wait_for_pipe_message",
                                                "feed_pipe_periodically")]
    assert [s.function for s in sites] == ["hold_in_nanosleep", "wait_for_pipe_message", "feed_pipe_periodically"]
    assert sites[0].call_path == "thread_main;hold_in_nanosleep"  # libc's thread start is left out
    # A helper that is not a well-known wrapper is the application's frame; the path still differs.
    helper = [wait_site(user(native("thread_main"), native(fn), native("my_blocking_call")))
              for fn in ("a_path", "b_path")]
    assert {s.function for s in helper} == {"my_blocking_call"}
    assert [s.call_path for s in helper] == ["thread_main;a_path;my_blocking_call",
                                             "thread_main;b_path;my_blocking_call"]


def test_a_placeholder_is_never_chosen_while_a_named_frame_exists_further_up() -> None:
    site = wait_site(user(native("main"), native("serve"), Frame("[unknown] nginx+0x99", FrameKind.PLACEHOLDER, APP),
                          Frame("[unknown]", FrameKind.PLACEHOLDER)))
    assert site.function == "serve"
    assert site.call_path == "main;serve"
    # Only wrappers above it: still a named frame rather than the placeholder.
    site = wait_site(user(native("__libc_start_main", LIBC), Frame("[unknown]", FrameKind.PLACEHOLDER)))
    assert site.function == "__libc_start_main"


def test_fallbacks_when_no_application_frame_exists() -> None:
    # Every frame a wrapper (a Go thread parked by its runtime): the innermost one.
    site = wait_site(user(native("runtime.mstart", "/usr/bin/goapp"), native("runtime.stopm", "/usr/bin/goapp"),
                          native("runtime.futex", "/usr/bin/goapp")))
    assert site.function == "runtime.futex"
    assert site.call_path == "runtime.mstart;runtime.stopm;runtime.futex"
    # Python without a perf map: its interpreter's innermost frame says more than libc's.
    site = wait_site(user(native("Py_RunMain", PYTHON), native("_PyEval_EvalFrameDefault", PYTHON),
                          native("time_sleep", PYTHON), native("pysleep", PYTHON),
                          native("clock_nanosleep", LIBC)))
    assert site.function == "pysleep"
    assert site.call_path == "Py_RunMain;_PyEval_EvalFrameDefault;time_sleep;pysleep"
    # A lost user half: its placeholder.
    lost = Frame("[lost stack: not captured]", FrameKind.PLACEHOLDER)
    assert wait_site(Stack((lost,), ())).function == "[lost stack: not captured]"
    assert wait_site(Stack((), (Frame("worker_thread", FrameKind.KERNEL),))).function == "[no user stack]"


def test_python_with_a_perf_map_names_the_python_function() -> None:
    # python -X perf: JIT frames for Python functions between the interpreter's own C frames.
    site = wait_site(user(native("Py_RunMain", PYTHON), jit("py::<module>:/srv/app/main.py"),
                          native("_PyEval_EvalFrameDefault", PYTHON), jit("py::run:/srv/app/jobs.py"),
                          native("_PyEval_EvalFrameDefault", PYTHON), jit("py::hold:/srv/app/jobs.py"),
                          native("_PyEval_EvalFrameDefault", PYTHON),
                          jit("py::wait:/usr/lib/python3.12/threading.py"),
                          native("_PyEval_EvalFrameDefault", PYTHON), native("time_sleep", PYTHON),
                          native("clock_nanosleep", LIBC)))
    assert site.function == "py::hold:/srv/app/jobs.py"
    assert site.call_path == "py::<module>:/srv/app/main.py;py::run:/srv/app/jobs.py;py::hold:/srv/app/jobs.py"


def test_length_limits() -> None:
    frames = [native(f"level_{i}") for i in range(10)]
    site = wait_site(user(*frames, native("read", LIBC)))
    assert site.call_path.split(";") == [f"level_{i}" for i in range(10 - CALL_PATH_FRAMES, 10)]
    assert wait_site(user(*frames), frames=2).call_path == "level_8;level_9"
    long = "ns::Type<" + "x" * 300 + ">::wait()"
    site = wait_site(user(native("main"), native(long), native("a;b")))
    assert site.function == "a;b"
    assert site.call_path.split(";") == ["main", long[: MAX_NAME - 1] + "…", "a:b"]  # ";" only between frames
    assert len(site.call_path) <= CALL_PATH_FRAMES * MAX_NAME + CALL_PATH_FRAMES - 1
    assert wait_site(user(native("main"), native(long))).function == long[: MAX_NAME - 1] + "…"
