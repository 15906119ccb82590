"""The --namespace/--pod-label/--container options: parsing, bad input, and matching without the API."""

from __future__ import annotations

import argparse

import pytest

from offcpu_exporter.k8s.cgroup import ContainerIdentity
from offcpu_exporter.k8s.metadata import PodMetadata
from offcpu_exporter.k8s.selection import WorkloadSelector, add_arguments


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="offcpu-exporter")
    add_arguments(p)
    return p


def test_defaults_select_everything() -> None:
    options = parser().parse_args([])
    selector = WorkloadSelector.from_args(options, PodMetadata.disabled())
    assert not selector.active
    assert selector.matches(ContainerIdentity())
    assert options.kubernetes_metadata == "auto" and options.kubernetes_refresh_interval == 30.0


def test_repeated_options() -> None:
    options = parser().parse_args(["--namespace", "a", "--namespace", "b", "--pod-label", "app=web",
                                   "--pod-label", "app.kubernetes.io/part-of=shop", "--pod-label", "empty=",
                                   "--container", "web"])
    assert options.namespace == ["a", "b"]
    assert options.pod_label == [("app", "web"), ("app.kubernetes.io/part-of", "shop"), ("empty", "")]
    selector = WorkloadSelector.from_args(options, PodMetadata.disabled())
    assert selector.active and selector.needs_api


@pytest.mark.parametrize("args", [["--pod-label", "novalue"], ["--pod-label", "=x"],
                                  ["--pod-label", "a=b c"], ["--kubernetes.refresh-interval", "0"],
                                  ["--kubernetes.refresh-interval", "soon"], ["--kubernetes.metadata", "on"]])
def test_bad_input_exits_2_with_one_line(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parser().parse_args(args)
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("offcpu-exporter: error:")


def test_container_id_prefix_works_without_the_api() -> None:
    cid = "40c03570b6f4c30bc8d69923d37ee698f5cfcced92c7b7df1c47f6f7887378a9"
    selector = WorkloadSelector.create(PodMetadata.disabled(), containers=[cid[:12]])
    assert not selector.needs_api
    assert selector.matches(ContainerIdentity(cid, "", "docker"))
    assert not selector.matches(ContainerIdentity("1" * 64, "", "docker"))
    assert not selector.matches(ContainerIdentity())


def test_without_the_api_names_select_nothing() -> None:
    # --namespace with no API: nothing matches (and nothing fails) until names are known.
    selector = WorkloadSelector.create(PodMetadata.disabled(), namespaces=["shop"], containers=["web"])
    assert not selector.matches(ContainerIdentity("a" * 64, "dde1244b-5bb5-4297-b544-85f3bc0d80bf", ""))


def test_cli_refuses_all_with_kubernetes_selectors(capsys: pytest.CaptureFixture[str]) -> None:
    from offcpu_exporter import cli

    with pytest.raises(SystemExit) as exited:
        cli.parse_args(["serve", "--all", "--namespace", "shop"])
    assert exited.value.code == 2
    assert "--all" in capsys.readouterr().err


def test_cli_names_need_the_api_outside_a_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    from offcpu_exporter import cli

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    options = cli.parse_args(["record", "--namespace", "shop", "--duration", "1"])
    with pytest.raises(cli.StartupError, match="Kubernetes API"):
        cli._kubernetes(options)
    # A container id works without it.
    options = cli.parse_args(["record", "--container", "0123456789abcdef", "--duration", "1"])
    _, enrich, predicate = cli._kubernetes(options)
    assert predicate is not None and callable(enrich)
