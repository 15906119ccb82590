from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from offcpu_exporter.formats import Profile, render
from offcpu_exporter.formats import folded as folded_format
from offcpu_exporter.formats.profile import ProfileSample
from offcpu_exporter.snapshot import (
    Counter,
    Frame,
    FrameKind,
    ProcessInfo,
    ProcessKey,
    Reason,
    Snapshot,
    Stack,
    Waker,
    WakerKind,
)


def test_round_trip_sums_to_process_totals(before: Snapshot, after: Snapshot) -> None:
    profile = Profile.between(before, after)
    parsed = list(folded_format.parse(render("folded", profile).decode()))
    by_comm: dict[str, int] = {}
    for frames, us in parsed:
        by_comm[frames[0]] = by_comm.get(frames[0], 0) + us
    totals = {profile.processes[k].comm: v for k, v in profile.totals_by_process().items()}
    assert by_comm == {comm: (t.ns + 500) // 1000 for comm, t in totals.items()}
    # 1.5 s + 0.25 s + 1234.567 us; 40000.499 us.
    assert by_comm == {"offcpu_workload": 1_751_235, "other<script>": 40_000}


def test_line_format(before: Snapshot, after: Snapshot) -> None:
    lines = render("folded", Profile.between(before, after)).decode().splitlines()
    assert lines[0] == (
        "offcpu_workload;__libc_start_main;main;offcpu_sleep_ms;entry_SYSCALL_64_after_hwframe;"
        "do_syscall_64;__x64_sys_nanosleep;hrtimer_nanosleep;do_nanosleep;schedule;__schedule;"
        "finish_task_switch.isra.0 1500000"
    )
    assert all(line.count(" ") >= 1 and line.rsplit(" ", 1)[1].isdigit() for line in lines)


def test_frames_with_semicolons_do_not_split(before: Snapshot) -> None:
    # The LOCK stack has a user frame "worker;with;semicolons".
    text = render("folded", Profile.since_start(before)).decode()
    line = next(line for line in text.splitlines() if "offcpu_lock_wait" in line)
    assert "worker:with:semicolons" in line
    assert line.split(";")[0] == "other<script>"


def test_rows_folding_to_one_line_are_merged(after: Snapshot) -> None:
    from dataclasses import replace

    # Same stack and process, two threads: one line with the sum.
    sleep = after.samples[0]
    twin = replace(sleep, tid=9999, thread_name="twin", increase=sleep.increase)
    snap = replace(after, samples=(*after.samples, twin))
    lines = dict(
        (";".join(f), v) for f, v in folded_format.parse(render("folded", Profile.since_previous(snap)).decode())
    )
    key = next(k for k in lines if k.startswith("offcpu_workload;") and "offcpu_sleep_ms" in k)
    assert lines[key] == 3_000_000


@given(st.lists(st.integers(min_value=0, max_value=10**13), max_size=60))
def test_apportion_keeps_the_rounded_sum(values: list[int]) -> None:
    rounded = folded_format.apportion(values)
    assert sum(rounded) == (sum(values) + 500) // 1000
    assert all(abs(r * 1000 - v) < 1000 for r, v in zip(rounded, values, strict=True))


def _waker_profile() -> Profile:
    def frames(*names: str, kind: FrameKind = FrameKind.NATIVE) -> tuple[Frame, ...]:
        return tuple(Frame(n, kind) for n in names)

    info = ProcessInfo(ProcessKey(7, 1), "app")
    blocked = Stack(frames("read", "main"), frames("schedule", "pipe_read", kind=FrameKind.KERNEL))
    writer = Waker(WakerKind.TASK, 7, 8, "writer", frames("write", "writer_write", "start_thread"),
                   frames("try_to_wake_up", "pipe_write", kind=FrameKind.KERNEL))
    timer = Waker(WakerKind.TIMER, 0, 0, "", (), frames("try_to_wake_up", "hrtimer_wakeup", kind=FrameKind.KERNEL))
    samples = (
        ProfileSample(info, 7, "", Reason.SLEEPING, blocked, Counter(3, 3_000_000), writer),
        ProfileSample(info, 7, "", Reason.SLEEPING, blocked, Counter(1, 1_000_000), timer),
        ProfileSample(info, 7, "", Reason.RUNNABLE, blocked, Counter(1, 500_000), None),
    )
    return Profile(0, 10, samples)


def test_waker_rows_are_in_offwaketimes_layout() -> None:
    lines = dict(folded_format.lines(_waker_profile()))
    assert lines == {
        # Blocked stack root first, "--", the waker's stack leaf first (kernel, then user), its comm.
        "app;main;read;pipe_read;schedule;--;try_to_wake_up;pipe_write;write;writer_write;start_thread;writer": 3000,
        # A wake-up from interrupt context: its kernel path and a marker, no task.
        "app;main;read;pipe_read;schedule;--;try_to_wake_up;hrtimer_wakeup;[timer]": 1000,
        # No waker (a preemption): today's layout.
        "app;main;read;pipe_read;schedule": 500,
    }
