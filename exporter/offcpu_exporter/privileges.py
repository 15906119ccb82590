"""Least privilege for `serve --drop-privileges`: once the probe is attached, keep only the
capabilities the running exporter still uses, and set no_new_privs.

What the running exporter still does, and what each needs (see SECURITY.md):
- reads and writes its BPF maps through fds it already holds: no capability on kernels since 6.5,
  where the unprivileged_bpf_disabled check moved from the bpf() entry into map/prog creation
  (https://git.kernel.org/torvalds/c/c8644cd0efe7); before that every bpf() call needs CAP_BPF
  (CAP_SYS_ADMIN before 5.8) while kernel.unprivileged_bpf_disabled is set;
- reads /proc/PID/maps, /proc/PID/exe and files under /proc/PID/root of other users' processes:
  ptrace read access (CAP_SYS_PTRACE) and path lookup in directories it may not search
  (CAP_DAC_READ_SEARCH);
- opens /proc/PID/map_files/* (the very file mapped, also when deleted): CAP_CHECKPOINT_RESTORE
  since 5.9, CAP_SYS_ADMIN before (proc_map_files_get_link);
- re-reads /proc/kallsyms when modules change: real addresses need CAP_SYSLOG
  (kallsyms_show_value), except with kptr_restrict=0 and perf_event_paranoid<=1;
- binds a port below 1024 (only if asked to listen there): CAP_NET_BIND_SERVICE.

capset(2) and PR_CAPBSET_DROP change only the calling thread, and threads inherit their creator's
sets: the drop runs on the main thread before any other thread is started (the Kubernetes
metadata watch, the web server, the pipeline and the outputs start after it), so every thread of
the exporter runs with the reduced sets. `drop_capabilities` refuses to run beside another thread,
which would keep every capability it started with.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from offcpu_exporter.probe.facts import current_capabilities, kernel_version

__all__ = [
    "CAP_BPF",
    "CAP_NAMES",
    "CAP_PERFMON",
    "CAP_SYS_ADMIN",
    "PrivilegeError",
    "drop_capabilities",
    "kept_after_attach",
    "other_threads",
]

log = logging.getLogger(__name__)

# Capability bits (linux/capability.h).
CAP_DAC_READ_SEARCH = 2
CAP_SETPCAP = 8
CAP_NET_BIND_SERVICE = 10
CAP_SYS_PTRACE = 19
CAP_SYS_ADMIN = 21
CAP_SYSLOG = 34
CAP_PERFMON = 38
CAP_BPF = 39
CAP_CHECKPOINT_RESTORE = 40

CAP_NAMES = {
    0: "CAP_CHOWN", 1: "CAP_DAC_OVERRIDE", 2: "CAP_DAC_READ_SEARCH", 3: "CAP_FOWNER", 4: "CAP_FSETID",
    5: "CAP_KILL", 6: "CAP_SETGID", 7: "CAP_SETUID", 8: "CAP_SETPCAP", 9: "CAP_LINUX_IMMUTABLE",
    10: "CAP_NET_BIND_SERVICE", 11: "CAP_NET_BROADCAST", 12: "CAP_NET_ADMIN", 13: "CAP_NET_RAW",
    14: "CAP_IPC_LOCK", 15: "CAP_IPC_OWNER", 16: "CAP_SYS_MODULE", 17: "CAP_SYS_RAWIO", 18: "CAP_SYS_CHROOT",
    19: "CAP_SYS_PTRACE", 20: "CAP_SYS_PACCT", 21: "CAP_SYS_ADMIN", 22: "CAP_SYS_BOOT", 23: "CAP_SYS_NICE",
    24: "CAP_SYS_RESOURCE", 25: "CAP_SYS_TIME", 26: "CAP_SYS_TTY_CONFIG", 27: "CAP_MKNOD", 28: "CAP_LEASE",
    29: "CAP_AUDIT_WRITE", 30: "CAP_AUDIT_CONTROL", 31: "CAP_SETFCAP", 32: "CAP_MAC_OVERRIDE",
    33: "CAP_MAC_ADMIN", 34: "CAP_SYSLOG", 35: "CAP_WAKE_ALARM", 36: "CAP_BLOCK_SUSPEND",
    37: "CAP_AUDIT_READ", 38: "CAP_PERFMON", 39: "CAP_BPF", 40: "CAP_CHECKPOINT_RESTORE",
}

_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4


class PrivilegeError(Exception):
    """Dropping capabilities failed; the message says which step."""


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


@dataclass(frozen=True)
class Kept:
    capability: int
    why: str

    @property
    def name(self) -> str:
        return CAP_NAMES.get(self.capability, str(self.capability))


def _sysctl(path: str, default: int) -> int:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return default


def kept_after_attach(listen_port: int | None = None, release: tuple[int, int] | None = None,
                      proc_sys: str = "/proc/sys") -> list[Kept]:
    """The capabilities the attached exporter still needs on this kernel (`release`: its (major,
    minor), the running one's by default), each with its reason."""
    release = release or kernel_version()
    kept = [
        Kept(CAP_SYS_PTRACE, "read /proc/PID/maps and /proc/PID/exe of other users' processes"),
        Kept(CAP_DAC_READ_SEARCH, "open mapped files under /proc/PID/root and /proc/PID/map_files"),
    ]
    if release >= (5, 9):
        kept.append(Kept(CAP_CHECKPOINT_RESTORE, "open /proc/PID/map_files entries (deleted or replaced files)"))
    else:
        kept.append(Kept(CAP_SYS_ADMIN, "open /proc/PID/map_files entries (before 5.9 only CAP_SYS_ADMIN may)"))
    if _sysctl(f"{proc_sys}/kernel/kptr_restrict", 1) != 0 or _sysctl(
            f"{proc_sys}/kernel/perf_event_paranoid", 2) > 1:
        kept.append(Kept(CAP_SYSLOG, "re-read /proc/kallsyms addresses when kernel modules change"))
    if release < (6, 5) and _sysctl(f"{proc_sys}/kernel/unprivileged_bpf_disabled", 1) != 0:
        bit = CAP_BPF if release >= (5, 8) else CAP_SYS_ADMIN
        kept.append(Kept(bit, "bpf() on already-open map fds (before 6.5 checked at every call)"))
    if listen_port is not None and 0 < listen_port < 1024:
        kept.append(Kept(CAP_NET_BIND_SERVICE, f"bind the web server to port {listen_port} (below 1024)"))
    return kept


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise PrivilegeError(f"{what} failed: {os.strerror(err)}")


def other_threads(task_dir: str = "/proc/self/task") -> list[str]:
    """The process's threads other than the calling one, each as `TID (name)`."""
    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    me = threading.get_native_id()
    found = []
    for entry in sorted(os.listdir(task_dir), key=int):
        tid = int(entry)
        if tid == me:
            continue
        name = names.get(tid)
        if name is None:
            try:
                with open(f"{task_dir}/{entry}/comm") as f:
                    name = f.read().strip()
            except OSError:  # it exited meanwhile
                continue
        found.append(f"{tid} ({name})")
    return found


def drop_capabilities(keep: Iterable[int]) -> frozenset[int]:
    """Reduce this thread's effective, permitted and bounding sets to `keep` (those of them it
    has), clear the inheritable and ambient sets, and set no_new_privs. Returns the effective set.

    Raises PrivilegeError when another thread runs: it would keep its capabilities."""
    others = other_threads()
    if others:
        raise PrivilegeError("threads started before the drop would keep every capability: " + ", ".join(others))
    libc = _libc()
    have = current_capabilities("CapPrm")
    wanted = frozenset(keep) & have
    # The bounding set first: dropping from it needs CAP_SETPCAP, which goes away below.
    last = _sysctl("/proc/sys/kernel/cap_last_cap", max(CAP_NAMES))
    if CAP_SETPCAP in have:
        for bit in range(last + 1):
            if bit not in wanted:
                _check(libc.prctl(_PR_CAPBSET_DROP, bit, 0, 0, 0),
                       f"dropping {CAP_NAMES.get(bit, bit)} from the bounding set")
    # Ambient capabilities survive execve of unprivileged programs: none.
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    mask = sum(1 << bit for bit in wanted)
    header = _Header(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_Data * 2)()
    for i in range(2):
        word = (mask >> (32 * i)) & 0xFFFFFFFF
        data[i].effective = data[i].permitted = word
        data[i].inheritable = 0
    _check(libc.syscall(_SYS_CAPSET, ctypes.byref(header), ctypes.byref(data)), "capset")
    # No execve can gain privileges again (setuid binaries, file capabilities).
    _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    effective = current_capabilities("CapEff", f"/proc/self/task/{threading.get_native_id()}/status")
    log.info("capabilities dropped; kept: %s",
             ", ".join(CAP_NAMES.get(b, str(b)) for b in sorted(effective)) or "none")
    return effective


# capset's system call number (asm/unistd.h): x86_64 126, aarch64 (asm-generic) 91.
_SYS_CAPSET = {"x86_64": 126, "aarch64": 91, "armv7l": 185, "ppc64le": 184, "s390x": 185,
               "riscv64": 91}.get(os.uname().machine, 126)
