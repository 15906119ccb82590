from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

from exporter.formats import Profile, render
from exporter.formats import flamegraph as flamegraph_format
from exporter.snapshot import Counter, Frame, FrameKind, Reason, Snapshot, Stack
from tests.support import chromium
from tests.unit.formats.synthetic import OTHER, snapshot

ARTIFACTS = Path(__file__).resolve().parents[3] / "artifacts"


def check_sums(node: list[Any]) -> None:
    _, ns, count, _, children = node
    assert sum(c[1] for c in children) <= ns and sum(c[2] for c in children) <= count
    for c in children:
        check_sums(c)


def test_tree(before: Snapshot, after: Snapshot) -> None:
    names, root = flamegraph_format.tree(Profile.between(before, after))
    assert names[root[0]] == "all" and root[1] == 1_791_235_066 and root[2] == 24
    processes = {names[c[0]]: c for c in root[4]}
    assert set(processes) == {"offcpu_workload (4242)", "other<script> (777)"}
    check_sums(root)
    # offcpu_workload -> __libc_start_main -> main -> offcpu_sleep_ms holds 1.5 s.
    node = processes["offcpu_workload (4242)"]
    for name in ("__libc_start_main", "main", "offcpu_sleep_ms"):
        node = next(c for c in node[4] if names[c[0]] == name)
    assert node[1] == 1_500_000_000 and node[2] == 15 and node[3] == 2
    kernel_child = node[4][0]
    assert names[kernel_child[0]] == "entry_SYSCALL_64_after_hwframe" and kernel_child[3] == 3


def test_page_is_self_contained_and_escaped(before: Snapshot) -> None:
    evil = Stack(user=(Frame("</script><img src=x onerror=alert(1)>", FrameKind.NATIVE, "/x", 1),), kernel=())
    snap = snapshot(1, [(OTHER, 1, "t", Reason.SLEEPING, evil, Counter(1, 10**6), Counter(1, 10**6))])
    page = render("html", Profile.since_previous(snap)).decode()
    assert "</script><img" not in page
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page), "the page must not load anything"
    data = re.search(r'<script id="flamegraph-data" type="application/json">(.*?)</script>', page, re.S)
    assert data is not None
    parsed = json.loads(data.group(1))
    assert "</script><img src=x onerror=alert(1)>" in parsed["names"]
    assert html.escape("other<script>") not in parsed["names"]  # names are JSON, not HTML-escaped


def frames_in(dom: str) -> list[tuple[str, str, float]]:
    """(classes, data-name, width px) of every drawn frame."""
    out = []
    for m in re.finditer(r'<div class="(frame[^"]*)" data-name="([^"]*)" style="([^"]*)"', dom):
        width = re.search(r"width: ([\d.]+)px", m.group(3))
        out.append((m.group(1), html.unescape(m.group(2)), float(width.group(1)) if width else 0.0))
    return out


def test_renders_in_chromium(tmp_path: Path, before: Snapshot, after: Snapshot) -> None:
    page = ARTIFACTS / "flamegraph-synthetic.html"
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_bytes(render("html", Profile.between(before, after)))
    chromium.screenshot(page, ARTIFACTS / "flamegraph-synthetic.png")

    frames = frames_in(chromium.dump_dom(page))
    drawn: dict[str, float] = {}
    for _, name, width in frames:
        drawn[name] = max(width, drawn.get(name, 0.0))
    # 1.5 s of 1.791 s across a 1200 px window (minus margins): the sleeping function is wide.
    assert drawn["offcpu_sleep_ms"] > 0.8 * 1180 * 1.5 / 1.7913
    assert drawn["all"] > 1100
    assert "offcpu_pipe_read" in drawn and "do_nanosleep" in drawn

    dom = chromium.dump_dom(page, "search=offcpu_sleep_ms")
    matched = [name for classes, name, _ in frames_in(dom) if "match" in classes.split()]
    assert matched == ["offcpu_sleep_ms", "offcpu_sleep_ms"]  # both processes
    share = re.search(r'<span id="matched">Matched: ([\d.]+)%', dom)
    assert share is not None
    assert float(share.group(1)) == round(100 * 1_540_000_499 / 1_791_235_066, 2)


def test_window_size_sets_the_width(before: Snapshot, after: Snapshot, tmp_path: Path) -> None:
    page = tmp_path / "fg.html"
    page.write_bytes(render("html", Profile.between(before, after)))
    narrow = {n: w for _, n, w in frames_in(chromium.dump_dom(page, size=(600, 800)))}
    assert 540 < narrow["all"] < 600
