"""Container id and pod UID from /proc/PID/cgroup: every path shape in fixtures/cgroup/cases.json."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from offcpu_exporter.k8s.cgroup import ContainerIdentity, identify, parse_cgroup

FIXTURES = Path(__file__).parent / "fixtures" / "cgroup"
CASES = {k: v for k, v in json.loads((FIXTURES / "cases.json").read_text()).items() if not k.startswith("_")}


def test_every_fixture_has_a_case_and_a_source() -> None:
    assert sorted(p.name for p in FIXTURES.glob("*.cgroup")) == sorted(CASES)
    assert all(case["source"].startswith(("capture:", "rule:")) for case in CASES.values())


@pytest.mark.parametrize("name", sorted(CASES))
def test_fixture(name: str) -> None:
    case = CASES[name]
    got = parse_cgroup((FIXTURES / name).read_text())
    assert got == ContainerIdentity(case["container_id"], case["pod_uid"], case["runtime"])


def test_shapes_cover_v1_and_v2_for_each_runtime() -> None:
    seen = {(name.split("-", 1)[0], case["runtime"] or "cgroupfs") for name, case in CASES.items()
            if case["container_id"]}
    # Each of the three runtimes has a v1 and a v2 shape.
    assert {("v1", "containerd"), ("v1", "docker"), ("v1", "cri-o"),
            ("v2", "containerd"), ("v2", "docker"), ("v2", "cri-o")} <= seen


def test_pod_uid_underscores_become_dashes() -> None:
    text = ("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"
            "f6f2d169_f2ae_4afa_95ed_06ff2ed6b288.slice/cri-containerd-" + "ab" * 32 + ".scope\n")
    assert parse_cgroup(text).pod_uid == "f6f2d169-f2ae-4afa-95ed-06ff2ed6b288"


def test_not_fooled_by_lookalikes() -> None:
    # A 64-hex directory outside kubepods/docker is not a container; a short id is not one either.
    assert not parse_cgroup("0::/system.slice/" + "a" * 64 + "\n")
    assert not parse_cgroup("0::/system.slice/docker-abc123.scope\n")
    assert not parse_cgroup("0::/system.slice/kubepods-monitor.service\n")
    assert not parse_cgroup("")
    assert not parse_cgroup("garbage without colons\n\n")


def test_first_line_naming_a_container_wins_over_a_pod_only_line() -> None:
    pod = "0123abcd-0000-4000-8000-00000000abcd"
    text = (f"2:pids:/kubepods/burstable/pod{pod}\n"
            f"1:name=systemd:/kubepods/burstable/pod{pod}/{'c' * 64}\n")
    assert parse_cgroup(text) == ContainerIdentity("c" * 64, pod, "")


def test_identify_reads_a_proc_tree(tmp_path: Path) -> None:
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_bytes((FIXTURES / "v2-kubepods-systemd-crio.cgroup").read_bytes())
    got = identify(4242, proc_root=tmp_path)
    assert got.runtime == "cri-o" and got.pod_uid == "042efd86-1f3b-4f2f-8736-f31c58e95bbc"
    assert identify(4243, proc_root=tmp_path) == ContainerIdentity()  # exited: empty, no exception


def test_identify_this_process() -> None:
    # Whatever this machine is, the real file parses without error and agrees with parse_cgroup.
    assert identify(os.getpid()) == parse_cgroup(Path(f"/proc/{os.getpid()}/cgroup").read_text())
