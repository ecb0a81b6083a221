"""The shared renderers (cuvil/report_html.py) and the static report, on hand-checked IR."""
from __future__ import annotations

import html
import json
import re
import shutil
from html.parser import HTMLParser

import pytest

import cuvil
from cuvil.report_html import diff_html, graph_dot, graph_svg, ir_stages, render_report_html, summary_html

from explorer_cases import FOLDABLE_IR

needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz's dot is not installed")


@pytest.fixture(scope="module")
def report():
    return cuvil.explain(FOLDABLE_IR, pipeline="O1")


def cells(table: str, cls: str) -> list[str]:
    """Text of the diff cells with a class, tags removed."""
    found = re.findall(rf'<td class="cv-code {cls}">(.*?)</td>', table)
    return [html.unescape(re.sub(r"<[^>]+>", "", c)) for c in found]


def test_diff_marks_removed_and_added_lines():
    before = "a\nb = 1\nc\n"
    after = "a\nb = 2\nc\nd\n"
    table = diff_html(before, after)
    assert cells(table, "cv-del") == ["b = 1"]
    assert cells(table, "cv-add") == ["b = 2", "d"]
    assert cells(table, "") == ["a", "a", "c", "c"]   # unchanged lines on both sides
    # the token that differs in the edited line is marked on both sides
    assert '<span class="cv-chg">1</span>' in table and '<span class="cv-chg">2</span>' in table


def test_diff_pairs_renumbered_lines_and_marks_only_names():
    before = "  %5 = cuvil.relu %3 : T\n"
    after = "  %2 = cuvil.relu %1 : T\n"
    table = diff_html(before, after)
    changed = re.findall(r'<span class="cv-chg">(.*?)</span>', table)
    assert changed == ["%5", "%3", "%2", "%1"]


def test_diff_context_and_search_and_escaping():
    before = "\n".join(f"line {i}" for i in range(20)) + "\n<x>"
    after = before.replace("line 10", "line ten")
    table = diff_html(before, after, search="LINE", context=1)
    assert cells(table, "") == ["line 9", "line 9", "line 11", "line 11"]
    # case-insensitive matches, also inside an edited line (whose changed token is marked too)
    assert '<mark>line</mark> <span class="cv-chg">ten</span>' in table
    assert "<x>" not in diff_html("<x>", "<y>")       # text is escaped
    assert "no change" in diff_html("same", "same", context=2)


def test_stage_ids_are_stable_across_passes(report):
    stages = ir_stages(report)
    titles = [s.title for s in stages]
    assert titles == ["input", "after verify", "after shape-infer", "after canonicalize", "after cse", "after dce",
                      "after fuse"]
    start = {n.id: n.op for n in stages[0].nodes()}
    assert start == {"%x": "arg", "%0": "cuvil.literal", "%1": "cuvil.mul", "%2": "cuvil.relu",
                     "%3": "cuvil.relu", "%4": "cuvil.add", "return": "cuvil.return"}
    canon = stages[3]
    # canonicalize drops `x * 1.0`: the relus are renumbered (%0, %1) but keep their ids and are rewired
    assert {n.id: n.names for n in canon.nodes()} == {
        "%x": ["%x"], "%2": ["%0"], "%3": ["%1"], "%4": ["%2"], "return": []}
    assert canon.status == {"%2": "changed", "%3": "changed"}
    assert sorted(n.id for n in canon.removed) == ["%0", "%1"]
    cse = stages[4]
    assert [n.id for n in cse.removed] == ["%3"]
    assert next(n for n in cse.nodes() if n.id == "%4").operands == ["%2", "%2"]
    assert stages[5].functions is cse.functions and stages[5].status == {}   # dce changed nothing


def test_new_ops_get_the_pass_position():
    rep = cuvil.CompileReport("r", input_ir=FOLDABLE_IR, passes=[
        {"name": "p", "spec": "p", "changed": True, "ir_before": FOLDABLE_IR,
         "ir_after": FOLDABLE_IR.replace("cuvil.add %2, %3", "cuvil.sub %2, %3")}])
    after = ir_stages(rep)[1]
    assert after.status == {"%4#1": "new", "return": "changed"}
    assert [n.id for n in after.removed] == ["%4"]


def test_program_passes_leave_the_graph_stage_as_it_was():
    program = "program @g (1 steps)\n  step 0 g_0_mul_relu(%x) -> %4 deps=[] priority=1\n"
    rep = cuvil.CompileReport("r", input_ir=FOLDABLE_IR, passes=[
        {"name": "schedule", "spec": "schedule", "changed": True, "stage": "program", "ir_before": program,
         "ir_after": program.replace("priority=1", "priority=2")}])
    stages = ir_stages(rep)
    assert stages[1].functions is stages[0].functions and stages[1].text == FOLDABLE_IR
    # the op counts are those of the graph IR: no op changed, so only the total is listed
    assert re.findall(r"<tr><th>([^<]*)</th><td>([^<]*→[^<]*)</td>", summary_html(rep, stages)) == [("all ops", "5 → 5")]


@needs_dot
def test_graph_svg_has_one_node_per_op_and_clusters(report):
    stages = ir_stages(report)
    svg = graph_svg(stages[-1], [("group A", ["%0", "%1"])])
    # node names are the stable ids with % written v: %x, the first relu (%2) and the add (%4)
    titles = re.findall(r'<g id="node\d+" class="node[^"]*">\s*<title>(.*?)</title>', svg)
    assert sorted(titles) == ["return", "v2", "v4", "vx"]
    edges = re.findall(r'<g id="edge\d+" class="edge">\s*<title>(.*?)</title>', svg)
    assert sorted(html.unescape(e) for e in edges) == ["v2->v4", "v2->v4", "v4->return", "vx->v2"]
    cluster = re.search(r'<g id="clust\d+" class="cluster">\s*<title>cluster_0</title>(.*?)</g>', svg, re.S)
    assert cluster and "group A" in cluster[1]
    body = re.search(r"subgraph cluster_0 \{(.*?)\n\t\}", graph_dot(stages[-1], [("group A", ["%0", "%1"])]), re.S)[1]
    assert sorted(re.findall(r"^\s*(v\w+) \[label", body, re.M)) == ["v2", "v4"]


def test_graph_dot_colours_changed_ops(report):
    dot = graph_dot(ir_stages(report)[3])
    changed = [line for line in dot.splitlines() if "fillcolor" in line]
    assert len(changed) == 2 and all("relu" in line for line in changed)


class _Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.external, self.scripts = [], []

    def handle_starttag(self, tag, attrs):
        for k, v in attrs:
            if k in ("src", "href") and v and not v.startswith(("#", "data:")):   # data: URLs are inline
                self.external.append(v)


def test_static_report_is_self_contained(report, tmp_path):
    path = tmp_path / "r.html"
    report.save_html(path)
    page = path.read_text(encoding="utf-8")
    parser = _Collect()
    parser.feed(page)
    assert parser.external == []                      # no network, no files next to it
    data = json.loads(re.search(r'<script type="application/json" id="cv-data">(.*?)</script>', page, re.S)[1])
    assert [p["spec"] for p in data["passes"]] == ["verify", "shape-infer", "canonicalize", "cse", "dce", "fuse"]
    assert [p["changed"] for p in data["passes"]] == [False, False, True, True, False, True]
    assert data["stageOf"] == [0, 0, 0, 3, 4, 4, 6]   # unchanged passes show the drawing before them
    sections = re.findall(r'<div class="cv-pass" data-i="(\d)" hidden>(.*?)</div></div>', page, re.S)
    assert len(sections) == 6
    assert "did not change the IR" in sections[0][1] and 'class="cv-code cv-del"' in sections[2][1]
    assert "Ops (before → after the pipeline)" in page and "5 → 2" in page


def test_static_report_without_graphviz(report, monkeypatch):
    import cuvil.report_html as rh
    monkeypatch.setattr(rh, "graph_svg", lambda stage, clusters=(): None)
    page = render_report_html(report)
    graph_tab = re.search(r'<section id="cv-t-graph" hidden>(.*?)</section>', page, re.S)[1]
    assert "graphviz is not installed" in graph_tab and "<svg" not in graph_tab


# ----------------------------------------------------------------------------- code, memory, profile

from cuvil import profiler                                        # noqa: E402
from cuvil.profiler.flame import WIDTH, ZOOM_JS, flame_svg       # noqa: E402
from cuvil.report_html import live_bytes, memory_packing_svg, memory_timeline_svg, provenance  # noqa: E402


@pytest.fixture(scope="module")
def native_report():
    """A profiled native compilation: three linear+relu layers, batch 4."""
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[m for _ in range(3) for m in (torch.nn.Linear(32, 32), torch.nn.ReLU())]).eval()
    compiled = cuvil.compile(model)
    compiled.profile(torch.randn(4, 32))
    return compiled.report


def section(page: str, name: str) -> str:
    return re.search(rf'<section id="cv-t-{name}" hidden>(.*?)</section>', page, re.S)[1]


def test_static_page_code_memory_and_profile_tabs(native_report):
    r = native_report
    page = render_report_html(r)
    assert re.findall(r'data-tab="cv-t-(\w+)"', page) == ["pipeline", "graph", "fusion", "code", "memory",
                                                          "profile", "summary", "ir"]
    code = section(page, "code")
    kernels = re.findall(r'<div class="cv-kern" data-k="([^"]+)" hidden>', code)
    assert kernels == [k["name"] for k in r.kernels]
    for k in r.kernels:
        assert html.escape(k["asm"].splitlines()[1]) in code and f"kernel @{k['name']}(" in code
    data = json.loads(re.search(r'<script type="application/json" id="cv-data">(.*?)</script>', page, re.S)[1])
    for s in r.sources:     # a line's kernels are those holding one of its ops
        assert data["sources"][f"{s.file}:{s.line}"] == [k["name"] for k in r.kernels
                                                         if {op["id"] for op in k["ops"]} & set(s.ops)]
    memory = section(page, "memory")
    assert memory.count('<g class="cv-buf') == 2 * len(r.memory["buffers"]) > 0
    prof = section(page, "profile")
    assert prof.count('<svg class="cv-flamesvg"') == 2
    href = re.search(r'<a class="cv-download" download="[^"]+\.trace\.json" href="data:application/json;base64,([^"]+)"',
                     prof)[1]
    trace = json.loads(__import__("base64").b64decode(href))
    assert sum(e["ph"] == "X" and e["cat"] == "run" for e in trace["traceEvents"]) == len(r.profile["run"])


def test_flame_svg_geometry():
    spans = [profiler.Span("a", ("a",), 0, 1000, "compile"), profiler.Span("b", ("a", "b"), 0, 250, "compile"),
             profiler.Span("c", ("a", "c"), 250, 1000, "compile")]
    svg = flame_svg(profiler.Profile("compile", spans))
    frames = re.findall(r'<g class="cv-fl" data-s="(\d+)" data-e="(\d+)" data-n="(\w+)">.*?<rect x="([\d.]+)" '
                        r'y="(\d+)" width="([\d.]+)"', svg, re.S)
    assert [(n, float(x), int(y), float(w)) for _, _, n, x, y, w in frames] == [
        ("compile", 0.0, 0, WIDTH), ("a", 0.0, 20, WIDTH), ("b", 0.0, 38, WIDTH / 4), ("c", WIDTH / 4, 38, WIDTH * 0.75)]
    assert html.unescape(re.search(r'onclick="([^"]*)"', svg)[1]) == ZOOM_JS


def test_memory_pictures_geometry():
    from cuvil.report import CompileReport
    r = CompileReport(name="m", schedule=[{"step": k, "kernel": f"k{k}", "slots": []} for k in range(4)],
                      memory={"arena_bytes": 200, "naive_bytes": 300, "regions": 2, "buffers": [
                          {"name": "%a", "size": 100, "size_expr": "100", "offset": 0, "offset_expr": "0", "region": 0,
                           "first_step": 0, "last_step": 1, "reuses": None},
                          {"name": "%b", "size": 100, "size_expr": "100", "offset": 100, "offset_expr": "100",
                           "region": 1, "first_step": 1, "last_step": 2, "reuses": None},
                          {"name": "%c", "size": 100, "size_expr": "100", "offset": 0, "offset_expr": "0", "region": 0,
                           "first_step": 2, "last_step": 3, "reuses": "%a"}]})
    assert live_bytes(r) == [100, 200, 200, 100]
    bars = re.findall(r'data-name="(%\w)">.*?<rect x="([\d.]+)" y="[\d.]+" width="([\d.]+)"',
                      memory_timeline_svg(r), re.S)
    step = (1000 - 180) / 4          # plot width over 4 steps, after the label column
    assert [(n, float(x), float(w)) for n, x, w in bars] == [
        ("%a", 180, 2 * step), ("%b", 180 + step, 2 * step), ("%c", 180 + 2 * step, 2 * step)]
    rects = re.findall(r'data-name="(%\w)">.*?<rect x="[\d.]+" y="([\d.]+)" width="[\d.]+" height="([\d.]+)"',
                       memory_packing_svg(r, selected="%b"), re.S)
    # 320 units of height for 200 bytes: %a and %c at the bottom half, %b above
    assert [(n, float(y), float(h)) for n, y, h in rects] == [("%a", 176, 160), ("%b", 16, 160), ("%c", 176, 160)]
    assert 'class="cv-buf cv-on" data-name="%b"' in memory_packing_svg(r, selected="%b")
    assert provenance(r).kernels == {}


# ----------------------------------------------------------------------------- fusion

from cuvil.report_html import fusion_clusters, pass_header_html  # noqa: E402

from explorer_cases import FUSION_BLOCK  # noqa: E402


@pytest.fixture(scope="module")
def fused_report():
    ns = {}
    exec(FUSION_BLOCK, ns)
    return cuvil.explain(ns["block"], ns["x"], pipeline="O1")


def cluster_bodies(dot: str) -> list[tuple[str, list[str]]]:
    """(colour, node names) of each cluster in graphviz source."""
    out = []
    for body in re.findall(r"subgraph cluster_\d+ \{(.*?)\n\t\}", dot, re.S):
        colour = re.search(r'\bcolor="(#[0-9a-f]{6})"', body)
        out.append((colour[1] if colour else "", sorted(re.findall(r"^\s*(v\w+) \[label", body, re.M))))
    return out


@needs_dot
def test_graph_boxes_fusion_groups_coloured_by_kernel(fused_report, native_report):
    r = fused_report
    last = ir_stages(r)[-1]
    ids = {name: n.id for n in last.nodes() for name in n.names}
    fused = [g for g in r.fusion["groups"] if g["kind"] != "single"]
    bodies = cluster_bodies(graph_dot(last, fusion_clusters(r)))
    # a box per fused group around exactly the ops that define its values; the group's kernels differ
    assert [names for _, names in bodies] == [sorted(ids[v].replace("%", "v") for v in g["values"]) for g in fused]
    assert len({colour for colour, _ in bodies}) == len({g["kernel"] for g in fused}) == len(fused) >= 2
    svg = graph_svg(last, fusion_clusters(r))
    labels = re.findall(r'<g id="clust\d+" class="cluster cv&#45;fusion">\s*<title>[^<]*</title>.*?<text[^>]*>(.*?)</text>',
                        svg, re.S)
    assert labels == [f"{g['name']} · {g['kernel']}" for g in fused]
    # three identical linear+relu layers run one kernel's code: their boxes have one colour
    n = native_report
    layers = cluster_bodies(graph_dot(ir_stages(n)[-1], fusion_clusters(n)))
    assert len(layers) == 3 and len({colour for colour, _ in layers}) == 1
    assert sum(1 for st in n.schedule if st.get("code_of")) == 2


def test_static_page_fusion_tab(fused_report):
    r = fused_report
    page = render_report_html(r)
    tab = section(page, "fusion")
    groups, refused = r.fusion["groups"], r.fusion["refused"]
    assert re.findall(r'<button data-f="(g\d+)">', tab) == [f"g{i}" for i in range(len(groups))]
    assert re.findall(r'<button data-f="r\d+" data-rule="([^"]+)">', tab) == [r["rule"] for r in refused]
    assert re.findall(r'<option value="([^"]*)">', tab) == [""] + sorted({r["rule"] for r in refused})
    items = dict(re.findall(r'<div class="cv-fuseitem" data-f="(\w+)" hidden>(.*?)</pre></div>', tab, re.S))
    for i, g in enumerate(groups):
        assert f'data-k="{g["kernel"]}"' in items[f"g{i}"]     # the link to its kernel in the Code tab
        assert len(re.findall(r'class="cv-irline cv-hit"', items[f"g{i}"])) == len(g["values"])
    for j, rf in enumerate(refused):
        assert html.escape(rf["reason"]) in items[f"r{j}"]
        assert "cv-irline cv-cand" in items[f"r{j}"] and "cv-irline cv-cons" in items[f"r{j}"]
    # the fuse pass's decisions are in the Fusion tab, not dumped into the pass header
    (fuse,) = [(i, p) for i, p in enumerate(r.passes) if p["name"] == "fuse"]
    header = pass_header_html(*fuse)
    assert f"groups={fuse[1]['statistics']['groups']}" in header and "options" not in header
