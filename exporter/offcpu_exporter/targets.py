"""Which processes to watch: found in /proc, kept current as processes start and exit.

A process is identified by (pid, start time) so that a PID reused by an unrelated process is never
taken for the old one. The kernel side removes an exiting group leader from its filter map at
once (sched_process_exit); this module re-adds nothing that is not a current match.
"""

from __future__ import annotations

import collections
import logging
import os
import re
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field, replace

from offcpu_exporter.k8s.cgroup import ContainerIdentity, identify
from offcpu_exporter.k8s.metadata import PodMetadata
from offcpu_exporter.k8s.selection import WorkloadSelector
from offcpu_exporter.procstat import parse_stat
from offcpu_exporter.snapshot import ProcessInfo, ProcessKey

__all__ = ["Exec", "ProcessEvent", "ProcessTable", "Replaced", "TargetRules", "kubernetes_enricher",
           "kubernetes_predicate", "parse_stat", "read_process"]

log = logging.getLogger(__name__)
_TICKS = os.sysconf("SC_CLK_TCK")
# How long a process the kernel reported exiting is looked at again while it still looks alive.
EXITING_RECHECK_SECONDS = 10.0


@dataclass(frozen=True)
class TargetRules:
    pids: tuple[int, ...] = ()
    comm: re.Pattern[str] | None = None
    cmdline: re.Pattern[str] | None = None
    watch_all: bool = False
    follow_children: bool = False
    # Extra predicate over a process (e.g. Kubernetes namespace/pod/container selection).
    predicate: Callable[[ProcessInfo], bool] | None = field(default=None, compare=False)

    @property
    def scans(self) -> bool:
        """Whether matching needs a /proc scan (rules other than fixed pids)."""
        return self.comm is not None or self.cmdline is not None or self.predicate is not None

    def describe(self) -> str:
        parts = [f"pid={p}" for p in self.pids]
        if self.comm is not None:
            parts.append(f"comm=~{self.comm.pattern}")
        if self.cmdline is not None:
            parts.append(f"cmdline=~{self.cmdline.pattern}")
        if self.watch_all:
            parts.append("all")
        return ", ".join(parts) or "nothing"


def read_process(pid: int, proc_root: str = "/proc", *, with_cmdline: bool = False) -> ProcessInfo | None:
    """The process's identity now, or None if it does not exist (or is not a process but a thread,
    or has exited)."""
    base = f"{proc_root}/{pid}"
    try:
        with open(f"{base}/stat", encoding="utf-8", errors="replace") as f:
            text = f.read()
        comm, _, start = parse_stat(text)
    except (OSError, ValueError, IndexError):
        return None
    if text[text.rfind(")") + 2 :][:1] in ("Z", "X"):
        # Exited, not yet reaped by its parent. The kernel reports the exit before the reaping and
        # nothing after it: taken for alive, it would stay watched until the next rescan.
        return None
    try:
        exe = os.readlink(f"{base}/exe")
    except OSError:
        exe = ""  # kernel threads, or no ptrace access
    cmdline: tuple[str, ...] = ()
    if with_cmdline:
        try:
            with open(f"{base}/cmdline", "rb") as f:
                raw = f.read()
            cmdline = tuple(a.decode(errors="replace") for a in raw.split(b"\0") if a)
        except OSError:
            pass
    return ProcessInfo(key=ProcessKey(pid, start), comm=comm, exe=exe, cmdline=cmdline)


def _program(exe: str) -> str:
    # A running program whose file was deleted or replaced (a package upgrade) reads
    # "/usr/sbin/nginx (deleted)": the same program, not an exec.
    return exe.removesuffix(" (deleted)")


def _is_thread_group_leader(pid: int, proc_root: str) -> bool:
    # /proc/TID exists for threads too (hidden from listings); Tgid tells them apart.
    try:
        with open(f"{proc_root}/{pid}/status", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("Tgid:"):
                    return int(line.split()[1]) == pid
    except (OSError, ValueError):
        return False
    return False


@dataclass(slots=True)  # one per process
class _Entry:
    info: ProcessInfo
    watched: bool  # in the kernel filter (False: known only for attribution, e.g. --all)
    exited_at: float | None = None


@dataclass(frozen=True)
class Exec:
    """A watched process ran execve(): same identity, another program (other maps, other names)."""

    info: ProcessInfo  # as it is now


@dataclass(frozen=True)
class Replaced:
    """A new process holds the pid of one that exited (and is still known)."""

    old: ProcessKey
    new: ProcessInfo


ProcessEvent = Exec | Replaced


_CHANGES_KEPT = 1 << 16  # changes logged for changed_since() (a consumer further behind: a full pass)


class ProcessTable:
    """The processes the exporter knows: watched targets, and (with --all or followed children)
    processes first seen in the kernel's counters. Keeps exited ones for a grace period so their
    last counts are attributed correctly."""

    def __init__(self, rules: TargetRules, *, proc_root: str = "/proc", exclude: Iterable[int] = (),
                 enrich: Callable[[ProcessInfo], ProcessInfo] | None = None) -> None:
        self.rules = rules
        self.proc_root = proc_root
        self.exclude = frozenset(exclude) | {0}
        self.enrich = enrich or (lambda info: info)
        self._enriches = enrich is not None
        self._by_pid: dict[int, _Entry] = {}  # live processes
        # Live processes enrich() may still say more of (_unsettled): looked at again at every
        # refresh. Kept as a set rather than found by testing every process at every refresh,
        # which at 10,000 processes was a clock read each, once a second.
        self._settling: set[int] = set()
        # Processes the kernel reported exiting that still looked alive: sched_process_exit fires
        # in do_exit() before exit_mm(), exit_files() and exit_notify() (kernel/exit.c), so /proc
        # shows the process running or in disk sleep, not yet a zombie, for as long as those take.
        # Nothing is reported after: each is looked at again at every refresh until it is gone (or
        # EXITING_RECHECK_SECONDS passed: a non-leader thread's exec also ends the leader).
        self._exiting: dict[int, float] = {}  # pid -> when to stop looking
        # Changes whenever a process is added, exits, exec's or is forgotten: what is derived from
        # the whole table (the pipeline's per-process preparation) is redone only then, and only
        # for the pids changed since (changed_since()), found in a bounded log of the changes.
        self.version = 0
        self._changes: collections.deque[tuple[int, int]] = collections.deque(maxlen=_CHANGES_KEPT)
        self._exited: dict[ProcessKey, _Entry] = {}  # exited, kept for the grace period
        self._last_exited: dict[int, ProcessKey] = {}  # pid -> the most recent exited holder
        self._pinned: dict[int, ProcessKey | None] = {}  # --pid: the identity asked for
        self._events: list[ProcessEvent] = []  # since take_events()
        self.problems: dict[str, int] = {}

    # -- what is watched -------------------------------------------------------------------

    def start(self) -> list[str]:
        """Resolve --pid targets once at start; returns a message per pid that does not exist."""
        errors = []
        for pid in self.rules.pids:
            info = read_process(pid, self.proc_root, with_cmdline=self._wants_cmdline)
            if info is None or not _is_thread_group_leader(pid, self.proc_root):
                errors.append(f"pid {pid} does not exist (or is a thread, not a process)")
                self._pinned[pid] = None
                continue
            self._pinned[pid] = info.key
            self._add(self.enrich(info), watched=True)
        return errors

    @property
    def _wants_cmdline(self) -> bool:
        return self.rules.cmdline is not None

    def _matches(self, info: ProcessInfo) -> bool:
        if info.pid in self.exclude:
            return False
        pinned = self._pinned.get(info.pid)
        if pinned is not None and pinned == info.key:
            return True
        r = self.rules
        selected = (
            (r.comm is not None and r.comm.search(info.comm) is not None)
            or (r.cmdline is not None and r.cmdline.search(" ".join(info.cmdline)) is not None)
            or (r.comm is None and r.cmdline is None and r.predicate is not None)
        )
        return selected and (r.predicate is None or r.predicate(info))

    def refresh(self, now: float | None = None, *, changed: Collection[int] | None = None,
                exiting: Collection[int] = ()) -> tuple[list[ProcessInfo], list[ProcessInfo]]:
        """Bring the table up to date: (newly watched, newly exited). `changed`: the only pids that
        may have started, exec'd, exited or been renamed since the last refresh (the kernel reports
        them: probe.take_process_events()), so only those are read; None: rescan /proc. `exiting`:
        those of them the kernel reported exiting."""
        now = time.monotonic() if now is None else now
        added: list[ProcessInfo] = []
        exited: list[ProcessInfo] = []
        if changed is None:
            for pid in list(self._by_pid):
                self._recheck(pid, now, exited)
            candidates: Iterable[int] = (int(name) for name in os.listdir(self.proc_root) if name.isdigit()) \
                if self.rules.scans else ()
        else:
            for pid in changed:
                if pid in self._by_pid:
                    self._recheck(pid, now, exited)
            self._recheck_exiting(exiting, now, exited)
            candidates = changed if self.rules.scans else ()
            # Pod names arrive once the pod list has caught up with a new pod, and a process seen
            # while its runtime was still moving it into the container's cgroup gets its container.
            for pid in list(self._settling):
                if pid in self._by_pid:
                    self._by_pid[pid].info = self.enrich(self._by_pid[pid].info)
                self._track(pid)
        for pid in candidates:
            if pid not in self._by_pid:
                self._consider(pid, added)
        return added, exited

    def _recheck_exiting(self, reported: Collection[int], now: float, exited: list[ProcessInfo]) -> None:
        for pid in reported:
            if pid in self._by_pid:
                self._exiting.setdefault(pid, now + EXITING_RECHECK_SECONDS)
        for pid, until in list(self._exiting.items()):
            if pid in self._by_pid and pid not in reported:
                self._recheck(pid, now, exited)
            if now >= until:
                del self._exiting[pid]  # (_retire() drops those that are gone)

    def _recheck(self, pid: int, now: float, exited: list[ProcessInfo]) -> None:
        """Whether a known process still lives, as the same program."""
        entry = self._by_pid[pid]
        current = read_process(pid, self.proc_root)
        if current is None or current.key != entry.info.key:
            exited.append(self._retire(pid, now))
            if pid in self._pinned:
                log.warning("target pid %d exited", pid)
        elif _program(current.exe) != _program(entry.info.exe) and current.exe and entry.info.exe:
            # Same process (pid and start time survive execve), new program: new maps and
            # names. The rules that matched it are not asked again (as for followed children).
            cmdline = read_process(pid, self.proc_root, with_cmdline=True) if self._wants_cmdline else None
            entry.info = replace(
                entry.info, comm=current.comm, exe=current.exe, cmdline=cmdline.cmdline if cmdline else ()
            )
            self._events.append(Exec(entry.info))
            self._track(pid)
            self._changed(pid)
        elif not entry.info.pod:
            # (offcpu_exporter/k8s; cheap when nothing changed)
            entry.info = self.enrich(entry.info)
            self._track(pid)

    def _consider(self, pid: int, added: list[ProcessInfo]) -> None:
        """A process not in the table: watched from now on if the rules select it."""
        info = read_process(pid, self.proc_root, with_cmdline=self._wants_cmdline)
        if info is None:
            return
        info = self.enrich(info)
        if self._matches(info):
            self._add(info, watched=True)
            added.append(info)
            self._note_reuse(info)

    def _add(self, info: ProcessInfo, *, watched: bool) -> None:
        self._by_pid[info.pid] = _Entry(info, watched=watched)
        self._track(info.pid)
        self._changed(info.pid)

    def _track(self, pid: int) -> None:
        """Keeps `pid` in the settling set exactly while its process is live and unsettled."""
        entry = self._by_pid.get(pid)
        if entry is not None and self._unsettled(entry.info):
            self._settling.add(pid)
        else:
            self._settling.discard(pid)

    def _unsettled(self, info: ProcessInfo) -> bool:
        """Whether enrich() may still add to what it said of this process (see SETTLE_SECONDS)."""
        if not self._enriches or info.pod:
            return False
        if info.container_id:
            return True  # its pod's names are not listed yet
        return time.clock_gettime(time.CLOCK_BOOTTIME) - info.key.start_ticks / _TICKS < SETTLE_SECONDS

    def take_events(self) -> list[ProcessEvent]:
        """What happened to known processes since the last call (one consumer: the pipeline)."""
        events, self._events = self._events, []
        return events

    def _note_reuse(self, info: ProcessInfo) -> None:
        old = self._last_exited.get(info.pid)
        if old is not None and old != info.key and old in self._exited:
            self._events.append(Replaced(old, info))

    def _retire(self, pid: int, now: float) -> ProcessInfo:
        entry = self._by_pid.pop(pid)
        self._settling.discard(pid)
        self._exiting.pop(pid, None)
        self._changed(pid)
        entry.exited_at = now
        entry.info = replace(entry.info, exited=True)
        self._exited[entry.info.key] = entry
        self._last_exited[pid] = entry.info.key
        return entry.info

    def adopt(self, pid: int, *, parent: int | None = None, comm: str = "", boot_ns: int = 0,
              now: float | None = None) -> ProcessInfo:
        """A tgid seen in the kernel counters that is not in the table (--all, followed children):
        identify it from /proc, or, if it already exited, from what the kernel recorded at fork."""
        entry = self._by_pid.get(pid)
        if entry is not None:
            return entry.info
        recent = self.latest(pid)
        if recent is not None:
            # Counted before it exited; the kernel stopped watching the pid at its exit.
            return recent
        now = time.monotonic() if now is None else now
        info = read_process(pid, self.proc_root, with_cmdline=self._wants_cmdline)
        if info is None or not _is_thread_group_leader(pid, self.proc_root):
            ticks = boot_ns * os.sysconf("SC_CLK_TCK") // 1_000_000_000 if boot_ns else 0
            key = ProcessKey(pid, ticks)
            if key in self._exited:
                return self._exited[key].info
            parent_entry = self._by_pid.get(parent) if parent else None
            exe = parent_entry.info.exe if parent_entry else ""
            info = ProcessInfo(key=key, comm=comm or "[exited]", exe=exe, exited=True)
            self._exited[key] = _Entry(info, watched=False, exited_at=now)
            self._last_exited[pid] = key
            return info
        info = self.enrich(info)
        # With --all every live process the kernel counted is a target; else only followed children.
        watched = self.rules.watch_all or (self.rules.follow_children and parent is not None)
        self._add(info, watched=watched)
        return info

    def info(self, pid: int) -> ProcessInfo | None:
        """The live process with this pid."""
        entry = self._by_pid.get(pid)
        return entry.info if entry else None

    def latest(self, pid: int) -> ProcessInfo | None:
        """The live process with this pid, else the last one that held it and exited."""
        entry = self._by_pid.get(pid)
        if entry is not None:
            return entry.info
        key = self._last_exited.get(pid)
        old = self._exited.get(key) if key is not None else None
        return old.info if old else None

    def info_of(self, key: ProcessKey) -> ProcessInfo | None:
        entry = self._by_pid.get(key.pid)
        # (The same object nearly always: compared by identity first, as a dict lookup does.)
        if entry is not None and (entry.info.key is key or entry.info.key == key):
            return entry.info
        old = self._exited.get(key)
        return old.info if old else None

    def watched_pids(self) -> set[int]:
        return {pid for pid, e in self._by_pid.items() if e.watched}

    def live(self) -> list[ProcessInfo]:
        return [e.info for e in self._by_pid.values()]

    def expire(self, grace_seconds: float, now: float | None = None,
               keep: Collection[ProcessKey] = ()) -> list[ProcessInfo]:
        """Forget processes that exited more than `grace_seconds` ago, but those in `keep`; returns them."""
        now = time.monotonic() if now is None else now
        gone = [e for e in self._exited.values()
                if e.exited_at is not None and now - e.exited_at >= grace_seconds and e.info.key not in keep]
        for entry in gone:
            del self._exited[entry.info.key]
            if self._last_exited.get(entry.info.pid) == entry.info.key:
                del self._last_exited[entry.info.pid]
            self._changed(entry.info.pid)
        return [e.info for e in gone]

    def _changed(self, pid: int) -> None:
        self.version += 1
        self._changes.append((self.version, pid))

    def changed_since(self, version: int) -> set[int] | None:
        """The pids whose processes were added, exec'd, exited or forgotten after `version` (a
        value of `self.version`); None when that is further back than the log goes (or < 0): then
        anything may have changed."""
        if version == self.version:
            return set()
        changes = self._changes
        if version < 0 or not changes or changes[0][0] > version + 1:
            return None
        pids = set()
        for at, pid in reversed(changes):
            if at <= version:
                break
            pids.add(pid)
        return pids

    def watched(self, pid: int) -> bool:
        """Whether the live process with this pid is watched."""
        entry = self._by_pid.get(pid)
        return entry is not None and entry.watched

    def __len__(self) -> int:
        return len(self.watched_pids())


# -- Kubernetes identity (offcpu_exporter/k8s): fills ProcessInfo's container and pod fields ---------------


# A container runtime forks the container's first process and moves it into the container's cgroup
# a few milliseconds later (runc: `runc init` waits until its parent has applied the cgroup): a process
# younger than this that is not in a container yet is looked at again.
SETTLE_SECONDS = 5.0


def kubernetes_enricher(metadata: PodMetadata, proc_root: str = "/proc", cache_size: int = 65536,
                        since_boot: Callable[[], float] | None = None) -> Callable[[ProcessInfo], ProcessInfo]:
    """ProcessTable's `enrich`: container id and pod UID from /proc/PID/cgroup (read once per process
    identity, since every scan passes every unmatched process through here), names from the API."""
    identities: dict[ProcessKey, ContainerIdentity] = {}
    ticks = os.sysconf("SC_CLK_TCK")
    boot_clock = since_boot or (lambda: time.clock_gettime(time.CLOCK_BOOTTIME))

    def enrich(info: ProcessInfo) -> ProcessInfo:
        identity = identities.get(info.key)
        if identity is None:
            identity = identify(info.pid, proc_root)
            settled = identity or boot_clock() - info.key.start_ticks / ticks >= SETTLE_SECONDS
            if settled:
                if len(identities) >= cache_size:
                    identities.clear()
                identities[info.key] = identity
        if not identity:
            return info
        names = metadata.lookup(identity.container_id, identity.pod_uid)
        return replace(info, container_id=identity.container_id, pod_uid=identity.pod_uid,
                       namespace=names.namespace, pod=names.pod, container=names.container)

    return enrich


def kubernetes_predicate(selector: WorkloadSelector) -> Callable[[ProcessInfo], bool] | None:
    """TargetRules' `predicate` for --namespace/--pod-label/--container (None when none was given)."""
    if not selector.active:
        return None
    return lambda info: selector.matches(ContainerIdentity(info.container_id, info.pod_uid))
