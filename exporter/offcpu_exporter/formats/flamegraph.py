"""Profile -> one self-contained HTML page with an interactive off-CPU flame graph.

The page inlines its data, CSS and the renderer (flamegraph.js beside this module): it opens
from a file or an exporter response with no network access. The tree is
all -> ``comm (pid)`` -> user frames root..leaf -> kernel frames entry..leaf, children sorted by
name as flamegraph.pl does; each node carries off-CPU nanoseconds and switches.
"""

from __future__ import annotations

import html
import json
from datetime import UTC, datetime
from functools import cache
from importlib import resources
from typing import Any

from offcpu_exporter.formats.profile import Profile
from offcpu_exporter.snapshot import FrameKind

__all__ = ["encode", "tree"]

# Node kinds, shared with flamegraph.js.
_ROOT, _PROCESS = 0, 1
_KIND_CODES = {FrameKind.NATIVE: 2, FrameKind.KERNEL: 3, FrameKind.JIT: 4, FrameKind.PLACEHOLDER: 5}


class _Node:
    __slots__ = ("children", "count", "kind", "name", "ns")

    def __init__(self, name: str, kind: int) -> None:
        self.name = name
        self.kind = kind
        self.ns = 0
        self.count = 0
        self.children: dict[tuple[str, int], _Node] = {}

    def child(self, name: str, kind: int) -> _Node:
        key = (name, kind)
        node = self.children.get(key)
        if node is None:
            node = self.children[key] = _Node(name, kind)
        return node


def tree(profile: Profile) -> tuple[list[str], list[Any]]:
    """The names table and the nested ``[name index, ns, switches, kind, children]`` tree."""
    root = _Node("all", _ROOT)
    for s in profile.samples:
        ns, count = s.value.ns, s.value.count
        root.ns += ns
        root.count += count
        node = root.child(f"{s.process.comm} ({s.process.pid})", _PROCESS)
        node.ns += ns
        node.count += count
        for f in s.stack.root_to_leaf():
            key = (f.name, _KIND_CODES.get(f.kind, 2))
            child = node.children.get(key)
            if child is None:
                child = node.children[key] = _Node(*key)
            child.ns += ns
            child.count += count
            node = child
    names: dict[str, int] = {}

    def pack(node: _Node) -> list[Any]:
        index = names.setdefault(node.name, len(names))
        return [index, node.ns, node.count, node.kind, [pack(node.children[k]) for k in sorted(node.children)]]

    packed = pack(root)
    return list(names), packed


@cache
def _script() -> str:
    return resources.files("offcpu_exporter.formats").joinpath("flamegraph.js").read_text("utf-8")


_STYLE = """
* { box-sizing: border-box; }
body { margin: 0; font: 12px Verdana, Helvetica, sans-serif; background: #f8f8f8; color: #222; }
header { position: sticky; top: 0; z-index: 2; background: #eee; border-bottom: 1px solid #ccc;
  padding: 6px 10px; display: flex; flex-wrap: wrap; gap: 6px 14px; align-items: center; }
header h1 { font-size: 15px; margin: 0; flex-basis: 100%; }
#subtitle { color: #555; flex-basis: 100%; }
#search { width: 18em; padding: 2px 4px; }
#matched { color: #a0006a; font-weight: bold; }
#zoominfo { color: #555; }
#chart { position: relative; margin: 10px; overflow: hidden; }
.frame { position: absolute; height: 17px; line-height: 17px; padding: 0 3px; overflow: hidden;
  white-space: nowrap; text-overflow: ellipsis; cursor: pointer; border-radius: 2px; color: #000; }
.frame:hover { outline: 1px solid #000; }
.frame.ancestor { opacity: 0.55; }
.frame.match { background: rgb(230, 0, 230) !important; color: #fff; }
#tooltip { position: fixed; display: none; z-index: 3; pointer-events: none; max-width: 60em;
  background: #fffff0; border: 1px solid #888; padding: 4px 7px; box-shadow: 2px 2px 4px #0003; }
#tooltip .name { font-weight: bold; word-break: break-all; }
"""


def _timestamp(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def encode(profile: Profile, title: str = "Off-CPU flame graph") -> bytes:
    names, root = tree(profile)
    total = profile.total
    subtitle = (
        f"{profile.duration_ns / 1e9:.1f} s from {_timestamp(profile.start_ns)}"
        + (f" ({profile.description})" if profile.description else "")
        + f"; {total.seconds:.3f} s off CPU in {total.count} switches, "
        + f"{len(profile.processes)} processes, {len(profile.samples)} stacks"
    )
    if not profile.samples:
        subtitle += "; nothing was recorded in this interval"
    data = {"title": title, "subtitle": subtitle, "names": names, "root": root}
    # "<" escaped so that no frame name can close the script element.
    payload = json.dumps(data, separators=(",", ":"), ensure_ascii=False).replace("<", "\\u003c")
    page = f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<style>{_STYLE}</style>
</head>
<body>
<header>
<h1 id="title">{html.escape(title)}</h1>
<div id="subtitle">{html.escape(subtitle)}</div>
<input id="search" type="search" placeholder="Search (regular expression)" aria-label="Search">
<button id="clear" type="button">Clear</button>
<button id="reset" type="button">Reset zoom</button>
<span id="matched"></span>
<span id="zoominfo"></span>
</header>
<div id="chart"></div>
<div id="tooltip"></div>
<script id="flamegraph-data" type="application/json">{payload}</script>
<script>{_script()}</script>
</body>
</html>
"""
    return page.encode("utf-8", "surrogateescape")
