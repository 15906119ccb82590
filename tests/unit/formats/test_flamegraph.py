from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

from offcpu_exporter.formats import Profile, render
from offcpu_exporter.formats import flamegraph as flamegraph_format
from offcpu_exporter.snapshot import Counter, Frame, FrameKind, Reason, Snapshot, Stack
from testkit import chromium
from testkit.snapshots import OTHER, workload_snapshot

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
    snap = workload_snapshot(1, [(OTHER, 1, "t", Reason.SLEEPING, evil, Counter(1, 10**6), Counter(1, 10**6))])
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


def widest(page: chromium.Page, name: str) -> dict[str, float] | None:
    """The bounding box of the widest drawn frame called `name`."""
    return page.evaluate(  # type: ignore[no-any-return]
        f"""(() => {{
        let best = null;
        for (const el of document.querySelectorAll('.frame')) {{
            if (el.dataset.name !== {json.dumps(name)}) continue;
            const r = el.getBoundingClientRect();
            if (!best || r.width > best.width) best = {{x: r.x, y: r.y, width: r.width, height: r.height,
                classes: el.className}};
        }}
        return best;
    }})()"""
    )


def test_interaction_in_chromium(before: Snapshot, after: Snapshot) -> None:
    page_path = ARTIFACTS / "flamegraph-interactive.html"
    page_path.parent.mkdir(parents=True, exist_ok=True)
    page_path.write_bytes(render("html", Profile.between(before, after)))
    with chromium.Page(page_path.resolve().as_uri(), size=(1200, 800)) as page:
        page.wait_for("document.querySelectorAll('.frame').length > 10")
        full = widest(page, "all")
        assert full is not None and full["width"] > 1100

        # Hover: the tooltip tells seconds, switches and the share of all.
        box = widest(page, "offcpu_pipe_read")
        assert box is not None
        page.mouse("mouseMoved", box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        tip = page.evaluate("document.getElementById('tooltip').innerText")
        assert page.evaluate("getComputedStyle(document.getElementById('tooltip')).display") == "block"
        assert "offcpu_pipe_read" in tip and "off-CPU 0.250000 s, 4 switches" in tip and "4 switches" in tip
        assert f"{100 * 250_000_000 / 1_791_235_066:.2f}% of all" in tip

        # Click: zoom to the frame, it spans the chart; its ancestors stay, dimmed.
        page.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        zoomed = widest(page, "offcpu_pipe_read")
        assert zoomed is not None and zoomed["width"] > 1100
        assert "Zoomed to offcpu_pipe_read" in page.evaluate("document.getElementById('zoominfo').innerText")
        assert "ancestor" in str(widest(page, "reader_thread")["classes"])  # type: ignore[index]
        assert widest(page, "offcpu_sleep_ms") is None  # outside the zoom: not drawn
        page.screenshot(ARTIFACTS / "flamegraph-zoomed.png")

        # Escape resets the zoom; so does the button.
        page.key("Escape")
        assert widest(page, "offcpu_sleep_ms") is not None
        page.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        reset = page.evaluate("JSON.stringify(document.getElementById('reset').getBoundingClientRect())")
        r = json.loads(reset)
        page.click(r["x"] + r["width"] / 2, r["y"] + r["height"] / 2)
        assert widest(page, "offcpu_sleep_ms") is not None

        # Search: typed into the box, matches turn magenta, the share is shown.
        s = json.loads(page.evaluate("JSON.stringify(document.getElementById('search').getBoundingClientRect())"))
        page.click(s["x"] + 10, s["y"] + s["height"] / 2)
        page.type_text("nanosleep")
        matched = page.evaluate("document.getElementById('matched').innerText")
        assert matched == f"Matched: {100 * 1_540_000_499 / 1_791_235_066:.2f}% (1.540 s)"
        assert page.evaluate("document.querySelectorAll('.frame.match').length") == 2 * 3  # 3 frames x 2 processes
        color = page.evaluate("getComputedStyle(document.querySelector('.frame.match')).backgroundColor")
        assert color == "rgb(230, 0, 230)"
        page.screenshot(ARTIFACTS / "flamegraph-search.png")

        # Resize: the graph follows the window.
        page.resize(700, 800)
        page.evaluate("window.dispatchEvent(new Event('resize'))")
        page.wait_for("document.querySelector('[data-name=\"all\"]').getBoundingClientRect().width < 700")
        narrow = widest(page, "all")
        assert narrow is not None and 640 < narrow["width"] < 700
