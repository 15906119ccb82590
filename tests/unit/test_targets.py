from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from offcpu_exporter import targets
from offcpu_exporter.targets import Exec, ProcessTable, Replaced, TargetRules, parse_stat


def _proc(root: Path, pid: int, comm: str, start: int, tgid: int | None = None) -> None:
    d = root / str(pid)
    d.mkdir(exist_ok=True)
    (d / "stat").write_text(f"{pid} ({comm}) S 1 " + " ".join(["0"] * 17) + f" {start} 0 0\n")
    (d / "status").write_text(f"Tgid:\t{tgid or pid}\n")


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The pids the table reads from /proc from now on."""
    reads: list[int] = []
    real = targets.read_process

    def counted(pid: int, *args: Any, **kwargs: Any) -> Any:
        reads.append(pid)
        return real(pid, *args, **kwargs)

    monkeypatch.setattr(targets, "read_process", counted)
    return reads


def test_parse_stat_with_hostile_comm() -> None:
    assert parse_stat("7 (a) b (c)) S 1 " + "0 " * 17 + "99 0") == ("a) b (c)", 1, 99)


def test_pid_reuse_is_not_the_old_process(tmp_path: Path) -> None:
    _proc(tmp_path, 10, "app", 100)
    table = ProcessTable(TargetRules(pids=(10,)), proc_root=str(tmp_path))
    assert table.start() == []
    assert table.watched_pids() == {10}
    # The process exits and an unrelated one gets pid 10.
    _proc(tmp_path, 10, "other", 555)
    added, exited = table.refresh(now=0.0)
    assert [p.key.start_ticks for p in exited] == [100]
    assert added == []  # --pid 10 meant the process that started at tick 100
    assert table.watched_pids() == set()
    latest = table.latest(10)
    assert latest is not None and latest.key.start_ticks == 100  # its last counts are still its own
    assert table.expire(60, now=30.0) == []
    assert [p.comm for p in table.expire(60, now=61.0)] == ["app"]


def test_comm_rule_picks_up_new_processes_and_excludes_self(tmp_path: Path) -> None:
    _proc(tmp_path, 5, "worker", 1)
    _proc(tmp_path, 6, "worker", 1)
    _proc(tmp_path, 7, "shell", 1)
    table = ProcessTable(TargetRules(comm=re.compile("^work")), proc_root=str(tmp_path), exclude=(6,))
    added, _ = table.refresh()
    assert [p.pid for p in added] == [5]
    _proc(tmp_path, 8, "worker", 2)
    added, _ = table.refresh()
    assert [p.pid for p in added] == [8]


def test_unknown_pid_and_thread_ids_are_reported(tmp_path: Path) -> None:
    _proc(tmp_path, 20, "app", 1, tgid=19)  # a thread of 19, not a process
    table = ProcessTable(TargetRules(pids=(20, 21)), proc_root=str(tmp_path))
    problems = table.start()
    assert len(problems) == 2 and "pid 21 does not exist" in problems[1]


def _exe(root: Path, pid: int, target: str) -> None:
    link = root / str(pid) / "exe"
    link.unlink(missing_ok=True)
    link.symlink_to(target)


def test_exec_is_reported_once_and_a_deleted_binary_is_not_an_exec(tmp_path: Path) -> None:
    _proc(tmp_path, 10, "launcher", 100)
    _exe(tmp_path, 10, "/opt/app/launcher")
    table = ProcessTable(TargetRules(pids=(10,)), proc_root=str(tmp_path))
    assert table.start() == []
    _exe(tmp_path, 10, "/opt/app/launcher (deleted)")  # upgraded on disk while running
    table.refresh(now=0.0)
    assert table.take_events() == []
    _proc(tmp_path, 10, "server", 100)  # execve: same pid and start time, new program
    _exe(tmp_path, 10, "/opt/app/server")
    assert table.refresh(now=1.0) == ([], [])
    (event,) = table.take_events()
    assert isinstance(event, Exec)
    info = event.info
    assert (info.comm, info.exe, info.key.start_ticks) == ("server", "/opt/app/server", 100)
    assert table.info(10) == info and table.watched_pids() == {10}
    table.refresh(now=2.0)
    assert table.take_events() == []


def test_a_reused_pid_is_reported_with_the_process_that_held_it(tmp_path: Path) -> None:
    _proc(tmp_path, 10, "worker", 100)
    table = ProcessTable(TargetRules(comm=re.compile("^worker$")), proc_root=str(tmp_path))
    table.refresh(now=0.0)
    _proc(tmp_path, 10, "worker", 555)  # it exited; a new worker has its pid
    table.refresh(now=1.0)  # the old one's exit is seen
    table.refresh(now=2.0)  # the new one is found
    events = table.take_events()
    assert [type(e) for e in events] == [Replaced]
    replaced = events[0]
    assert isinstance(replaced, Replaced)
    assert (replaced.old.start_ticks, replaced.new.key.start_ticks) == (100, 555)
    assert table.take_events() == []


def test_between_rescans_only_the_processes_the_kernel_reported_are_read(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Work proportional to what changed (issue 27): a refresh with the kernel's process events reads
    those processes and no other, and still sees starts, exits, renames and reused pids."""
    for pid in range(100, 300):
        _proc(tmp_path, pid, "idle", 1)
    _proc(tmp_path, 5, "worker", 1)
    table = ProcessTable(TargetRules(comm=re.compile("^work")), proc_root=str(tmp_path))
    added, _ = table.refresh()  # the first: a rescan
    assert [p.pid for p in added] == [5]
    reads = _count_reads(monkeypatch)

    assert table.refresh(changed=set()) == ([], [])
    assert reads == []

    _proc(tmp_path, 8, "worker", 2)  # started
    _proc(tmp_path, 150, "worker", 1)  # renamed
    _proc(tmp_path, 9, "worker", 3)  # started, but not reported (yet)
    added, _ = table.refresh(changed={8, 150})
    assert sorted(p.pid for p in added) == [8, 150]
    assert sorted(reads) == [8, 150]

    reads.clear()
    (tmp_path / "8" / "stat").unlink()  # exited
    _proc(tmp_path, 5, "worker", 7)  # exited, and its pid taken by a new process
    added, exited = table.refresh(now=0.0, changed={8, 5})
    assert sorted(p.pid for p in exited) == [5, 8]
    assert [(p.pid, p.key.start_ticks) for p in added] == [(5, 7)]
    assert set(reads) == {5, 8}

    added, _ = table.refresh()  # the periodic rescan finds what was not reported
    assert [p.pid for p in added] == [9]


def test_a_reported_exit_retires_a_process_its_parent_has_not_reaped(tmp_path: Path) -> None:
    """The kernel reports the exit before the parent reaps the zombie, and nothing after: a zombie
    is gone (else it stays watched until the next rescan, and its series never age out)."""
    _proc(tmp_path, 5, "worker", 1)
    table = ProcessTable(TargetRules(comm=re.compile("^work")), proc_root=str(tmp_path))
    table.refresh()
    stat = tmp_path / "5" / "stat"
    stat.write_text(stat.read_text().replace(") S ", ") Z "))
    _, exited = table.refresh(now=0.0, changed={5})
    assert [p.pid for p in exited] == [5]


def test_a_process_reported_exiting_while_it_still_looked_alive_is_looked_at_until_it_is_gone(
        tmp_path: Path) -> None:
    """sched_process_exit fires early in do_exit(): a refresh in between sees the process running
    (or in disk sleep closing its files), and the kernel reports nothing more. It is read again at
    every refresh, without an event, until it is a zombie."""
    _proc(tmp_path, 5, "worker", 1)
    _proc(tmp_path, 6, "worker", 2)
    table = ProcessTable(TargetRules(comm=re.compile("^work")), proc_root=str(tmp_path))
    table.refresh()
    assert table.refresh(now=0.0, changed={5, 6}, exiting={5}) == ([], [])  # still exiting
    assert table.refresh(now=1.0, changed=set()) == ([], [])
    stat = tmp_path / "5" / "stat"
    stat.write_text(stat.read_text().replace(") S ", ") Z "))
    _, exited = table.refresh(now=2.0, changed=set())
    assert [p.pid for p in exited] == [5]
    assert table.watched_pids() == {6}  # 6 was reported (a rename) but not exiting: not re-read


def test_a_process_reported_exiting_that_lives_on_is_let_go(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A non-leader thread's execve() ends the group leader (the kernel reports its exit) and the
    process lives on under its pid: it is read again only for EXITING_RECHECK_SECONDS."""
    _proc(tmp_path, 5, "worker", 1)
    table = ProcessTable(TargetRules(comm=re.compile("^work")), proc_root=str(tmp_path))
    table.refresh()
    table.refresh(now=0.0, changed={5}, exiting={5})
    reads = _count_reads(monkeypatch)
    table.refresh(now=targets.EXITING_RECHECK_SECONDS - 1, changed=set())
    assert reads == [5]
    table.refresh(now=targets.EXITING_RECHECK_SECONDS, changed=set())
    table.refresh(now=targets.EXITING_RECHECK_SECONDS + 1, changed=set())
    assert reads == [5, 5]
    assert table.watched_pids() == {5}


def test_changed_since_names_the_pids_added_exited_and_forgotten_after_a_version(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for pid in (5, 6, 7):
        _proc(tmp_path, pid, "worker", 1)
    table = ProcessTable(TargetRules(comm=re.compile("^work")), proc_root=str(tmp_path))
    assert table.changed_since(-1) is None  # from nothing: anything may have changed
    table.refresh(now=0.0)
    assert table.changed_since(0) == {5, 6, 7} and table.watched(5) and not table.watched(99)
    seen = table.version
    assert table.changed_since(seen) == set()
    (tmp_path / "6" / "stat").unlink()
    _proc(tmp_path, 8, "worker", 1)
    table.refresh(changed=[6, 8], now=1.0)
    assert table.changed_since(seen) == {6, 8} and not table.watched(6)
    seen = table.version
    table.expire(60, now=100.0)
    assert table.changed_since(seen) == {6}
    monkeypatch.setattr(targets, "_CHANGES_KEPT", 2)
    short = ProcessTable(TargetRules(comm=re.compile("^work")), proc_root=str(tmp_path))
    short.refresh(now=0.0)
    assert short.changed_since(0) is None  # further back than its log goes
    assert short.changed_since(short.version - 1) is not None
