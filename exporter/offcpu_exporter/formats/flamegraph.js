// Interactive off-CPU flame graph for offcpu-exporter's self-contained HTML page.
// Input: the JSON in <script id="flamegraph-data">: {title, subtitle, names: [...], root: node},
// node = [nameIndex, nanoseconds, switches, kind, [children...]]; kinds: 0 all, 1 process,
// 2 native, 3 kernel, 4 jit, 5 placeholder. Root at the bottom, as flamegraph.pl draws it.
// Click zooms, the search box highlights matches (regular expression) and shows their share,
// Escape or "Reset zoom" goes back, and the graph is re-laid out when the window is resized.
(function () {
  "use strict";
  var ROW = 18, MIN_WIDTH = 0.5;
  var KIND_NAMES = ["all", "process", "native", "kernel", "jit", "placeholder"];
  var data = JSON.parse(document.getElementById("flamegraph-data").textContent);
  var chart = document.getElementById("chart");
  var tip = document.getElementById("tooltip");
  var search = document.getElementById("search");
  var matchInfo = document.getElementById("matched");
  var zoomInfo = document.getElementById("zoominfo");
  var root = build(data.root, null, 0);
  var maxDepth = 0, zoomed = root, pattern = null;
  walk(root, function (n) { if (n.depth > maxDepth) maxDepth = n.depth; });
  document.getElementById("title").textContent = data.title;
  document.getElementById("subtitle").textContent = data.subtitle;
  document.title = data.title;

  function build(raw, parent, depth) {
    var node = { name: data.names[raw[0]], ns: raw[1], switches: raw[2], kind: raw[3],
                 parent: parent, depth: depth, children: [] };
    for (var i = 0; i < raw[4].length; i++) node.children.push(build(raw[4][i], node, depth + 1));
    return node;
  }
  function walk(node, fn) {
    fn(node);
    for (var i = 0; i < node.children.length; i++) walk(node.children[i], fn);
  }
  function hash(name) {
    var h = 0;
    for (var i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) >>> 0;
    return (h % 1000) / 1000;
  }
  function color(node) {
    var v = hash(node.name);
    switch (node.kind) {
      case 0: return "rgb(200,200,200)";
      case 1: return "rgb(" + Math.round(170 + 40 * v) + ",150," + Math.round(210 + 40 * v) + ")";
      case 3: return "rgb(" + Math.round(80 + 60 * v) + "," + Math.round(180 + 50 * v) + ",220)";
      case 4: return "rgb(" + Math.round(60 + 60 * v) + "," + Math.round(190 + 50 * v) + ",80)";
      case 5: return "rgb(175,175,175)";
      default: return "rgb(" + Math.round(205 + 50 * v) + "," + Math.round(230 * (1 - v)) + "," + Math.round(55 * v) + ")";
    }
  }
  function seconds(ns) {
    var s = ns / 1e9;
    // Always seconds (what the exporter's metrics use), with microsecond precision below 1 s.
    return (s >= 1000 ? s.toFixed(0) : s >= 1 ? s.toFixed(3) : s.toFixed(6)) + " s";
  }
  function percent(part, whole) {
    return whole > 0 ? (100 * part / whole).toFixed(2) + "%" : "0%";
  }

  function render() {
    var width = chart.clientWidth;
    var height = (maxDepth + 1) * ROW;
    chart.style.height = height + "px";
    var fragment = document.createDocumentFragment();
    // Ancestors of the zoomed frame span the full width, as in flamegraph.pl.
    for (var a = zoomed.parent; a; a = a.parent) draw(fragment, a, 0, width, height, true);
    layout(fragment, zoomed, 0, width, height);
    chart.textContent = "";
    chart.appendChild(fragment);
    zoomInfo.textContent = zoomed === root ? "" : "Zoomed to " + zoomed.name + " (" +
      percent(zoomed.ns, root.ns) + " of all)";
    updateMatches();
  }
  function layout(parent, node, x, w, height) {
    draw(parent, node, x, w, height, false);
    if (node.ns <= 0) return;
    var cx = x;
    for (var i = 0; i < node.children.length; i++) {
      var child = node.children[i];
      var cw = w * child.ns / node.ns;
      if (cw >= MIN_WIDTH) layout(parent, child, cx, cw, height);
      cx += cw;
    }
  }
  function draw(parent, node, x, w, height, ancestor) {
    var el = document.createElement("div");
    el.className = "frame" + (ancestor ? " ancestor" : "");
    el.style.left = x + "px";
    el.style.width = Math.max(w - 1, 0.5) + "px";
    el.style.top = (height - (node.depth + 1) * ROW) + "px";
    el.style.background = color(node);
    el.setAttribute("data-name", node.name);
    if (w > 24) el.textContent = node.name;
    el.node = node;
    parent.appendChild(el);
  }

  function updateMatches() {
    var frames = chart.children;
    for (var i = 0; i < frames.length; i++) {
      frames[i].classList.toggle("match", pattern !== null && pattern.test(frames[i].node.name));
    }
    if (pattern === null) { matchInfo.textContent = ""; return; }
    var matchedNs = matched(zoomed);
    matchInfo.textContent = "Matched: " + percent(matchedNs, zoomed.ns) + " (" + seconds(matchedNs) + ")";
  }
  // Time under matching frames inside `node`, each matching subtree counted once.
  function matched(node) {
    if (pattern.test(node.name)) return node.ns;
    var sum = 0;
    for (var i = 0; i < node.children.length; i++) sum += matched(node.children[i]);
    return sum;
  }
  function setSearch(text) {
    if (!text) { pattern = null; updateMatches(); return; }
    try { pattern = new RegExp(text); } catch (e) {
      pattern = new RegExp(text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
    }
    updateMatches();
  }

  chart.addEventListener("click", function (ev) {
    var el = ev.target.closest(".frame");
    if (!el) return;
    zoomed = el.node;
    render();
  });
  chart.addEventListener("mousemove", function (ev) {
    var el = ev.target.closest(".frame");
    if (!el) { tip.style.display = "none"; return; }
    var n = el.node;
    tip.textContent = "";
    var lines = [n.name, KIND_NAMES[n.kind] + " frame",
      "off-CPU " + seconds(n.ns) + ", " + n.switches + " switches",
      percent(n.ns, root.ns) + " of all" + (zoomed !== root ? ", " + percent(n.ns, zoomed.ns) + " of zoom" : "")];
    for (var i = 0; i < lines.length; i++) {
      var line = document.createElement("div");
      line.textContent = lines[i];
      if (i === 0) line.className = "name";
      tip.appendChild(line);
    }
    tip.style.display = "block";
    var tx = ev.clientX + 14, ty = ev.clientY + 14;
    if (tx + tip.offsetWidth > window.innerWidth) tx = ev.clientX - tip.offsetWidth - 8;
    if (ty + tip.offsetHeight > window.innerHeight) ty = ev.clientY - tip.offsetHeight - 8;
    tip.style.left = Math.max(0, tx) + "px";
    tip.style.top = Math.max(0, ty) + "px";
  });
  chart.addEventListener("mouseleave", function () { tip.style.display = "none"; });
  search.addEventListener("input", function () { setSearch(search.value); });
  document.getElementById("reset").addEventListener("click", function () { zoomed = root; render(); });
  document.getElementById("clear").addEventListener("click", function () { search.value = ""; setSearch(""); });
  document.addEventListener("keydown", function (ev) {
    if (ev.key === "Escape") { zoomed = root; render(); }
    if ((ev.ctrlKey || ev.metaKey) && ev.key === "f") { ev.preventDefault(); search.focus(); }
  });
  var pending = false;
  window.addEventListener("resize", function () {
    if (pending) return;
    pending = true;
    window.requestAnimationFrame(function () { pending = false; render(); });
  });
  var initial = new URLSearchParams(window.location.search).get("search");
  if (initial) { search.value = initial; setSearch(initial); }
  render();
  window.scrollTo(0, document.body.scrollHeight);
})();
