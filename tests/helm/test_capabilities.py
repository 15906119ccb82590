"""The capabilities the chart grants are the ones SECURITY.md lists, and the docs' tables say the same:
parsed from both, so that neither can change alone. (That each one is needed and enough on a real
kernel: tests/e2e/test_chart_capabilities_kernel.py.)"""

from __future__ import annotations

import re
from pathlib import Path

from offcpu_exporter import privileges
from testkit.helm_chart import container, render

ROOT = Path(__file__).resolve().parents[2]


def security_md_bounding_set() -> set[str]:
    text = (ROOT / "SECURITY.md").read_text()
    line = next(x for x in text.splitlines() if x.startswith("CapabilityBoundingSet="))
    return {c.removeprefix("CAP_") for c in line.split("=", 1)[1].split()}


def security_md_kept() -> set[str]:
    """Capabilities in the first column of SECURITY.md's `--drop-privileges` table."""
    text = (ROOT / "SECURITY.md").read_text()
    table = text.split("### `--drop-privileges`", 1)[1].split("\n\n| kept | why |", 1)[1].split("\n\n", 1)[0]
    return {c for row in table.splitlines()[1:] for c in re.findall(r"`CAP_([A-Z_]+)`", row.split("|")[1])}


def table_capabilities(path: Path) -> set[str]:
    """Capabilities in the first column of the `| capability | why |` table of a doc."""
    text = path.read_text()
    table = text.split("| capability | why |", 1)[1].split("\n\n", 1)[0]
    return {c for row in table.splitlines()[2:] for c in re.findall(r"^\|\s*`?([A-Z_]+)`?", row)}


def granted(values: dict[str, object]) -> set[str]:
    sc = container(render(values))["securityContext"]
    return set(sc["capabilities"]["add"])


def test_chart_grants_what_security_md_lists() -> None:
    assert granted({}) == security_md_bounding_set()


def test_what_drop_privileges_keeps_is_granted() -> None:
    kept = security_md_kept()
    # What the code may keep, on any kernel and sysctl, is what SECURITY.md's table says.
    code = {privileges.CAP_NAMES[k.capability].removeprefix("CAP_")
            for release in ((5, 4), (5, 8), (5, 10), (6, 1), (6, 8)) for port in (80, 9961)
            for k in privileges.kept_after_attach(port, release=release, proc_sys="/nonexistent")}
    assert code == kept
    # Each is granted by the chart, where the chart's settings make it needed: SYS_ADMIN on kernels
    # before 5.8/5.9 (securityContext.sysAdmin), NET_BIND_SERVICE for a port below 1024.
    assert kept - {"SYS_ADMIN", "NET_BIND_SERVICE"} <= granted({})
    assert "SYS_ADMIN" in granted({"securityContext": {"sysAdmin": True}})
    assert "NET_BIND_SERVICE" in granted({"web": {"port": 443}}) and "NET_BIND_SERVICE" not in granted({})


def test_the_docs_tables_say_the_same() -> None:
    chart = granted({})
    for doc in (ROOT / "helm" / "offcpu-exporter" / "README.md", ROOT / "docs" / "kubernetes.md"):
        listed = table_capabilities(doc)
        assert chart <= listed, f"{doc.relative_to(ROOT)} does not explain {sorted(chart - listed)}"
        assert listed <= chart | {"SYS_ADMIN", "NET_BIND_SERVICE"}, f"{doc.relative_to(ROOT)}: {sorted(listed - chart)}"
