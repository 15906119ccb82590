"""The Helm chart, rendered by Helm's own engine (helm-python-sdk wraps Helm 4's Go SDK), linted, and its
manifests validated with kubernetes-validate --strict for Kubernetes 1.28 and the newest version it knows:
with default values, with every optional feature on, and with the privileged fallback."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from offcpu_exporter import cli
from testkit.helm_chart import CHART, NAMESPACE, ROOT, by_kind, container, one, render

KUBE_VERSIONS = ("1.28.0", kubernetes_validate.latest_version())

ALL_ON: dict[str, Any] = {
    "targets": {"all": False, "pids": [1], "comm": "^(nginx|postgres)$", "cmdline": "java .*Main",
                "namespaces": ["shop", "batch"], "podLabels": {"app": "web", "tier": "front"},
                "containers": ["web", "0123456789ab"]},
    "probe": {"attach": "tracepoint"},
    "otlp": {"endpoint": "collector.observability:4317", "insecure": True, "profiles": True, "metrics": False,
             "headersSecret": {"name": "otlp-auth", "key": "headers"}},
    "skywalking": {"endpoint": "oap.skywalking:11800", "tls": True, "agent": True},
    "web": {"tls": {"enabled": True, "secretName": "offcpu-exporter-tls"},
            "basicAuth": {"enabled": True, "scrapeSecret": "offcpu-exporter-scrape",
                          # bcrypt of "scrape-password"
                          "users": {"prometheus": "$2b$10$bY3lJHviw/qnEBuKsyYWde/e00qhbI9gsnbj51abveXhBRUU0e3M2"}}},
    "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    "podMonitor": {"enabled": True},
    "prometheusRule": {"enabled": True, "namespace": "monitoring-rules", "labels": {"release": "kube-prometheus-stack"},
                       "extraRules": [{"alert": "OffcpuExporterDown", "expr": 'up{job="offcpu-exporter"} == 0'}]},
    "dashboards": {"enabled": True, "namespace": "grafana", "annotations": {"grafana_folder": "Profiling"}},
    "securityContext": {"sysAdmin": True},
    "service": {"annotations": {"prometheus.io/scrape": "true"}},
    "serviceAccount": {"annotations": {"example.com/role": "offcpu"}},
    "podAnnotations": {"example.com/team": "perf"}, "podLabels": {"team": "perf"},
    "priorityClassName": "system-node-critical", "imagePullSecrets": [{"name": "registry"}],
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "profiling", "operator": "In", "values": ["on"]}]}]}}},
    "extraArgs": ["--per-thread"], "extraEnv": [{"name": "OTEL_RESOURCE_ATTRIBUTES", "value": "k8s.cluster.name=c1"}],
    "extraVolumes": [{"name": "extra", "emptyDir": {}}],
    "extraVolumeMounts": [{"name": "extra", "mountPath": "/var/lib/offcpu-exporter"}],
}
PRIVILEGED: dict[str, Any] = {"securityContext": {"privileged": True}}
EXISTING_WEB_CONFIG: dict[str, Any] = {"web": {"existingConfigSecret": "my-web-config"},
                                       "kubernetesMetadata": {"enabled": False}}
VALUE_SETS = {"defaults": {}, "all-on": ALL_ON, "privileged": PRIVILEGED, "existing-web-config": EXISTING_WEB_CONFIG}


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_lint_is_clean(name: str) -> None:
    report = helm.lint(CHART, VALUE_SETS[name], strict=True, namespace=NAMESPACE, kube_version="v1.28.0")
    assert report["errors"] == [] and report["messages"] == [], report


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_manifests_validate_strictly(name: str, version: str, tmp_path: Path) -> None:
    docs = render(VALUE_SETS[name])
    files = []
    for i, doc in enumerate(docs):
        path = tmp_path / f"{i:02d}-{doc['kind']}.yaml"
        path.write_text(yaml.safe_dump(doc))
        files.append(path)
    result = subprocess.run(
        [str(Path(sys.executable).parent / "kubernetes-validate"), "--strict", "-k", version,
         *map(str, files)], capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # Only the Prometheus Operator kinds have no schema in kubernetes-validate (checked below and in
    # test_prometheus_rule.py instead).
    operator_kinds = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
    for line in result.stdout.splitlines():
        if line.startswith("WARN"):
            assert any(kind in line for kind in operator_kinds), line
    validated = {p.name.split("-", 1)[1][:-5] for p in files} - operator_kinds
    assert {"DaemonSet", "Service"} <= validated


def test_defaults_least_privilege() -> None:
    docs = render({})
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    c = container(docs)
    assert pod["hostPID"] is True
    sc = c["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert set(sc["capabilities"]["add"]) == {"BPF", "PERFMON", "SYS_PTRACE", "SYS_RESOURCE", "SYSLOG",
                                              "DAC_READ_SEARCH", "CHECKPOINT_RESTORE"}
    assert "--drop-privileges" in c["args"]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    for host in ("/sys/kernel/debug", "/sys/kernel/tracing", "/lib/modules", "/usr/src", "/sys/fs/cgroup"):
        assert mounts[host].get("readOnly") is True, host
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts["/tmp"]["name"]]["emptyDir"] is not None
    assert all(v["hostPath"]["path"] in mounts for v in volumes.values() if "hostPath" in v)
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert c["resources"]["limits"]["memory"] and c["resources"]["requests"]["cpu"]
    # RBAC for the pod lookup: read-only on pods, bound to the pod's service account.
    role = one(docs, "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    binding = one(docs, "ClusterRoleBinding")
    account = one(docs, "ServiceAccount")["metadata"]["name"]
    assert binding["subjects"][0]["name"] == pod["serviceAccountName"] == account
    assert not by_kind(docs, "ServiceMonitor") and not by_kind(docs, "ConfigMap") and not by_kind(docs, "Secret")
    assert not by_kind(docs, "PrometheusRule")


def test_privileged_fallback() -> None:
    c = container(render(PRIVILEGED))
    sc = c["securityContext"]
    assert sc["privileged"] is True and "capabilities" not in sc
    assert "--drop-privileges" not in c["args"]  # nothing to drop to: privileged means every capability


def test_all_on_wiring() -> None:
    docs = render(ALL_ON)
    c = container(docs)
    assert "SYS_ADMIN" in c["securityContext"]["capabilities"]["add"]
    args = c["args"]
    assert "--all" not in args  # selectors given: not everything
    for expected in ("--pid=1", "--comm=^(nginx|postgres)$", "--namespace=shop", "--namespace=batch",
                     "--pod-label=app=web", "--pod-label=tier=front", "--container=web",
                     "--otlp.endpoint=collector.observability:4317", "--otlp.insecure", "--no-otlp.metrics",
                     "--skywalking.endpoint=oap.skywalking:11800", "--skywalking.agent", "--per-thread",
                     "--web.config.file=/etc/offcpu-exporter/web/web-config.yml", "--attach=tracepoint"):
        assert expected in args, expected
    env = {e["name"]: e for e in c["env"]}
    assert env["OTEL_EXPORTER_OTLP_HEADERS"]["valueFrom"]["secretKeyRef"] == {"name": "otlp-auth", "key": "headers"}
    # Web config: TLS files from the TLS Secret, bcrypt users; probes that do not need the password.
    secret = one(docs, "Secret")
    web_config = yaml.safe_load(secret["stringData"]["web-config.yml"])
    assert web_config["tls_server_config"] == {"cert_file": "/etc/offcpu-exporter/tls/tls.crt",
                                               "key_file": "/etc/offcpu-exporter/tls/tls.key"}
    assert web_config["basic_auth_users"] == ALL_ON["web"]["basicAuth"]["users"]
    assert "tcpSocket" in c["livenessProbe"] and "tcpSocket" in c["readinessProbe"]
    # The monitors find the Service / pods by their labels and port name, over HTTPS with basic auth.
    service = one(docs, "Service")
    port_names = {p["name"] for p in service["spec"]["ports"]}
    assert {p["name"] for p in c["ports"]} == port_names
    pod_labels = one(docs, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    for kind, endpoints_key, labels in (("ServiceMonitor", "endpoints", service["metadata"]["labels"]),
                                        ("PodMonitor", "podMetricsEndpoints", pod_labels)):
        monitor = one(docs, kind)
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
        endpoint = monitor["spec"][endpoints_key][0]
        assert endpoint["port"] in port_names and endpoint["scheme"] == "https"
        assert endpoint["basicAuth"]["password"] == {"name": "offcpu-exporter-scrape", "key": "password"}
        # The series' namespace/pod/container win over the Operator's target labels of those names
        # (tests/e2e/test_operator_labels.py scrapes with the job the Operator makes of this).
        assert endpoint["honorLabels"] is True
    assert one(docs, "ServiceMonitor")["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    # The dashboard ConfigMap for Grafana's sidecar holds the dashboard file unchanged.
    cm = one(docs, "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1" and cm["metadata"]["namespace"] == "grafana"
    assert json.loads(cm["data"]["offcpu-exporter.json"]) == json.loads(
        (ROOT / "dashboards" / "offcpu-exporter.json").read_text())


def test_the_exporter_loads_the_chart_web_config(tmp_path: Path) -> None:
    # The exporter's own web-config loader reads what the chart writes; the TLS files it names are the
    # mounted Secret's, made here with openssl and put where the config says (under tmp_path).
    from offcpu_exporter.web.auth import BasicAuth
    from offcpu_exporter.web.config_file import load_web_config

    text = one(render(ALL_ON), "Secret")["stringData"]["web-config.yml"]
    tls_dir = tmp_path / "etc" / "offcpu-exporter" / "tls"
    tls_dir.mkdir(parents=True)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=oe",
                    "-keyout", str(tls_dir / "tls.key"), "-out", str(tls_dir / "tls.crt")],
                   check=True, capture_output=True, timeout=60)
    config_file = tmp_path / "web-config.yml"
    config_file.write_text(text.replace("/etc/offcpu-exporter/tls/", f"{tls_dir}/"))
    config = load_web_config(config_file)
    assert config.tls is not None and config.tls.cert_file == tls_dir / "tls.crt"
    auth = BasicAuth(config.users)
    good = "Basic " + base64.b64encode(b"prometheus:scrape-password").decode()
    bad = "Basic " + base64.b64encode(b"prometheus:wrong").decode()
    assert auth.check(good) and not auth.check(bad)


def test_existing_web_config_and_no_api() -> None:
    docs = render(EXISTING_WEB_CONFIG)
    c = container(docs)
    assert "--kubernetes.metadata=off" in c["args"]
    assert not by_kind(docs, "ClusterRole") and not by_kind(docs, "Secret")
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert {"name": "web-config", "secret": {"secretName": "my-web-config"}} in pod["volumes"]


def test_bad_values_are_refused() -> None:
    chart = helm.Chart.load(CHART)
    with pytest.raises(helm.HelmError, match="comn"):
        chart.render({"targets": {"comn": "x"}}, name="oe", namespace=NAMESPACE)
    with pytest.raises(helm.HelmError, match="secretName"):
        chart.render({"web": {"tls": {"enabled": True}}}, name="oe", namespace=NAMESPACE)


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_the_exporter_accepts_the_chart_arguments(name: str) -> None:
    args = container(render(VALUE_SETS[name]))["args"]
    options, unknown = cli.build_parser().parse_known_args(args)
    assert options.command == "serve"
    assert unknown == []
    if name == "defaults":
        assert options.all is True and options.kubernetes_metadata == "auto"


def test_chart_dashboard_is_the_dashboard() -> None:
    packaged = sorted(p.name for p in (CHART / "dashboards").iterdir())
    assert packaged == sorted(p.name for p in (ROOT / "dashboards").glob("*.json"))
    for name in packaged:
        assert (CHART / "dashboards" / name).read_bytes() == (ROOT / "dashboards" / name).read_bytes(), (
            f"helm/offcpu-exporter/dashboards/{name} differs from dashboards/{name}: copy it again")


def iter_dockerfile(path: Path) -> Iterator[tuple[str, str]]:
    text = path.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            yield word.upper(), rest.strip()


def test_dockerfile_builds_what_the_chart_runs() -> None:
    steps = list(iter_dockerfile(ROOT / "Dockerfile"))
    assert steps[0] == ("FROM", "debian:12-slim")
    run = " ".join(rest for word, rest in steps if word == "RUN")
    # No extra for pod names: the exporter's own API client (offcpu_exporter/k8s/apiserver.py).
    assert "python3-bpfcc" in run and "--system-site-packages" in run and "[k8s]" not in run
    copied = {rest.split()[0].rstrip("/") for word, rest in steps if word == "COPY"}
    assert {"exporter", "bpf", "pyproject.toml"} <= copied
    # A plain install (not -e), with the tested versions of every runtime dependency.
    assert re.search(r"pip install --no-cache-dir -c constraints\.txt '?/opt/offcpu-exporter\b", run), run
    assert "constraints.txt" in next(rest for word, rest in steps if word == "COPY").split()
    assert json.loads(dict(steps)["ENTRYPOINT"]) == ["offcpu-exporter"]
    assert json.loads(dict(steps)["CMD"]) == ["serve"]
    # The chart's default image is this one's name at the chart's appVersion.
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    image = container(render({}))["image"]
    assert image == f"offcpu-exporter:{chart['appVersion']}"


def test_readme_docker_run_gives_what_the_chart_gives() -> None:
    # The one-host example runs the same image with the pod's capabilities, host paths (read-only) and
    # host PID namespace, on the port the Dockerfile exposes, with arguments the exporter accepts.
    readme = (ROOT / "README.md").read_text()
    block = readme.split("    docker run ", 1)[1].split("\n\n", 1)[0].replace("\\\n", " ")
    words = block.split()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    caps = {w.split("=", 1)[1] for w in words if w.startswith("--cap-add=")}
    assert "--cap-drop=ALL" in words and caps == set(values["securityContext"]["capabilities"])
    mounts = [words[i + 1] for i, w in enumerate(words) if w == "-v"]
    assert mounts == [f"{p}:{p}:ro" for p in values["hostPaths"].values()]
    assert "--pid=host" in words
    expose = dict(iter_dockerfile(ROOT / "Dockerfile"))["EXPOSE"]
    assert f"{expose}:{expose}" in words and int(expose) == values["web"]["port"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    image = f"offcpu-exporter:{chart['appVersion']}"
    assert f"docker build -t {image} ." in readme
    args = words[words.index(image) + 1:]
    options, unknown = cli.build_parser().parse_known_args(args)
    assert options.command == "serve" and options.all is True and unknown == []
