"""The wiring into targets: ProcessTable enriches processes with container/pod identity and selects them
by namespace, on a /proc tree written here and a pod list served by an in-process lister."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from offcpu_exporter import targets
from offcpu_exporter.k8s.metadata import PodMetadata
from offcpu_exporter.k8s.selection import WorkloadSelector
from offcpu_exporter.snapshot import ProcessInfo
from offcpu_exporter.targets import ProcessTable, TargetRules, kubernetes_enricher, kubernetes_predicate

UID_SHOP = "dde1244b-5bb5-4297-b544-85f3bc0d80bf"
UID_BATCH = "042efd86-1f3b-4f2f-8736-f31c58e95bbc"
CID_WEB = "40c03570b6f4c30bc8d69923d37ee698f5cfcced92c7b7df1c47f6f7887378a9"
CID_JOB = "f33f47b0db740bb647cb3e7ac62d96c74966dbb99cbfaf4563bfd42d387e8b44"


def write_process(root: Path, pid: int, comm: str, cgroup: str, start_ticks: int | None = None) -> None:
    d = root / str(pid)
    d.mkdir()
    # Fields after "(comm)": state ppid ... starttime is field 22.
    rest = ["S", "1"] + ["0"] * 17 + [str(1000 + pid if start_ticks is None else start_ticks)] + ["0"] * 30
    (d / "stat").write_text(f"{pid} ({comm}) {' '.join(rest)}\n")
    (d / "status").write_text(f"Name:\t{comm}\nTgid:\t{pid}\n")
    (d / "cgroup").write_text(cgroup)


def proc_tree(root: Path) -> None:
    write_process(root, 100, "web", "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
                  f"{UID_SHOP.replace('-', '_')}.slice/cri-containerd-{CID_WEB}.scope\n")
    write_process(root, 200, "sshd", "0::/system.slice/ssh.service\n")
    write_process(root, 300, "job", f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"
                  f"{UID_BATCH.replace('-', '_')}.slice/crio-{CID_JOB}.scope\n")


class Pods:
    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def add(self, uid: str, namespace: str, name: str, cid: str, container: str, runtime: str) -> None:
        self.items.append({"metadata": {"uid": uid, "namespace": namespace, "name": name},
                           "status": {"containerStatuses": [{"name": container,
                                                             "containerID": f"{runtime}://{cid}"}]}})

    def list(self) -> tuple[list[dict[str, Any]], str]:
        return list(self.items), "1"

    def watch(self, resource_version: str) -> Iterator[tuple[str, dict[str, Any]]]:
        return iter(())

    def interrupt(self) -> None:
        pass


def test_processes_get_names_and_late_pods_are_filled_in(tmp_path: Path) -> None:
    proc_tree(tmp_path)
    pods = Pods()
    pods.add(UID_SHOP, "shop", "web-1", CID_WEB, "web", "containerd")
    metadata = PodMetadata(pods)
    assert metadata.refresh()
    table = ProcessTable(TargetRules(comm=re.compile(".")), proc_root=str(tmp_path),
                         enrich=kubernetes_enricher(metadata, str(tmp_path)))
    added, _ = table.refresh()
    by_pid = {p.pid: p for p in added}
    assert (by_pid[100].namespace, by_pid[100].pod, by_pid[100].container) == ("shop", "web-1", "web")
    assert by_pid[100].container_id == CID_WEB and by_pid[100].pod_uid == UID_SHOP
    assert (by_pid[200].container_id, by_pid[200].namespace) == ("", "")
    # The batch pod was not in the list yet: ids known, names empty ...
    assert (by_pid[300].container_id, by_pid[300].pod) == (CID_JOB, "")
    # ... until the pod list has it; the next scan fills them in.
    pods.add(UID_BATCH, "batch", "job-1", CID_JOB, "worker", "cri-o")
    assert metadata.refresh()
    table.refresh()
    job = table.info(300)
    assert job is not None and (job.namespace, job.pod, job.container) == ("batch", "job-1", "worker")


def test_select_by_namespace(tmp_path: Path) -> None:
    proc_tree(tmp_path)
    pods = Pods()
    pods.add(UID_SHOP, "shop", "web-1", CID_WEB, "web", "containerd")
    pods.add(UID_BATCH, "batch", "job-1", CID_JOB, "worker", "cri-o")
    metadata = PodMetadata(pods)
    assert metadata.refresh()
    selector = WorkloadSelector.create(metadata, namespaces=["batch"])
    rules = TargetRules(predicate=kubernetes_predicate(selector))
    table = ProcessTable(rules, proc_root=str(tmp_path), enrich=kubernetes_enricher(metadata, str(tmp_path)))
    added, _ = table.refresh()
    assert [p.pid for p in added] == [300]
    assert kubernetes_predicate(WorkloadSelector.create(metadata)) is None


def test_without_the_api_ids_are_filled_and_names_stay_empty(tmp_path: Path) -> None:
    proc_tree(tmp_path)
    table = ProcessTable(TargetRules(pids=(100,)), proc_root=str(tmp_path),
                         enrich=kubernetes_enricher(PodMetadata.disabled(), str(tmp_path)))
    assert table.start() == []
    web = table.info(100)
    assert web is not None and web.container_id == CID_WEB
    assert (web.namespace, web.pod, web.container) == ("", "", "")


def test_a_process_moved_into_its_container_after_it_was_seen(tmp_path: Path) -> None:
    # runc forks the container's first process, then moves it into the container's cgroup: a scan in
    # between sees it on the host. A young process is looked at again; an old one is settled.
    hz = os.sysconf("SC_CLK_TCK")
    now = 3600.0  # seconds since boot
    write_process(tmp_path, 400, "runc:[2:INIT]", "0::/system.slice/containerd.service\n",
                  start_ticks=int((now - 0.01) * hz))  # started 10 ms ago
    write_process(tmp_path, 500, "sshd", "0::/system.slice/ssh.service\n", start_ticks=int((now - 60) * hz))
    table = ProcessTable(TargetRules(comm=re.compile(".")), proc_root=str(tmp_path),
                         enrich=kubernetes_enricher(PodMetadata.disabled(), str(tmp_path), since_boot=lambda: now))
    table.refresh()
    first = table.info(400)
    assert first is not None and first.container_id == ""
    (tmp_path / "400" / "cgroup").write_text(f"0::/kubepods/besteffort/pod{UID_BATCH}/{CID_JOB}\n")
    (tmp_path / "400" / "stat").write_text((tmp_path / "400" / "stat").read_text().replace("runc:[2:INIT]", "job"))
    table.refresh()
    moved = table.info(400)
    assert moved is not None and (moved.container_id, moved.pod_uid) == (CID_JOB, UID_BATCH)
    # An old process's identity is settled: not re-read on every scan.
    (tmp_path / "500" / "cgroup").write_text(f"0::/kubepods/besteffort/pod{UID_BATCH}/{CID_JOB}\n")
    table.refresh()
    host = table.info(500)
    assert host is not None and host.container_id == ""


def test_only_unsettled_processes_are_enriched_again_at_each_refresh(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A refresh driven by the kernel's events looks again at the processes whose identity may still
    change (young ones, or in a container whose pod is not listed yet), not at every process: at
    10,000 processes that was a clock read each, once a second."""
    hz = os.sysconf("SC_CLK_TCK")
    boot = time.clock_gettime(time.CLOCK_BOOTTIME)
    for pid in range(1000, 1200):  # on the host, started an hour ago: settled
        write_process(tmp_path, pid, "old", "0::/system.slice/a.service\n", start_ticks=int((boot - 3600) * hz))
    write_process(tmp_path, 300, "young", "0::/system.slice/b.service\n", start_ticks=int(boot * hz))
    calls: list[int] = []
    listed: set[int] = set()  # processes whose pod the API server has listed

    def enrich(info: ProcessInfo) -> ProcessInfo:
        calls.append(info.pid)
        return replace(info, pod="shop-1") if info.pid in listed else info

    table = ProcessTable(TargetRules(comm=re.compile(".")), proc_root=str(tmp_path), enrich=enrich)
    table.refresh()
    clock_reads = [0]
    real_clock = time.clock_gettime

    def counted(clock: int) -> float:
        clock_reads[0] += 1
        return real_clock(clock)

    monkeypatch.setattr(targets.time, "clock_gettime", counted)
    calls.clear()
    table.refresh(changed=set())
    assert calls == [300]
    assert clock_reads[0] <= 2, "the age of every process was looked at"
    listed.add(300)  # its pod is listed: settled from now on
    table.refresh(changed=set())
    calls.clear()
    table.refresh(changed=set())
    assert calls == []
    info = table.info(300)
    assert info is not None and info.pod == "shop-1"
