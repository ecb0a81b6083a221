"""Render a CompileReport as HTML: the IR diff of a pass, the dataflow graph after a pass, the
summary tables, and the standalone page that `CompileReport.save_html` writes.

Pure Python on purpose: the static report must not need Jupyter, and the notebook explorer
(`cuvil_explorer`, which sits on top of cuvil) renders its panels with these same functions, so
the page and the widgets show the same thing. Graphs need graphviz's `dot`; without it they are
left out (`graph_svg` returns None).

Graph node identity. The report holds printed IR, where values are renumbered after every pass,
so nodes get ids that survive passes by matching the ops of consecutive snapshots (by their printed
form with value names blanked out, and by their producers): an op keeps the id it had in the input IR (its SSA name there,
`%3`); an op a pass creates gets its first SSA name and the pass's position (`%1#3`).
"""
from __future__ import annotations

import base64
import difflib
import html
import itertools
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, NamedTuple

from .profiler.flame import fmt_ns

if TYPE_CHECKING:
    from .report import CompileReport

# ----------------------------------------------------------------------------- printed IR -> graph

_VALUE = re.compile(r"%[A-Za-z0-9_.]+")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_FUNC = re.compile(r'^cuvil\.func @(?P<name>"(?:[^"\\]|\\.)*"|[A-Za-z0-9_.$]+)\((?P<args>.*?)\) -> ')
_ARG = re.compile(r"(?P<name>%[A-Za-z0-9_.]+): (?P<type>tensor<[^>]*>)")
_OP = re.compile(r"^(?:(?P<results>%[A-Za-z0-9_.]+(?:, %[A-Za-z0-9_.]+)*) = )?(?P<op>[A-Za-z_][A-Za-z0-9_.]*)"
                 r"(?P<rest>.*)$")
_LOC = re.compile(r' loc\("(?:[^"\\]|\\.)*":\d+(?::\d+)?\)$')

MAX_GRAPH_NODES = 1500   # dot takes minutes beyond this; the panel says so instead


@dataclass
class Node:
    """One op (or function argument) of a printed function."""
    id: str                 # stable across passes (see the module docstring)
    names: list[str]        # printed result names in this snapshot
    op: str                 # "cuvil.relu", "arg" for an argument
    type: str               # result type(s) as printed
    text: str               # the printed line
    key: str                # the line with value names blanked: what alignment compares
    operands: list[str] = field(default_factory=list)   # ids of the producers, in operand order


@dataclass
class Stage:
    """The IR at one point of the pipeline: the input, or after a pass."""
    title: str
    text: str
    functions: dict[str, list[Node]]
    status: dict[str, str] = field(default_factory=dict)   # node id -> "new" | "changed" (vs. the stage before)
    removed: list[Node] = field(default_factory=list)       # nodes of the stage before that are gone

    def nodes(self) -> Iterable[Node]:
        for nodes in self.functions.values():
            yield from nodes

    def op_counts(self) -> Counter:
        return Counter(n.op for n in self.nodes() if n.op not in ("arg", "cuvil.return"))


@dataclass
class _Raw:
    names: list[str]
    op: str
    type: str
    text: str
    key: str
    operand_names: list[str]


def _parse_function_lines(text: str) -> dict[str, list[_Raw]]:
    """Printed IR -> per function, its arguments then its ops, in order."""
    out: dict[str, list[_Raw]] = {}
    current: list[_Raw] | None = None
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith("//") or s == "}":
            continue
        m = _FUNC.match(s)
        if m:
            current = out.setdefault(m["name"].strip('"'), [])
            for a in _ARG.finditer(m["args"]):
                current.append(_Raw([a["name"]], "arg", a["type"], f"{a['name']}: {a['type']}",
                                    f"arg|{a['name']}|{a['type']}", []))
            continue
        m = _OP.match(s)
        if m is None or current is None:
            continue
        current.append(_parse_op(s, m))
    return out


def _parse_op(line: str, m: re.Match) -> _Raw:
    rest = _LOC.sub("", m["rest"])
    blank = _STRING.sub(lambda s: "_" * len(s.group()), rest)   # strings may hold ' {', ' : ' or '%'
    ends = [i for i in (blank.find(" {"), blank.find(" : ")) if i >= 0]
    cut = min(ends) if ends else len(rest)
    operand_part = rest[:cut]
    sig_at = blank.find(" : ")
    sig = rest[sig_at + 3:] if sig_at >= 0 else ""
    rtype = sig.rsplit(" -> ", 1)[-1] if sig else ""
    key = m["op"] + _VALUE.sub("%", operand_part) + m["rest"][cut:]
    names = m["results"].split(", ") if m["results"] else []
    return _Raw(names, m["op"], rtype, line, key, _VALUE.findall(operand_part))


def _unique(wanted: str, taken: set[str]) -> str:
    out, n = wanted, 1
    while out in taken:
        n += 1
        out = f"{wanted}~{n}"
    taken.add(out)
    return out


def _fresh_id(raw: _Raw, position: int, prefix: str, taken: set[str]) -> str:
    base = raw.names[0] if raw.names else ("return" if raw.op == "cuvil.return" else raw.op)
    return _unique(prefix + (base if position == 0 else f"{base}#{position}"), taken)


def _stage(title: str, text: str, before: Stage | None, position: int) -> Stage:
    """Parse a snapshot and give its ops ids, matching them with the ops of the stage before: an op
    with the same printed form (value names blanked) is the same op, the earliest unmatched one
    first and preferably one with the same producers (so CSE keeps the first of two copies); else an
    op of the same kind with the same producers is the same op, edited (attributes, types)."""
    parsed = _parse_function_lines(text)
    stage = Stage(title, text, {})
    prefix = len(parsed) > 1
    taken: set[str] = set()
    for fn, raws in parsed.items():
        prev = before.functions.get(fn, []) if before is not None else []
        by_key: dict[str, list[int]] = {}
        for i, n in enumerate(prev):
            by_key.setdefault(n.key, []).append(i)
        matched: set[int] = set()
        by_name: dict[str, str] = {}
        nodes: list[Node] = []
        for raw in raws:
            operands = [by_name.get(name, name) for name in raw.operand_names]
            same = [i for i in by_key.get(raw.key, []) if i not in matched]
            i = next((i for i in same if prev[i].operands == operands), same[0] if same else None)
            status = "" if i is None or prev[i].operands == operands else "changed"
            if i is None:
                i = next((k for k, n in enumerate(prev) if k not in matched and n.op == raw.op
                          and n.operands == operands), None)
                status = "changed" if i is not None else ("new" if before is not None else "")
            if i is not None:
                matched.add(i)
            node_id = _unique(prev[i].id, taken) if i is not None else \
                _fresh_id(raw, position, f"@{fn}/" if prefix else "", taken)
            node = Node(node_id, raw.names, raw.op, raw.type, raw.text, raw.key, operands)
            nodes.append(node)
            by_name.update((name, node_id) for name in raw.names)
            if status:
                stage.status[node_id] = status
        stage.functions[fn] = nodes
        stage.removed += [n for k, n in enumerate(prev) if k not in matched]
    return stage


def ir_stages(report: "CompileReport") -> list[Stage]:
    """The input IR, then the IR after every pass (a pass that did not change the text, or a program
    pass, which works on the lowered program and leaves the graph IR as it was, shares the stage
    before it, with nothing marked)."""
    stages = [_stage("input", report.input_ir, None, 0)]
    for k, p in enumerate(report.passes, 1):
        prev = stages[-1]
        text = p.get("ir_after")
        title = f"after {p.get('spec') or p['name']}"
        if text is None or text == prev.text or p.get("stage") == "program":
            stages.append(Stage(title, prev.text, prev.functions))
        else:
            stages.append(_stage(title, text, prev, k))
    return stages


# ----------------------------------------------------------------------------- fusion decisions
# `report.fusion` (written by the fuse pass; the compiler adds each group's kernel):
#   {"options": {...}, "groups": [{"id", "name", "ops", "values", "kind", "root", "summary", "kernel"}],
#    "refused": [{"group", "candidate", "candidate_op", "candidate_name", "consumer", "rule", "reason"}]}
# "values" and "candidate"/"consumer" are printed value names in the output IR; "kernel" is None for
# a group that became no kernel (and before native code). Without a fuse pass both lists are empty.

_PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
            "#9c755f", "#bab0ac"]


class Cluster(NamedTuple):
    """A box drawn around ops in the graph."""
    label: str
    values: list[str]       # printed value names of the ops inside
    colour: str = ""


def group_size(g: dict) -> int:
    """Ops in a group, as the fuse pass counts them (literals and views are not counted)."""
    return g.get("size", len(g.get("ops", [])))


def is_fused(g: dict) -> bool:
    """Whether a group holds more than one op."""
    return g["kind"] != "single"


def group_kernel(report: "CompileReport", g: dict) -> str:
    """The kernel a group was compiled to ("" when the report has no such kernel)."""
    return g.get("kernel") if g.get("kernel") in {k["name"] for k in report.kernels} else ""


def fusion_colours(report: "CompileReport") -> list[str]:
    """A colour per group, by the machine code it runs: groups whose kernels share code (the same
    layer repeated) share a colour."""
    code_of = {st["kernel"]: st.get("code_of") or st["kernel"] for st in report.schedule}
    codes: dict[str, str] = {}
    out = []
    for g in report.fusion.get("groups", []):
        kernel = group_kernel(report, g)
        key = code_of.get(kernel, kernel) or f"group {g['name']}"
        out.append(codes.setdefault(key, _PALETTE[len(codes) % len(_PALETTE)]))
    return out


def fusion_clusters(report: "CompileReport") -> list[Cluster]:
    """The groups of more than one op, as graph clusters labelled with the group and its kernel and
    coloured by kernel."""
    out = []
    for g, colour in zip(report.fusion.get("groups", []), fusion_colours(report)):
        if is_fused(g):
            kernel = group_kernel(report, g)
            out.append(Cluster(f"{g['name']} · {kernel}" if kernel else g["name"], list(g["values"]), colour))
    return out


def group_label(g: dict, refused: int = 0) -> str:
    """`g2 · gemm-epilogue · linear + add + relu (3 ops) · 1 refused`."""
    n = group_size(g)
    text = f"{g['name']} · {g['kind']} · {g['summary']} ({n} op{'s' if n != 1 else ''})"
    return text + (f" · {refused} refused" if refused else "")


def refusal_label(r: dict) -> str:
    """`multi-use: %2 softmax → %5`."""
    return f"{r['rule']}: {r['candidate']} {r.get('candidate_name', '').removeprefix('cuvil.')} → {r['consumer']}"


def refusals_of(report: "CompileReport", index: int) -> list[int]:
    """Indices of the refusals recorded for group `index` (by its "id", else its position)."""
    gid = report.fusion["groups"][index]["id"]
    return [j for j, r in enumerate(report.fusion["refused"]) if r["group"] == gid]


def fusion_rules(report: "CompileReport") -> Counter:
    return Counter(r["rule"] for r in report.fusion.get("refused", []))


def fusion_summary_html(report: "CompileReport") -> str:
    """How many groups and refusals (by rule), and the fuse pass's options."""
    groups, refused = report.fusion["groups"], report.fusion["refused"]
    multi = [g for g in groups if is_fused(g)]
    rules = ", ".join(f"{html.escape(rule)} {n}" for rule, n in fusion_rules(report).most_common())
    options = ", ".join(f"{k}={v}" for k, v in report.fusion.get("options", {}).items())
    parts = [f"{len(groups)} group{'s' if len(groups) != 1 else ''}: {len(multi)} fuse several ops "
             f"({sum(group_size(g) for g in multi)} ops in them)",
             f"{len(refused)} candidate{'s' if len(refused) != 1 else ''} refused" + (f" ({rules})" if rules else ""),
             f"options <code>{html.escape(options)}</code>"]
    return '<p class="cv-fusesum">' + " · ".join(parts) + "</p>"


def _ir_lines(report: "CompileReport") -> tuple[list[str], dict[str, int]]:
    """The output IR's lines, and for each printed value name the line that defines it."""
    lines = report.output_ir.splitlines()
    defines: dict[str, int] = {}
    for n, line in enumerate(lines):
        m = _OP.match(line.strip())
        if m and m["results"]:
            for name in m["results"].split(", "):
                defines.setdefault(name, n)
    return lines, defines


def _ir_line(report: "CompileReport", name: str) -> str:
    lines, defines = _ir_lines(report)
    return _LOC.sub("", lines[defines[name]].strip()) if name in defines else f"{name} (not in the output IR)"


def group_details_html(report: "CompileReport", index: int) -> str:
    """A group: kind, what it computes, its ops and values, its kernel, the candidates it refused."""
    g = report.fusion["groups"][index]
    kernel = group_kernel(report, g)
    shared = next((st["code_of"] for st in report.schedule if st["kernel"] == kernel and st.get("code_of")), None)
    rows = [("kind", html.escape(g["kind"])), ("computes", html.escape(g["summary"])),
            ("ops", f"{group_size(g)} (op ids " + ", ".join(map(str, g["ops"])) + ")"),
            ("values", html.escape(", ".join(g["values"])) + f" (root <code>{html.escape(g['root'])}</code>)"),
            ("kernel", f"<code>{html.escape(kernel)}</code>" + (f", runs the code of <code>{html.escape(shared)}</code>"
                                                                   if shared else "") if kernel else "-")]
    refused = [report.fusion["refused"][j] for j in refusals_of(report, index)]
    if refused:
        rows.append(("refused", "<br>".join(f"<code>{html.escape(refusal_label(r))}</code>: {html.escape(r['reason'])}"
                                            for r in refused)))
    return kv_table(f"Group {g['name']}", rows)


def refusal_details_html(report: "CompileReport", index: int) -> str:
    """A refused candidate: the rule and its reason, the group, and the two ops."""
    r = report.fusion["refused"][index]
    group = next((g for g in report.fusion["groups"] if g["id"] == r["group"]), None)
    rows = [("rule", f"<b>{html.escape(r['rule'])}</b>"), ("reason", html.escape(r["reason"])),
            ("group", html.escape(group_label(group)) if group else "-"),
            ("candidate", f'<code class="cv-cand">{html.escape(_ir_line(report, r["candidate"]))}</code>'),
            ("consumer", f'<code class="cv-cons">{html.escape(_ir_line(report, r["consumer"]))}</code>')]
    return kv_table(f"Not fused: {r['candidate']} into {r['consumer']}", rows)


def group_marks(report: "CompileReport", index: int) -> dict[str, str]:
    return dict.fromkeys(report.fusion["groups"][index]["values"], "cv-hit")


def refusal_marks(report: "CompileReport", index: int) -> dict[str, str]:
    r = report.fusion["refused"][index]
    return {r["candidate"]: "cv-cand", r["consumer"]: "cv-cons"}


def fusion_ir_html(report: "CompileReport", marks: dict[str, str], context: int | None = 3) -> str:
    """The output IR, each line of a multi-op group with its group's colour at the left and the
    lines defining the `marks` values (name -> css class) highlighted; with `context`, only the
    marked lines and that many lines around them."""
    lines, defines = _ir_lines(report)
    stripe: dict[int, str] = {}
    for g, colour in zip(report.fusion.get("groups", []), fusion_colours(report)):
        if is_fused(g):
            stripe.update((defines[v], colour) for v in g["values"] if v in defines)
    marked = {defines[name]: cls for name, cls in marks.items() if name in defines}
    keep = set(range(len(lines)))
    if context is not None:
        keep = {n for m in marked for n in range(m - context, m + context + 1) if 0 <= n < len(lines)}
    out, skipped = [], 0
    for n, line in enumerate(lines):
        if n not in keep:
            skipped += 1
            continue
        if skipped:
            out.append(f'<span class="cv-gap">⋯ {skipped} line{"s" if skipped != 1 else ""}</span>')
            skipped = 0
        style = f' style="border-left-color: {stripe[n]}"' if n in stripe else ""
        cls = f"cv-irline {marked[n]}" if n in marked else "cv-irline"
        out.append(f'<span class="{cls}"{style}>{html.escape(_LOC.sub("", line)) or " "}</span>')
    if skipped:
        out.append(f'<span class="cv-gap">⋯ {skipped} line{"s" if skipped != 1 else ""}</span>')
    return f'<pre class="cv-pre cv-fuseir"><div class="cv-irbody">{"".join(out)}</div></pre>'


# ----------------------------------------------------------------------------- graph -> dot -> svg

_STATUS_FILL = {"new": "#2ea04366", "changed": "#d2992266"}


def _dot_name(node_id: str) -> str:
    # graphviz 2.43 mangles '%' in node names when it writes SVG titles (printf-style)
    return node_id.replace("%", "v")


def _short_type(t: str) -> str:
    return re.sub(r"tensor<([^>]*)>", r"\1", t)


def _label(n: Node) -> str:
    if n.op == "arg":
        return f"{n.names[0]}\n{_short_type(n.type)}"
    if n.op == "cuvil.return":
        return "return"
    if n.op == "cuvil.const":
        sym = n.text.split("cuvil.const ", 1)[-1].split(" : ", 1)[0]
        return f"{sym}\n{_short_type(n.type)}"
    lhs = ", ".join(n.names)
    short = n.op[6:] if n.op.startswith("cuvil.") else n.op
    return (f"{lhs} = {short}" if lhs else short) + f"\n{_short_type(n.type)}"


def graph_dot(stage: Stage, clusters: Iterable[Cluster] = ()) -> str:
    """Graphviz source of the dataflow graph of a stage; node names are the stable ids, `%` written `v`.
    Clusters (label, values[, colour]) box the ops that define those values."""
    import graphviz

    g = graphviz.Digraph("cuvil", graph_attr={"bgcolor": "transparent", "rankdir": "TB", "ranksep": "0.3",
                                              "nodesep": "0.25"},
                         node_attr={"shape": "box", "style": "rounded", "fontname": "Helvetica",
                                    "fontsize": "10", "height": "0.3"},
                         edge_attr={"arrowsize": "0.6"})
    name_to_id = {name: n.id for n in stage.nodes() for name in n.names}
    clusters = [Cluster(*c) for c in clusters]
    in_cluster = {name_to_id[name]: i for i, c in enumerate(clusters) for name in c.values if name in name_to_id}
    bodies = [graphviz.Digraph(f"cluster_{i}", graph_attr=_cluster_attrs(c)) for i, c in enumerate(clusters)]
    multi = len(stage.functions) > 1
    for fn, nodes in stage.functions.items():
        target = graphviz.Digraph(f"cluster_fn_{fn}", graph_attr={"label": f"@{fn}"}) if multi else g
        for n in nodes:
            attrs = {"tooltip": f"{n.id}: {n.text}", "class": f"cv-op-{re.sub(r'[^A-Za-z0-9_-]', '_', n.op)}"}
            status = stage.status.get(n.id)
            if status:
                attrs.update(style="rounded,filled,bold", fillcolor=_STATUS_FILL[status])
            if n.op == "arg":
                attrs.update(shape="ellipse")
            elif n.op == "cuvil.return":
                attrs.update(shape="doubleoctagon")
            elif n.op == "cuvil.const":
                attrs.update(style=attrs.get("style", "rounded") + ",dashed", fontsize="8")
            (bodies[in_cluster[n.id]] if n.id in in_cluster else target).node(_dot_name(n.id), _label(n), **attrs)
            for src in n.operands:
                target.edge(_dot_name(src), _dot_name(n.id))
        if multi:
            g.subgraph(target)
    for body in bodies:
        g.subgraph(body)
    return g.source


def _cluster_attrs(c: Cluster) -> dict[str, str]:
    if not c.colour:
        return {"label": c.label, "style": "dashed"}
    return {"label": c.label, "fontname": "Helvetica", "fontsize": "11", "style": "rounded,filled",
            "color": c.colour, "fillcolor": c.colour + "2e", "penwidth": "2", "class": "cv-fusion"}


def graph_svg(stage: Stage, clusters: Iterable[Cluster] = ()) -> str | None:
    """Inline `<svg>` text of a stage's graph, or None when graphviz (package or `dot`) is missing."""
    try:
        import graphviz
    except ImportError:
        return None
    count = sum(1 for _ in stage.nodes())
    if count > MAX_GRAPH_NODES:
        return f'<p class="cv-note">The graph has {count} nodes; it is not drawn above {MAX_GRAPH_NODES}.</p>'
    try:
        svg = graphviz.Source(graph_dot(stage, clusters)).pipe(format="svg").decode()
    except graphviz.ExecutableNotFound:
        return None
    return svg[svg.index("<svg"):]


# ----------------------------------------------------------------------------- line diff

_TOKEN = re.compile(r"%[A-Za-z0-9_.]+|[A-Za-z0-9_.]+|\s+|.")


def _changed_spans(a: str, b: str) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Character spans of `a` and `b` that differ, token by token."""
    ta, tb = _TOKEN.findall(a), _TOKEN.findall(b)
    pa, pb = _offsets(ta), _offsets(tb)
    sa, sb = [], []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, ta, tb, autojunk=False).get_opcodes():
        if tag != "equal":
            sa.append((pa[i1], pa[i2]))
            sb.append((pb[j1], pb[j2]))
    return sa, sb


def _offsets(tokens: list[str]) -> list[int]:
    out = [0]
    for t in tokens:
        out.append(out[-1] + len(t))
    return out


def _marked(line: str, spans: list[tuple[int, int]], search: str) -> str:
    """`line` as HTML with changed spans in `<span class="cv-chg">`, matches of `search`
    (case-insensitive) in `<mark>`, and a trailing `loc(...)` dimmed."""
    flags = [0] * len(line)
    for s, e in spans:
        for i in range(s, e):
            flags[i] |= 1
    if search:
        low, q = line.lower(), search.lower()
        at = low.find(q)
        while at >= 0:
            for i in range(at, at + len(q)):
                flags[i] |= 2
            at = low.find(q, at + len(q))
    loc = _LOC.search(line)
    if loc:
        for i in range(loc.start() + 1, len(line)):
            flags[i] |= 4
    out, i = [], 0
    while i < len(line):
        j = i
        while j < len(line) and flags[j] == flags[i]:
            j += 1
        chunk = html.escape(line[i:j])
        for bit, (start, end) in ((2, ("<mark>", "</mark>")), (1, ('<span class="cv-chg">', "</span>")),
                                  (4, ('<span class="cv-loc">', "</span>"))):
            if flags[i] & bit:
                chunk = start + chunk + end
        out.append(chunk)
        i = j
    return "".join(out)


def _row(ln: int | None, left: str, lcls: str, rn: int | None, right: str, rcls: str) -> str:
    def cells(n, text, cls):
        return (f'<td class="cv-ln {cls}">{"" if n is None else n}</td>'
                f'<td class="cv-code {cls}">{text}</td>')
    return f"<tr>{cells(ln, left, lcls)}{cells(rn, right, rcls)}</tr>"


def _replaced_rows(a: list[str], b: list[str], i0: int, j0: int, search: str) -> list[str]:
    """Rows for a replaced block: lines that differ only in value names (renumbering) are paired
    and their differing tokens marked; the rest are removed on the left, added on the right."""
    rows = []
    blank = difflib.SequenceMatcher(None, [_VALUE.sub("%", x) for x in a], [_VALUE.sub("%", y) for y in b],
                                    autojunk=False)
    for tag, i1, i2, j1, j2 in blank.get_opcodes():
        for d in range(max(i2 - i1, j2 - j1)):
            la = a[i1 + d] if i1 + d < i2 else None
            lb = b[j1 + d] if j1 + d < j2 else None
            sa, sb = _changed_spans(la, lb) if la is not None and lb is not None else ([], [])
            rows.append(_row(i0 + i1 + d + 1 if la is not None else None, _marked(la or "", sa, search),
                             "cv-del" if la is not None else "cv-pad",
                             j0 + j1 + d + 1 if lb is not None else None, _marked(lb or "", sb, search),
                             "cv-add" if lb is not None else "cv-pad"))
    return rows


def diff_html(before: str, after: str, search: str = "", context: int | None = None,
              titles: tuple[str, str] = ("before", "after")) -> str:
    """Side-by-side line diff: removed lines `cv-del` on the left, added `cv-add` on the right,
    the differing tokens of edited lines `cv-chg`, matches of `search` `<mark>`. `context`: show
    only the changes and that many lines around them."""
    a, b = before.splitlines(), after.splitlines()
    sm = difflib.SequenceMatcher(None, a, b, autojunk=False)
    groups = [sm.get_opcodes()] if context is None else list(sm.get_grouped_opcodes(context))
    rows = []
    for gi, group in enumerate(groups):
        if gi:
            rows.append('<tr class="cv-gap"><td colspan="4">⋯</td></tr>')
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                rows += [_row(i1 + d + 1, _marked(a[i1 + d], [], search), "",
                              j1 + d + 1, _marked(b[j1 + d], [], search), "") for d in range(i2 - i1)]
            else:
                rows += _replaced_rows(a[i1:i2], b[j1:j2], i1, j1, search)
    if not rows:
        rows.append('<tr class="cv-gap"><td colspan="4">no change</td></tr>')
    head = "".join(f'<th colspan="2">{html.escape(t)}</th>' for t in titles)
    cols = '<colgroup><col class="cv-lncol"><col><col class="cv-lncol"><col></colgroup>'
    return f'<table class="cv-diff">{cols}<thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


# ----------------------------------------------------------------------------- summary

def _ms(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def kv_table(title: str, rows: list[tuple[str, str]]) -> str:
    """A titled two-column table; values are HTML."""
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<h4 class="cv-h">{html.escape(title)}</h4><table class="cv-kv">{body}</table>'


def summary_html(report: "CompileReport", stages: list[Stage] | None = None,
                 extra: list[tuple[str, list[tuple[str, str]]]] = ()) -> str:
    """Compile phases, passes, op counts before and after, the native code (kernels, arena), the
    check and speed against the reference (`report.profile["vs_eager"]`), the user's source lines."""
    stages = stages or ir_stages(report)
    passes = report.passes
    changed = sum(1 for p in passes if p.get("changed"))
    skipped = sum(1 for p in passes if p.get("skipped"))
    parts = [kv_table("Compilation", [
        ("model", html.escape(report.name)),
        ("pipeline", f"<code>{html.escape(report.pipeline)}</code>"),
        ("passes", f"{len(passes)} ({changed} changed the IR, {skipped} skipped), "
                   f"{_ms(sum(p.get('time_s', 0.0) for p in passes))} in passes"),
        *[(f"phase: {ph['name']}", _ms(ph["time_s"]) + (" (in the background)" if ph.get("background") else "")
           + (f" <i>{html.escape(str(ph['error']))}</i>" if ph.get("error") else ""))
          for ph in report.phases],
        ("compile time", _ms(sum(ph["time_s"] for ph in report.phases if not ph.get("background")))),
    ])]
    before, after = stages[0].op_counts(), stages[-1].op_counts()
    rows = [("all ops", f"{sum(before.values())} → {sum(after.values())}")]
    rows += [(op, f"{before[op]} → {after[op]}") for op in sorted(set(before) | set(after)) if before[op] != after[op]]
    parts.append(kv_table("Ops (before → after the pipeline)", rows))
    if report.kernels:
        parts.append(kv_table("Native code", _native_rows(report)))
    check = report.profile.get("vs_eager")
    if check:
        parts.append(kv_table(f"Against {check['reference']}", _check_rows(check)))
    parts += [kv_table(title, rows) for title, rows in extra]
    if report.sources:
        src = [(f"{s.file.rsplit('/', 1)[-1]}:{s.line}", f"<code>{html.escape(s.text.strip())}</code> "
                f"({len(s.ops)} op{'s' if len(s.ops) != 1 else ''})") for s in report.sources]
        parts.append(kv_table("Source lines", src))
    return '<div class="cv-summary">' + "".join(parts) + "</div>"


def _native_rows(report: "CompileReport") -> list[tuple[str, str]]:
    mem = report.memory
    rows = [("kernels", f"{len(report.kernels)} ({len(report.schedule)} steps)")]
    if mem.get("buffers"):
        rows.append(("arena", f"{fmt_bytes(mem['arena_bytes'])} (naive {fmt_bytes(mem['naive_bytes'])}, "
                              f"{_saving(mem)}) {_at_sizes(mem)}"))
    run = report.profile.get("run") or []
    if run:
        wall = max(r["end_ns"] for r in run) - min(r["start_ns"] for r in run)
        busy = sum(r["end_ns"] - r["start_ns"] for r in run)
        threads = len({r["thread"] for r in run})
        rows.append(("profiled run", f"{fmt_ns(wall)} wall, {fmt_ns(busy)} in kernels on {threads} "
                                     f"thread{'s' if threads != 1 else ''}"))
    return rows


def _check_rows(check: dict) -> list[tuple[str, str]]:
    rows = [("runs on", html.escape(check["engine"])),
            ("max abs error", f"{check['max_abs_err']:.3g}")]
    if check.get("runs"):
        rows.append(("median time, compiled", f"{_ms(check['compiled_median_s'])} ({check['runs']} runs)"))
        if check.get("reference_median_s"):
            ref = check["reference_median_s"]
            rows.append((f"median time, {check['reference']}", f"{_ms(ref)} ({check['reference_runs']} runs)"))
            rows.append(("speed", f"<b>{ref / check['compiled_median_s']:.2f}×</b> as fast as "
                                  f"{html.escape(check['reference'])}"))
    return rows


def fmt_bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    if n < 1024 ** 2:
        return f"{n / 1024:.1f} KiB"
    return f"{n / 1024 ** 2:.2f} MiB"


def _saving(mem: dict) -> str:
    if not mem["naive_bytes"]:
        return "no buffers"
    return f"{100 * (1 - mem['arena_bytes'] / mem['naive_bytes']):.0f}% less"


def _at_sizes(mem: dict) -> str:
    sizes = mem.get("sizes") or {}
    return "at " + ", ".join(f"{k}={v}" for k, v in sizes.items()) if sizes else ""


# ----------------------------------------------------------------------------- kernels: provenance and code

@dataclass
class SourceInfo:
    """A user source line, the ops it produced and the kernels they went into."""
    key: str            # "file:line"
    file: str
    line: int
    text: str
    ops: list[int]
    kernels: list[str]

    @property
    def label(self) -> str:
        return f"{self.file.rsplit('/', 1)[-1]}:{self.line}  {self.text.strip()}"


@dataclass
class KernelInfo:
    """A kernel of the report, where its ops came from and its time in the profiled run."""
    index: int
    data: dict          # the report's kernel entry (name, ops, sources, kernel_ir, llvm_ir, asm, op_lines)
    sources: list[str]  # source keys, in line order
    steps: list[int]    # the schedule steps that run it
    time_ns: int = 0    # in the profiled run
    calls: int = 0      # kernel calls in the profiled run (a split step: one per chunk)

    @property
    def name(self) -> str:
        return self.data["name"]

    def op_code(self, op: int) -> dict[str, list[list[int]]]:
        """Where op `op`'s code is: view -> [first, last] line ranges (empty: no code of its own)."""
        entry = next((e for e in self.data.get("op_lines", []) if e["op"] == op), {})
        return {view: entry.get(view, []) for view in CODE_VIEWS}

    def line_ops(self, view: str) -> dict[int, list[int]]:
        """Line (1-based) of `view` -> the ops whose code it is."""
        out: dict[int, list[int]] = {}
        for e in self.data.get("op_lines", []):
            for first, last in e.get(view, []):
                for n in range(first, last + 1):
                    out.setdefault(n, []).append(e["op"])
        return out

    def ops_in(self, view: str, first: int, last: int) -> list[int]:
        """The ops whose code is in lines `first`..`last` of `view`, in the order they first appear."""
        found = self.line_ops(view)
        return list(dict.fromkeys(op for n in range(first, last + 1) for op in found.get(n, [])))


@dataclass
class Provenance:
    """source line -> graph-IR ops -> kernel -> its code -> its run time, and back."""
    sources: dict[str, SourceInfo]
    kernels: dict[str, KernelInfo]
    op_lines: dict[int, str]       # op id -> the op's line in the output IR
    op_source: dict[int, str]      # op id -> source key
    run_ns: int = 0                # time in kernels in the profiled run

    def kernel_label(self, k: KernelInfo, hit: bool = False) -> str:
        mark = "◆ " if hit else ""
        time = f"  {fmt_ns(k.time_ns)}" if self.run_ns else ""
        return f"{mark}{k.index}. {k.name}{time}"


def _key(file: str, line: int | str) -> str:
    return f"{file}:{line}"


def provenance(report: "CompileReport") -> Provenance:
    by_result: dict[str, str] = {}
    for raws in _parse_function_lines(report.output_ir).values():
        for raw in raws:
            for name in raw.names:
                by_result.setdefault(name, _LOC.sub("", raw.text))
    op_source = {op: _key(s.file, s.line) for s in report.sources for op in s.ops}
    sources = {_key(s.file, s.line): SourceInfo(_key(s.file, s.line), s.file, s.line, s.text, list(s.ops), [])
               for s in report.sources}
    steps: dict[str, list[int]] = {}
    for st in report.schedule:
        steps.setdefault(st["kernel"], []).append(st["step"])
    kernels: dict[str, KernelInfo] = {}
    op_lines: dict[int, str] = {}
    for i, k in enumerate(report.kernels):
        keys = set(k.get("sources", []))
        for op in k["ops"]:
            if op["results"] and op["results"][0] in by_result:
                op_lines[op["id"]] = by_result[op["results"][0]]
            if op["id"] in op_source:
                keys.add(op_source[op["id"]])
        order = {key: n for n, key in enumerate(sources)}
        info = KernelInfo(i, k, sorted(keys, key=lambda key: (order.get(key, len(order)), key)),
                          steps.get(k["name"], []))
        kernels[k["name"]] = info
        for key in info.sources:
            if key in sources:
                sources[key].kernels.append(k["name"])
    kind = {st["step"]: st["kernel"] for st in report.schedule}
    run_ns = 0
    for r in report.profile.get("run") or []:
        k = kernels.get(kind.get(r["step"], r["kernel"]))
        if k is not None:
            k.time_ns += r["end_ns"] - r["start_ns"]
            k.calls += 1
        run_ns += r["end_ns"] - r["start_ns"]
    return Provenance(sources, kernels, op_lines, op_source, run_ns)


CODE_VIEWS = {"kernel_ir": "Kernel IR", "llvm_ir": "LLVM IR", "asm": "Assembly"}
_COMMENT = {"kernel_ir": "//", "llvm_ir": ";", "asm": "#"}
_ASM_LABEL = re.compile(r"^[.\w$]+:")

# Clicking a line of code (or an op's row) marks that op's lines in every view of the kernel and its
# row, and says where the op came from; clicking it again clears the marks. Plain JavaScript in an
# `onclick` attribute (as the flame chart's zoom), so it runs in the static page and in a widget.
PICK_JS = """
const hit = event.target.closest('[data-ops], tr[data-src]');
if (!hit) return;
const root = this.closest('.cv-provroot') || this;
const ops = hit.dataset.ops ? hit.dataset.ops.split(' ') : [hit.cells[0].textContent];
const off = root.dataset.picked === ops.join(' ');
root.dataset.picked = off ? '' : ops.join(' ');
root.querySelectorAll('[data-ops]').forEach((l) => l.classList.toggle('cv-pick',
  !off && l.dataset.ops.split(' ').some((o) => ops.includes(o))));
const rows = [];
root.querySelectorAll('tr[data-src]').forEach((r) => {
  const on = !off && ops.includes(r.cells[0].textContent);
  r.classList.toggle('cv-pick', on);
  if (on) rows.push('op ' + r.cells[0].textContent + ': ' + r.cells[1].textContent +
                    (r.cells[2].textContent ? ' ← ' + r.cells[2].textContent : ''));
});
const info = root.querySelector('.cv-pickinfo');
if (info) info.textContent = rows.join(' · ') || info.dataset.hint;
root.querySelectorAll('.cv-codebody').forEach((b) => {    // scroll the other views to the op's code
  const first = b.querySelector('.cv-pick');
  if (first && !b.contains(hit)) b.parentElement.scrollTop = Math.max(0, first.offsetTop - 40);
});
"""


def code_text_html(text: str, view: str, line_ops: dict[int, list[int]] | None = None,
                   marks: dict[int, str] | None = None) -> str:
    """Kernel IR, LLVM IR or assembly as HTML: comments dimmed, labels and definitions bold. With
    `line_ops` (line -> op ids, `KernelInfo.line_ops`) each run of lines from the same ops is a
    span that names them (`data-ops`), and the lines of an op in `marks` (op id -> CSS class) get
    that class ("cv-pick" first)."""
    lines = [_code_line_html(line, _COMMENT[view]) for line in text.splitlines()]
    if line_ops is None:
        return "\n".join(lines)
    marks = marks or {}
    out = []
    for ops, run in itertools.groupby(enumerate(lines, 1), key=lambda nl: tuple(line_ops.get(nl[0], ()))):
        classes = {marks[op] for op in ops if op in marks}
        cls = "cv-pick" if "cv-pick" in classes else min(classes, default="")
        data = f' data-ops="{" ".join(map(str, ops))}"' if ops else ""
        body = "\n".join(line or " " for _, line in run)
        out.append(f'<span class="cv-cl{" " + cls if cls else ""}"{data}>{body}</span>')
    return f'<div class="cv-codebody">{"".join(out)}</div>'


def _code_line_html(line: str, comment: str) -> str:
    code, sep, rest = line.partition(comment) if comment in line and '"' not in line else (line, "", "")
    body = html.escape(code)
    if _ASM_LABEL.match(code) or code.startswith(("define ", "kernel ")):
        body = f"<b>{body}</b>"
    return body + (f'<span class="cv-dim">{html.escape(sep + rest)}</span>' if sep else "")


def _onclick(inline: bool) -> str:
    return f' onclick="{html.escape(PICK_JS)}"' if inline else ""


def kernel_code_html(kernel: dict | KernelInfo, view: str, marks: dict[int, str] | None = None,
                     inline_js: bool = True) -> str:
    """One view of a kernel's code, or "side": the three next to each other. Given a KernelInfo,
    the lines know their ops (click one to mark its op everywhere: PICK_JS, inline unless the page
    binds it itself) and `marks` colours ops' lines."""
    info = kernel if isinstance(kernel, KernelInfo) else None
    data = info.data if info else kernel

    def block(v: str) -> str:
        lines = info.line_ops(v) if info else None
        return f'<pre class="cv-pre cv-codeblock">{code_text_html(data.get(v) or "", v, lines, marks)}</pre>'
    if view == "side":
        cols = "".join(f'<div><h4 class="cv-h">{title}</h4>{block(v)}</div>' for v, title in CODE_VIEWS.items())
        body = f'<div class="cv-side">{cols}</div>'
    elif not data.get(view):
        return f'<p class="cv-note">The report has no {CODE_VIEWS[view]} for this kernel.</p>'
    else:
        body = block(view)
    return f'<div class="cv-codeviews"{_onclick(inline_js)}>{body}</div>' if info else body


def _line_counts(k: KernelInfo, op: int) -> str:
    """`IR 1 · LLVM 12 · asm 9`: how many lines of each view an op's code takes."""
    code = k.op_code(op)
    counts = [(short, sum(last - first + 1 for first, last in code[v]))
              for v, short in (("kernel_ir", "IR"), ("llvm_ir", "LLVM"), ("asm", "asm"))]
    return " · ".join(f"{short} {n}" for short, n in counts) if any(n for _, n in counts) else "no code of its own"


PICK_HINT = "Click an op or a line of code: the op's code is marked in the kernel IR, LLVM IR and assembly."


def op_code_html(prov: Provenance, name: str, op: int) -> str:
    """One op of a kernel: its IR line, the source line it came from, and the lines of its code in
    the kernel IR, LLVM IR and assembly (and the kernel's time in the profiled run)."""
    k = prov.kernels[name]
    key = prov.op_source.get(op, "")
    src = prov.sources.get(key)
    where = [f"{CODE_VIEWS[v]} {', '.join(f'{a}' if a == b else f'{a}–{b}' for a, b in ranges)}"
             for v, ranges in k.op_code(op).items() if ranges]
    bits = [f"op {op} <code>{html.escape(prov.op_lines.get(op, ''))}</code>",
            f"from <code>{html.escape(src.label if src else key or 'no source line')}</code>",
            "lines: " + ("; ".join(where) if where else "none (no code of its own)")]
    if prov.run_ns:
        bits.append(f"its kernel: {fmt_ns(k.time_ns)} in the profiled run")
    return " · ".join(bits)


def kernel_header_html(prov: Provenance, name: str, source: str = "", picked: int | None = None,
                       inline_js: bool = True) -> str:
    """What a kernel is made of: its graph-IR ops (those from `source` marked, `picked` picked) and
    where their code is, the source lines they came from, the steps that run it and its time in
    the profiled run. Clicking an op marks its lines of code (PICK_JS)."""
    k = prov.kernels[name]
    d = k.data
    bits = [f"<b>{html.escape(name)}</b>", f"<code>{html.escape(d.get('symbol', ''))}</code>",
            "split across threads" if d.get("splittable") else "one thread",
            f"step{'s' if len(k.steps) != 1 else ''} {', '.join(map(str, k.steps)) or '-'}"]
    if prov.run_ns:
        share = 100 * k.time_ns / prov.run_ns if prov.run_ns else 0.0
        bits.append(f"profiled run: {fmt_ns(k.time_ns)} in {k.calls} call{'s' if k.calls != 1 else ''} "
                    f"({share:.1f}% of the time in kernels)")
    rows = []
    for op in d["ops"]:
        key = prov.op_source.get(op["id"], "")
        cls = "cv-pick" if op["id"] == picked else "cv-hit" if source and key == source else ""
        where = html.escape(key.rsplit("/", 1)[-1]) if key else ""
        line = prov.op_lines.get(op["id"], op["name"])
        attr = f' class="{cls}"' if cls else ""
        rows.append(f'<tr data-src="{html.escape(key)}"{attr}>'
                    f'<td>{op["id"]}</td><td><code>{html.escape(line)}</code></td><td>{where}</td>'
                    f'<td class="cv-dim">{_line_counts(k, op["id"])}</td></tr>')
    srcs = []
    for key in k.sources:
        info = prov.sources.get(key)
        text = info.label if info else key.rsplit("/", 1)[-1]
        cls = ' class="cv-hit"' if key == source else ""
        srcs.append(f'<li data-src="{html.escape(key)}"{cls}><code>{html.escape(text)}</code></li>')
    return (f'<div class="cv-kernhead">{" · ".join(bits)}</div>'
            f'<h4 class="cv-h">Graph-IR ops ({len(d["ops"])})</h4>'
            f'<div class="cv-scroll cv-short"><table class="cv-ops"{_onclick(inline_js)}><tr><th>op</th>'
            f'<th>IR</th><th>source</th><th>its code (lines)</th></tr>{"".join(rows)}</table></div>'
            f'<h4 class="cv-h">Source lines</h4><ul class="cv-srcs">{"".join(srcs) or "<li><i>none</i></li>"}</ul>'
            f'<div class="cv-pickinfo cv-note" data-hint="{html.escape(PICK_HINT)}">'
            f'{op_code_html(prov, name, picked) if picked is not None else html.escape(PICK_HINT)}</div>')


def kernel_times_html(prov: Provenance) -> str:
    """The kernels by time in the profiled run, with where they came from."""
    if not prov.run_ns:
        return '<p class="cv-note">No profiled run.</p>'
    rows = []
    for k in sorted(prov.kernels.values(), key=lambda k: -k.time_ns):
        src = ", ".join(key.rsplit("/", 1)[-1] for key in k.sources)
        rows.append(f'<tr><td>{html.escape(k.name)}</td><td class="cv-num">{k.calls}</td>'
                    f'<td class="cv-num">{fmt_ns(k.time_ns)}</td><td class="cv-num">{100 * k.time_ns / prov.run_ns:.1f}%'
                    f"</td><td>{html.escape(src)}</td></tr>")
    return ('<div class="cv-scroll cv-mid"><table class="cv-ops"><tr><th>kernel</th><th>calls</th><th>time</th>'
            '<th>share</th><th>source</th></tr>' + "".join(rows) + "</table></div>")


# ----------------------------------------------------------------------------- memory plan

_PLOT_W, _LEFT, _BAR = 1000, 180, 14


def step_count(report: "CompileReport") -> int:
    last = max((b["last_step"] for b in report.memory.get("buffers", [])), default=-1)
    return max(len(report.schedule), last + 1)


def live_bytes(report: "CompileReport") -> list[int]:
    """Bytes of arena buffers alive at each step (written at or before it, read at or after it)."""
    live = [0] * step_count(report)
    for b in report.memory.get("buffers", []):
        for k in range(b["first_step"], b["last_step"] + 1):
            live[k] += b["size"]
    return live


def _step_kernel(report: "CompileReport", k: int) -> str:
    return report.schedule[k]["kernel"] if k < len(report.schedule) else ""


def memory_summary_html(report: "CompileReport") -> str:
    """Arena, naive sum and peak of live bytes, as numbers and bars."""
    mem = report.memory
    live = live_bytes(report)
    peak = max(live, default=0)
    at = live.index(peak) if live else 0
    rows = [("arena (the plan)", mem["arena_bytes"], "cv-bar-arena"),
            ("naive: one region per buffer", mem["naive_bytes"], "cv-bar-naive"),
            (f"peak live bytes (step {at}, {_step_kernel(report, at)})", peak, "cv-bar-live")]
    top = max(r[1] for r in rows) or 1
    bars = "".join(f'<tr><th>{html.escape(label)}</th><td class="cv-num">{fmt_bytes(n)}</td>'
                   f'<td class="cv-barcell"><div class="cv-bar {cls}" style="width:{100 * n / top:.1f}%"></div></td></tr>'
                   for label, n, cls in rows)
    expr = ""
    if mem.get("arena_bytes_expr") and mem["arena_bytes_expr"] != str(mem["arena_bytes"]):
        expr = (f'<p class="cv-note">sizes {html.escape(_at_sizes(mem))}; as expressions: arena '
                f'<code>{html.escape(mem["arena_bytes_expr"])}</code> bytes, naive '
                f'<code>{html.escape(mem["naive_bytes_expr"])}</code> bytes</p>')
    return (f'<p>{len(mem.get("buffers", []))} buffers in {mem.get("regions", 0)} regions over '
            f'{step_count(report)} steps: the arena is {fmt_bytes(mem["arena_bytes"])}, {_saving(mem)} than '
            f'giving every buffer its own memory.</p><table class="cv-kv cv-bars">{bars}</table>{expr}')


def _axis(n: int, y: float) -> str:
    """Step numbers along the top of a plot."""
    w = (_PLOT_W - _LEFT) / max(n, 1)
    every = max(1, -(-n // 25))
    out = []
    for k in range(n):
        x = _LEFT + k * w
        if k % every == 0:
            out.append(f'<text class="cv-tick" x="{x + w / 2:.1f}" y="{y - 3}" text-anchor="middle">{k}</text>')
    return "".join(out)


def _step_columns(report: "CompileReport", n: int, y: float, height: float, live: list[int]) -> str:
    w = (_PLOT_W - _LEFT) / max(n, 1)
    return "".join(f'<rect class="cv-stepcol" x="{_LEFT + k * w:.1f}" y="{y}" width="{w:.1f}" height="{height}">'
                   f'<title>step {k}: {html.escape(_step_kernel(report, k))}\nlive {fmt_bytes(live[k])}</title></rect>'
                   for k in range(n))


def _buffer_title(b: dict) -> str:
    reuse = f"\ntakes over the region of {b['reuses']}" if b.get("reuses") else ""
    return (f"{b['name']}: {fmt_bytes(b['size'])} ({b['size_expr']} bytes)\n"
            f"steps {b['first_step']}–{b['last_step']}, offset {b['offset']} (region {b['region']}){reuse}")


def memory_timeline_svg(report: "CompileReport", selected: str = "", step: int | None = None) -> str:
    """One bar per buffer from the step that writes it to the last that reads it, coloured by region."""
    bufs = sorted(report.memory.get("buffers", []), key=lambda b: (b["first_step"], b["last_step"], b["name"]))
    n = step_count(report)
    w = (_PLOT_W - _LEFT) / max(n, 1)
    top = 16
    height = top + len(bufs) * _BAR + 4
    parts = [_axis(n, top), _step_columns(report, n, top, height - top, live_bytes(report))]
    if step is not None:
        parts.append(f'<rect class="cv-stepon" x="{_LEFT + step * w:.1f}" y="{top}" width="{w:.1f}" '
                     f'height="{height - top}"/>')
    for i, b in enumerate(bufs):
        y = top + i * _BAR
        on = " cv-on" if b["name"] == selected else ""
        colour = _PALETTE[b["region"] % len(_PALETTE)]
        parts.append(f'<g class="cv-buf{on}" data-name="{html.escape(b["name"])}"><title>{html.escape(_buffer_title(b))}'
                     f'</title><text x="{_LEFT - 6}" y="{y + _BAR - 4}" text-anchor="end">'
                     f'{html.escape(_clip(b["name"], 24))}</text>'
                     f'<rect x="{_LEFT + b["first_step"] * w:.1f}" y="{y + 1}" '
                     f'width="{(b["last_step"] - b["first_step"] + 1) * w:.1f}" height="{_BAR - 3}" rx="2" '
                     f'fill="{colour}"/></g>')
    return (f'<svg class="cv-memsvg cv-timeline" viewBox="0 0 {_PLOT_W} {height}" width="100%">'
            f'{"".join(parts)}</svg>')


def memory_packing_svg(report: "CompileReport", selected: str = "", step: int | None = None) -> str:
    """The arena: offset (up) against step (across), a rectangle per buffer from its offset over
    its size and lifetime. Rectangles side by side at one offset share memory over time."""
    mem = report.memory
    bufs = mem.get("buffers", [])
    n = step_count(report)
    w = (_PLOT_W - _LEFT) / max(n, 1)
    top, plot_h = 16, 320
    arena = max(mem["arena_bytes"], max((b["offset"] + b["size"] for b in bufs), default=0), 1)

    def y(offset: int) -> float:
        return top + plot_h - offset / arena * plot_h

    parts = [_axis(n, top), _step_columns(report, n, top, plot_h, live_bytes(report))]
    for frac in (0, 0.25, 0.5, 0.75, 1):
        off = int(arena * frac)
        parts.append(f'<line class="cv-grid" x1="{_LEFT}" x2="{_PLOT_W}" y1="{y(off):.1f}" y2="{y(off):.1f}"/>'
                     f'<text class="cv-tick" x="{_LEFT - 6}" y="{y(off) + 4:.1f}" text-anchor="end">'
                     f'{fmt_bytes(off)}</text>')
    if step is not None:
        parts.append(f'<rect class="cv-stepon" x="{_LEFT + step * w:.1f}" y="{top}" width="{w:.1f}" height="{plot_h}"/>')
    for b in bufs:
        on = " cv-on" if b["name"] == selected else ""
        x0 = _LEFT + b["first_step"] * w
        width = (b["last_step"] - b["first_step"] + 1) * w
        y1, y0 = y(b["offset"] + b["size"]), y(b["offset"])
        colour = _PALETTE[b["region"] % len(_PALETTE)]
        label = _clip(b["name"], int(width // 6.5)) if y0 - y1 >= 11 else ""
        parts.append(f'<g class="cv-buf{on}" data-name="{html.escape(b["name"])}"><title>{html.escape(_buffer_title(b))}'
                     f'</title><rect x="{x0:.1f}" y="{y1:.1f}" width="{width:.1f}" height="{max(y0 - y1, 1):.1f}" '
                     f'fill="{colour}"/><text x="{x0 + 3:.1f}" y="{y1 + 11:.1f}">{html.escape(label)}</text></g>')
    parts.append(f'<text class="cv-tick" x="{_LEFT}" y="{top + plot_h + 14}">step →   (offset ↑, a rectangle per '
                 f'buffer: its bytes over its lifetime; arena {fmt_bytes(mem["arena_bytes"])})</text>')
    return (f'<svg class="cv-memsvg cv-packing" viewBox="0 0 {_PLOT_W} {top + plot_h + 20}" width="100%">'
            f'{"".join(parts)}</svg>')


def _clip(text: str, n: int) -> str:
    return "" if n < 2 else (text if len(text) <= n else text[:n - 1] + "…")


def buffer_details_html(report: "CompileReport", name: str) -> str:
    """A buffer: size, place, lifetime, the kernels that write and read it."""
    (b,) = [b for b in report.memory["buffers"] if b["name"] == name]
    users = [f"step {st['step']} <code>{html.escape(st['kernel'])}</code>" for st in report.schedule
             if any(s["kind"] == "arena" and s["name"] == name for s in st["slots"])]
    return kv_table(f"Buffer {name}", [
        ("size", f"{fmt_bytes(b['size'])} (<code>{html.escape(b['size_expr'])}</code> bytes)"),
        ("offset", f"{b['offset']} (<code>{html.escape(b['offset_expr'])}</code>), region {b['region']}"),
        ("lives", f"steps {b['first_step']} to {b['last_step']}"),
        ("takes over", html.escape(b["reuses"]) if b.get("reuses") else "a fresh region"),
        ("used by", ", ".join(users) or "-"),
    ])


def step_details_html(report: "CompileReport", step: int) -> str:
    """A step: its kernel and the buffers alive while it runs."""
    live = [b for b in report.memory["buffers"] if b["first_step"] <= step <= b["last_step"]]
    names = ", ".join(f"{html.escape(b['name'])} ({fmt_bytes(b['size'])})" for b in live)
    return kv_table(f"Step {step}", [
        ("kernel", f"<code>{html.escape(_step_kernel(report, step))}</code>"),
        ("live buffers", f"{len(live)}, {fmt_bytes(sum(b['size'] for b in live))}: {names}"),
    ])


# ----------------------------------------------------------------------------- profile exports

def download_links_html(profs: list, name: str) -> str:
    """Links that save the profiles as Chrome trace, speedscope and folded stacks (data URLs: no kernel needed)."""
    from .profiler import render

    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", name) or "cuvil"
    links = []
    for fmt, suffix, mime, label in (("chrome", "trace.json", "application/json", "Chrome trace (Perfetto)"),
                                     ("speedscope", "speedscope.json", "application/json", "speedscope"),
                                     ("folded", "folded.txt", "text/plain", "folded stacks")):
        data = base64.b64encode(render(fmt, *profs, name=name).encode()).decode()
        links.append(f'<a class="cv-download" download="{stem}.{suffix}" href="data:{mime};base64,{data}">'
                     f'⤓ {label}</a>')
    return '<div class="cv-downloads">' + " ".join(links) + "</div>"


# ----------------------------------------------------------------------------- pass headers

def pass_label(i: int, p: dict) -> str:
    """`3. ● canonicalize  0.35 ms`: ● changed the IR, ○ did not, ⊘ skipped."""
    mark = "⊘" if p.get("skipped") else ("●" if p.get("changed") else "○")
    return f"{i + 1}. {mark} {p.get('spec') or p['name']}  {_ms(p.get('time_s', 0.0))}"


def pass_header_html(i: int, p: dict) -> str:
    stats = ", ".join(f"{k}={v}" for k, v in p.get("statistics", {}).items()
                      if not isinstance(v, (dict, list)))    # structured ones (fuse's "fusion") have their own panel
    checks = ", ".join(f"{k}: {v}" for k, v in p.get("checks", {}).items())
    state = (f"skipped ({p['skipped']})" if p.get("skipped")
             else "changed the IR" if p.get("changed") else "IR unchanged")
    bits = [f"<b>{i + 1}. {html.escape(p.get('spec') or p['name'])}</b>", html.escape(state),
            _ms(p.get("time_s", 0.0))]
    if stats:
        bits.append(f"statistics: {html.escape(stats)}")
    if checks:
        bits.append(f"checks: {html.escape(checks)}")
    return '<div class="cv-passhead">' + " · ".join(bits) + "</div>"


# ----------------------------------------------------------------------------- styles

# Colours come from JupyterLab's theme variables (the fallbacks are the light theme), so the
# panels read in light and dark themes; highlights are translucent so they work on both.
CSS = """
.cv-root { color: var(--jp-ui-font-color1, #1f2328); background: var(--jp-layout-color1, #fff);
  font-family: var(--jp-ui-font-family, system-ui, sans-serif); font-size: var(--jp-ui-font-size1, 13px); }
.cv-root code, .cv-diff, .cv-pre { font-family: var(--jp-code-font-family, monospace);
  font-size: var(--jp-code-font-size, 12px); }
.cv-scroll { position: relative; overflow: auto; max-height: 560px; border: 1px solid var(--jp-border-color2, #d0d7de); }
.cv-diff { border-collapse: collapse; width: 100%; table-layout: fixed; }
.cv-diff col.cv-lncol { width: 3.2em; }
.cv-diff th { position: sticky; top: 0; z-index: 1; text-align: left; padding: 2px 6px;
  background: var(--jp-layout-color2, #f6f8fa); color: var(--jp-ui-font-color1, #1f2328); }
.cv-diff td { padding: 0 4px; white-space: pre-wrap; overflow-wrap: anywhere; vertical-align: top; }
.cv-diff td.cv-ln { color: var(--jp-ui-font-color2, #656d76); text-align: right; user-select: none; }
.cv-diff td.cv-code { color: var(--jp-content-font-color1, #1f2328); }
.cv-diff .cv-del { background: rgba(248, 81, 73, 0.22); }
.cv-diff .cv-add { background: rgba(46, 160, 67, 0.25); }
.cv-diff .cv-pad { background: var(--jp-layout-color2, #f6f8fa); }
.cv-diff .cv-chg { background: rgba(210, 153, 34, 0.45); border-radius: 2px; }
.cv-diff .cv-loc { opacity: 0.55; }
.cv-diff td, .cv-kv th, .cv-kv td, .cv-passhead, .cv-note, .cv-legend, .cv-error { line-height: 1.4; }
.cv-diff tr.cv-gap td { text-align: center; color: var(--jp-ui-font-color2, #656d76); }
.cv-root mark { background: rgba(255, 200, 0, 0.6); color: inherit; }
.cv-passhead { margin: 4px 0; }
.cv-note { color: var(--jp-ui-font-color2, #656d76); font-style: italic; }
.cv-h { margin: 8px 0 2px 0; }
.cv-kv th { text-align: left; padding: 1px 12px 1px 0; font-weight: 600; vertical-align: top; }
.cv-kv td { padding: 1px 0; }
.cv-graph { overflow: auto; max-height: 640px; color: var(--jp-ui-font-color1, #1f2328); }
.cv-graph svg .node text, .cv-graph svg .cluster text { fill: currentColor; }
.cv-graph svg .node polygon, .cv-graph svg .node ellipse, .cv-graph svg .node path,
.cv-graph svg .cluster:not(.cv-fusion) polygon { stroke: currentColor; }
.cv-graph svg .edge path { stroke: currentColor; }
.cv-graph svg .edge polygon { stroke: currentColor; fill: currentColor; }
.cv-legend span { display: inline-block; padding: 0 6px; margin-right: 6px; border-radius: 3px; }
.cv-legend .cv-new { background: #2ea04366; } .cv-legend .cv-changed { background: #d2992266; }
.cv-error { border-left: 4px solid var(--jp-error-color1, #d1242f); padding: 6px 10px;
  background: var(--jp-layout-color1, #fff); color: var(--jp-ui-font-color1, #1f2328); }
.cv-error .cv-title { font-weight: 700; color: var(--jp-error-color1, #d1242f); }
.cv-error pre { margin: 6px 0; white-space: pre; overflow: auto; }
.cv-error .cv-focus { background: rgba(248, 81, 73, 0.22); display: inline-block; min-width: 100%; }
.cv-error .cv-hint { color: var(--jp-ui-font-color2, #656d76); }
.cv-dim { opacity: 0.6; }
.cv-warn, .cv-bad { color: var(--jp-warn-color0, #9a6700); }
.cv-root pre.cv-codeblock { max-height: 520px; overflow: auto; margin: 0; padding: 4px 6px; white-space: pre;
  border: 1px solid var(--jp-border-color2, #d0d7de); color: var(--jp-content-font-color1, #1f2328);
  background: var(--jp-layout-color1, #fff); }
.cv-side { display: grid; grid-template-columns: repeat(3, minmax(0, 1fr)); gap: 6px; }
.cv-kernhead { margin: 4px 0; }
.cv-short { max-height: 220px; } .cv-mid { max-height: 360px; }
.cv-ops td.cv-num { white-space: nowrap; text-align: right; }
.cv-ops { border-collapse: collapse; }
.cv-ops th, .cv-ops td { text-align: left; padding: 1px 10px 1px 0; vertical-align: top; }
.cv-root tr.cv-hit, .cv-root li.cv-hit { background: rgba(255, 200, 0, 0.35); }
.cv-root pre.cv-codeblock { position: relative; }
.cv-codebody { display: inline-block; min-width: 100%; }
.cv-root .cv-cl { display: block; }
.cv-root .cv-cl[data-ops], .cv-ops tr[data-src] { cursor: pointer; }
.cv-root .cv-cl[data-ops]:hover { background: rgba(127, 127, 127, 0.15); }
.cv-root .cv-cl.cv-hit { background: rgba(255, 200, 0, 0.35); }
.cv-root .cv-cl.cv-pick, .cv-root tr.cv-pick { background: rgba(9, 105, 218, 0.28); }
.cv-pickinfo { margin: 4px 0; }
.cv-srcs { margin: 2px 0; padding-left: 18px; }
.cv-memsvg { font: 10px var(--jp-code-font-family, monospace); color: var(--jp-ui-font-color1, #1f2328); display: block; }
.cv-memsvg text { fill: currentColor; }
.cv-memsvg .cv-tick { opacity: 0.7; }
.cv-memsvg .cv-stepcol { fill: transparent; }
.cv-memsvg .cv-stepcol:hover { fill: rgba(127, 127, 127, 0.18); }
.cv-memsvg .cv-stepon { fill: rgba(255, 200, 0, 0.35); }
.cv-memsvg .cv-grid { stroke: var(--jp-border-color2, #d0d7de); stroke-dasharray: 2 3; }
.cv-memsvg .cv-buf rect { fill-opacity: 0.75; }
.cv-memsvg .cv-buf:hover rect, .cv-memsvg .cv-buf.cv-on rect { fill-opacity: 1; stroke: currentColor; stroke-width: 1.5; }
.cv-memsvg .cv-buf.cv-on text { font-weight: 700; }
.cv-memwrap { max-height: 480px; overflow: auto; }
.cv-bars .cv-barcell { width: 50%; min-width: 200px; }
.cv-bar { height: 12px; border-radius: 2px; }
.cv-bar-arena { background: #4e79a7; } .cv-bar-naive { background: #bab0ac; } .cv-bar-live { background: #59a14f; }
.cv-kv td.cv-num { text-align: right; padding-right: 10px; }
.cv-flame { color: var(--jp-ui-font-color1, #1f2328); }
.cv-flamesvg { font: 11px var(--jp-code-font-family, monospace); cursor: pointer; display: block; }
.cv-flamesvg text { fill: #1f2328; pointer-events: none; }
.cv-flamesvg text.cv-fl-lane { fill: currentColor; }
.cv-flamesvg .cv-fl:hover rect { stroke: #1f2328; stroke-width: 1; }
.cv-flamesvg .cv-fl-on rect { stroke: var(--jp-brand-color1, #0969da); stroke-width: 2; }
.cv-downloads a { margin-right: 14px; color: var(--jp-content-link-color, #0969da); }
.cv-root pre.cv-fuseir { max-height: 420px; overflow: auto; margin: 0; padding: 2px 0; white-space: pre;
  border: 1px solid var(--jp-border-color2, #d0d7de); color: var(--jp-content-font-color1, #1f2328); }
.cv-fuseir .cv-irbody { display: inline-block; min-width: 100%; }
.cv-fuseir .cv-irline { display: block; border-left: 4px solid transparent; padding-left: 6px; }
.cv-fuseir .cv-gap { display: block; padding-left: 10px; color: var(--jp-ui-font-color2, #656d76); font-style: italic; }
.cv-fuseir .cv-hit { background: rgba(255, 200, 0, 0.35); }
.cv-root .cv-cand { background: rgba(248, 81, 73, 0.28); }
.cv-root .cv-cons { background: rgba(9, 105, 218, 0.25); }
.cv-swatch { display: inline-block; width: 10px; height: 10px; border-radius: 2px; margin-right: 6px; }
"""

# The standalone page has no JupyterLab around it: define the variables (light, and dark when
# the browser prefers it) and a minimal layout for the tabs and the pass list.
PAGE_CSS = """
:root { --jp-layout-color1: #fff; --jp-layout-color2: #f6f8fa; --jp-ui-font-color1: #1f2328;
  --jp-ui-font-color2: #656d76; --jp-content-font-color1: #1f2328; --jp-border-color2: #d0d7de;
  --jp-brand-color1: #0969da; }
@media (prefers-color-scheme: dark) { :root { --jp-layout-color1: #0d1117; --jp-layout-color2: #161b22;
  --jp-ui-font-color1: #e6edf3; --jp-ui-font-color2: #8d96a0; --jp-content-font-color1: #e6edf3;
  --jp-border-color2: #30363d; --jp-brand-color1: #4493f8; } }
body { margin: 0; padding: 12px 16px; }
.cv-tabs button, .cv-controls button { font: inherit; color: inherit; background: var(--jp-layout-color2);
  border: 1px solid var(--jp-border-color2); padding: 3px 10px; cursor: pointer; }
.cv-tabs button.cv-on { border-bottom: 2px solid var(--jp-brand-color1); font-weight: 600; }
.cv-page section[hidden] { display: none; }
.cv-pipe { display: flex; gap: 10px; align-items: flex-start; }
.cv-list { min-width: 220px; max-height: 560px; overflow: auto; border: 1px solid var(--jp-border-color2); }
.cv-list button { display: block; width: 100%; text-align: left; font: inherit; color: inherit;
  background: none; border: 0; padding: 2px 6px; cursor: pointer; white-space: pre; }
.cv-list button.cv-on { background: rgba(9, 105, 218, 0.2); }
.cv-list button[hidden] { display: none; }
.cv-list button.cv-hit { font-weight: 700; }
.cv-main { flex: 1; min-width: 0; }
.cv-controls { margin: 6px 0; display: flex; gap: 8px; align-items: center; flex-wrap: wrap; }
.cv-listhead { font-weight: 600; padding: 2px 6px; border-bottom: 1px solid var(--jp-border-color2); }
.cv-list button.cv-hit::before { content: "◆ "; }
.cv-kviews.cv-side { display: grid; grid-template-columns: repeat(3, minmax(0, 1fr)); gap: 6px; }
.cv-views button.cv-on { border-bottom: 2px solid var(--jp-brand-color1); font-weight: 600; }
.cv-controls input, .cv-controls select { font: inherit; color: inherit; background: var(--jp-layout-color1);
  border: 1px solid var(--jp-border-color2); }
"""

# ----------------------------------------------------------------------------- the standalone page

_PAGE_JS = """
(function () {
  const data = JSON.parse(document.getElementById('cv-data').textContent);
  const $ = (s) => document.querySelector(s), $$ = (s) => Array.from(document.querySelectorAll(s));
  let cur = 0;
  function visible() {
    const hide = $('#cv-hide').checked, q = $('#cv-search').value.toLowerCase();
    return data.passes.map((p, i) => i).filter((i) => (!hide || data.passes[i].changed) &&
      (!q || data.passes[i].text.includes(q)));
  }
  function show(i) {
    cur = i;
    $$('.cv-pass').forEach((s) => { s.hidden = +s.dataset.i !== i; });
    $$('#cv-t-pipeline .cv-list button').forEach((b) => b.classList.toggle('cv-on', +b.dataset.i === i));
    $('#cv-pos').textContent = (i + 1) + ' / ' + data.passes.length + ': ' + data.passes[i].spec;
    $('#cv-range').value = i;
    const box = document.querySelector('.cv-pass[data-i="' + i + '"] .cv-scroll');
    const row = box && box.querySelector('td.cv-del, td.cv-add');
    if (row) box.scrollTop = Math.max(0, row.parentElement.offsetTop - 40);   // to the first change
    showStage(i + 1);
  }
  function showStage(k) {
    $('#cv-stage').value = k;
    const shown = data.stageOf[k];
    $$('.cv-stagegraph').forEach((s) => { s.hidden = +s.dataset.k !== shown; });
  }
  function step(d) {
    const vis = visible();
    if (!vis.length) return;
    const at = vis.indexOf(cur);
    const next = at < 0 ? vis.find((i) => (d > 0 ? i > cur : i < cur)) ?? vis[0] : vis[Math.max(0, Math.min(vis.length - 1, at + d))];
    show(next);
  }
  function filter() {
    const vis = new Set(visible()), q = $('#cv-search').value;
    $$('#cv-t-pipeline .cv-list button').forEach((b) => { b.hidden = !vis.has(+b.dataset.i); b.classList.toggle('cv-hit', !!q && vis.has(+b.dataset.i)); });
    $('#cv-found').textContent = q ? vis.size + ' pass(es) match' : '';
    if (vis.size && !vis.has(cur)) show(Math.min(...vis));
  }
  $$('#cv-t-pipeline .cv-list button').forEach((b) => b.addEventListener('click', () => show(+b.dataset.i)));
  $('#cv-prev').addEventListener('click', () => step(-1));
  $('#cv-next').addEventListener('click', () => step(1));
  $('#cv-range').addEventListener('input', (e) => show(+e.target.value));
  $('#cv-hide').addEventListener('change', filter);
  $('#cv-search').addEventListener('input', filter);
  $('#cv-stage').addEventListener('change', (e) => showStage(+e.target.value));
  document.addEventListener('keydown', (e) => {
    if (e.target.tagName === 'INPUT' || e.target.tagName === 'SELECT') return;
    if (e.key === 'ArrowRight' || e.key === 'ArrowDown') step(1);
    if (e.key === 'ArrowLeft' || e.key === 'ArrowUp') step(-1);
  });
  $$('.cv-tabs button').forEach((b) => b.addEventListener('click', () => {
    $$('.cv-tabs button').forEach((x) => x.classList.toggle('cv-on', x === b));
    $$('.cv-page > section').forEach((s) => { s.hidden = s.id !== b.dataset.tab; });
  }));
  if (data.passes.length) show(0); else showStage(0);
  // Code tab: a source line marks its kernels and ops; a kernel shows its code and marks its lines
  let src = '';
  function showKernel(name) {
    $$('.cv-kernlist button').forEach((b) => b.classList.toggle('cv-on', b.dataset.k === name));
    $$('.cv-kern').forEach((k) => { k.hidden = k.dataset.k !== name; });
    const from = data.kernels[name] || [];
    $$('.cv-srclist button').forEach((b) => b.classList.toggle('cv-hit', from.includes(b.dataset.src)));
  }
  function pickSource(key) {
    src = src === key ? '' : key;
    const hits = src ? data.sources[src] || [] : [];
    $$('.cv-srclist button').forEach((b) => b.classList.toggle('cv-on', b.dataset.src === src));
    $$('.cv-kernlist button').forEach((b) => b.classList.toggle('cv-hit', hits.includes(b.dataset.k)));
    $$('.cv-kern [data-src]').forEach((r) => r.classList.toggle('cv-hit', !!src && r.dataset.src === src));
    $$('.cv-kern').forEach((k) => {    // and the lines of code of the ops from it
      const ops = Array.from(k.querySelectorAll('tr[data-src]')).filter((r) => src && r.dataset.src === src)
        .map((r) => r.cells[0].textContent);
      k.querySelectorAll('[data-ops]').forEach((l) => l.classList.toggle('cv-hit',
        l.dataset.ops.split(' ').some((o) => ops.includes(o))));
    });
    if (hits.length) showKernel(hits[0]);
  }
  function pickOp(event) {""" + PICK_JS + """}
  function showView(kern, view) {
    kern.querySelectorAll('.cv-views button').forEach((b) => b.classList.toggle('cv-on', b.dataset.view === view));
    kern.querySelector('.cv-kviews').classList.toggle('cv-side', view === 'side');
    kern.querySelectorAll('.cv-kview').forEach((v) => { v.hidden = view !== 'side' && v.dataset.view !== view; });
  }
  $$('.cv-srclist button').forEach((b) => b.addEventListener('click', () => pickSource(b.dataset.src)));
  $$('.cv-kernlist button').forEach((b) => b.addEventListener('click', () => showKernel(b.dataset.k)));
  $$('.cv-kern').forEach((k) => {
    k.querySelectorAll('.cv-views button').forEach((b) => b.addEventListener('click', () => showView(k, b.dataset.view)));
    showView(k, 'kernel_ir');
    k.addEventListener('click', pickOp);    // an op or a line of code: mark the op's code in every view
  });
  const first = $('.cv-kernlist button');
  if (first) showKernel(first.dataset.k);
  // Fusion tab: a group or a refusal shows its details; the rule filter narrows the refusals
  function showFusion(key) {
    $$('.cv-fuselist button').forEach((b) => b.classList.toggle('cv-on', b.dataset.f === key));
    $$('.cv-fuseitem').forEach((d) => { d.hidden = d.dataset.f !== key; });
  }
  $$('.cv-fuselist button').forEach((b) => b.addEventListener('click', () => showFusion(b.dataset.f)));
  const rule = $('#cv-fuse-rule');
  if (rule) rule.addEventListener('change', () => $$('.cv-fuselist button[data-rule]').forEach((b) => {
    b.hidden = !!rule.value && b.dataset.rule !== rule.value; }));
  $$('.cv-tokernel').forEach((b) => b.addEventListener('click', () => {
    $$('.cv-tabs button').find((t) => t.dataset.tab.endsWith('-code')).click();
    showKernel(b.dataset.k);
  }));
  const firstFused = $('.cv-fuselist button');
  if (firstFused) showFusion(firstFused.dataset.f);
})();
"""


def render_report_html(report: "CompileReport") -> str:
    """One self-contained HTML page (inline CSS and JS, no network) with the pipeline, graph, fusion,
    code, memory, profile, summary and IR of a report."""
    from . import __version__

    stages = ir_stages(report)
    passes = report.passes
    clusters = fusion_clusters(report)
    # one drawing per distinct stage; a pass that changed nothing shows the drawing before it
    stage_of, drawn = [], []
    for k, st in enumerate(stages):
        if k and st.functions is stages[k - 1].functions:
            stage_of.append(stage_of[-1])
            continue
        stage_of.append(k)
        svg = graph_svg(st, clusters if st.functions is stages[-1].functions else [])
        body = svg if svg is not None else '<p class="cv-note">graphviz is not installed: no graph.</p>'
        drawn.append(f'<div class="cv-stagegraph cv-graph" data-k="{k}" hidden>{graph_notes_html(st)}{body}</div>')

    items, sections = [], []
    for i, p in enumerate(passes):
        items.append(f'<button data-i="{i}">{html.escape(pass_label(i, p))}</button>')
        body = (diff_html(p["ir_before"], p["ir_after"], titles=("before", "after"))
                if p.get("ir_after") is not None and p.get("ir_before") != p.get("ir_after")
                else '<p class="cv-note">This pass did not change the IR.</p>')
        sections.append(f'<div class="cv-pass" data-i="{i}" hidden>{pass_header_html(i, p)}'
                        f'<div class="cv-scroll">{body}</div></div>')
    prov = provenance(report)
    data = {"passes": [{"spec": p.get("spec") or p["name"], "changed": bool(p.get("changed")),
                        "text": ((p.get("ir_before") or "") + "\n" + (p.get("ir_after") or "")).lower()}
                       for p in passes],
            "stageOf": stage_of,
            "sources": {key: s.kernels for key, s in prov.sources.items()},
            "kernels": {name: k.sources for name, k in prov.kernels.items()}}
    options = "".join(f'<option value="{k}">{html.escape(st.title)}</option>' for k, st in enumerate(stages))
    esc = html.escape
    tabs = [("pipeline", "Pipeline", f"""
 <div class="cv-controls"><button id="cv-prev">◀ prev</button>
  <input id="cv-range" type="range" min="0" max="{max(len(passes) - 1, 0)}" value="0">
  <button id="cv-next">next ▶</button><span id="cv-pos"></span>
  <label><input id="cv-hide" type="checkbox"> hide unchanged passes</label>
  <input id="cv-search" type="search" placeholder="search the IR"><span id="cv-found"></span></div>
 <div class="cv-pipe"><div class="cv-list">{''.join(items) or '<p class="cv-note">no passes</p>'}</div>
 <div class="cv-main">{''.join(sections)}</div></div>"""),
            ("graph", "Graph", f"""
 <div class="cv-controls"><label>IR <select id="cv-stage">{options}</select></label></div>
 {''.join(drawn)}""")]
    if report.fusion.get("groups") or report.fusion.get("refused"):
        tabs.append(("fusion", "Fusion", _static_fusion(report)))
    if report.kernels:
        tabs.append(("code", "Code", _static_code(prov)))
    if report.memory.get("buffers"):
        tabs.append(("memory", "Memory", memory_summary_html(report) + '<h4 class="cv-h">Buffer lifetimes</h4>'
                     f'<div class="cv-memwrap">{memory_timeline_svg(report)}</div>'
                     '<h4 class="cv-h">Arena packing</h4>' + memory_packing_svg(report)))
    if report.phases:
        tabs.append(("profile", "Profile", _static_profile(report, prov)))
    tabs += [("summary", "Summary", summary_html(report, stages)),
             ("ir", "IR", f"""<h4 class="cv-h">Input IR</h4><pre class="cv-pre cv-scroll">{esc(report.input_ir)}</pre>
<h4 class="cv-h">Output IR</h4><pre class="cv-pre cv-scroll">{esc(report.output_ir)}</pre>""")]
    on = ' class="cv-on"'
    nav = "".join(f'<button{on if i == 0 else ""} data-tab="cv-t-{key}">{title}</button>'
                  for i, (key, title, _) in enumerate(tabs))
    body = "\n".join(f'<section id="cv-t-{key}"{" hidden" if i else ""}>{content}</section>'
                     for i, (key, _, content) in enumerate(tabs))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Cuvil report: {esc(report.name)}</title>
<style>{PAGE_CSS}{CSS}</style></head>
<body class="cv-root">
<h2>Cuvil report: {esc(report.name)}</h2>
<p>{esc(report.summary())} · pipeline <code>{esc(report.pipeline)}</code> · cuvil {esc(__version__)}</p>
<nav class="cv-tabs">{nav}</nav>
<div class="cv-page">
{body}
</div>
<script type="application/json" id="cv-data">{_script_json(data)}</script>
<script>{_PAGE_JS}</script>
</body></html>
"""


def _static_code(prov: Provenance) -> str:
    """The Code tab of the static page: source lines, kernels, and each kernel's code (views as tabs)."""
    srcs = "".join(f'<button data-src="{html.escape(key)}">{html.escape(s.label)}</button>'
                   for key, s in prov.sources.items())
    kerns = "".join(f'<button data-k="{html.escape(name)}">{html.escape(prov.kernel_label(k))}</button>'
                    for name, k in prov.kernels.items())
    views = "".join(f'<button data-view="{v}">{title}</button>' for v, title in [*CODE_VIEWS.items(),
                                                                                  ("side", "Side by side")])
    bodies = "".join(
        f'<div class="cv-kern" data-k="{html.escape(name)}" hidden>'
        f'{kernel_header_html(prov, name, inline_js=False)}'
        f'<div class="cv-controls cv-views">{views}</div><div class="cv-kviews">'
        + "".join(f'<div class="cv-kview" data-view="{v}"><h4 class="cv-h">{title}</h4>'
                  f'{kernel_code_html(k, v, inline_js=False)}</div>' for v, title in CODE_VIEWS.items())
        + "</div></div>" for name, k in prov.kernels.items())
    return (f'<div class="cv-pipe"><div class="cv-list cv-srclist"><div class="cv-listhead">source lines</div>'
            f'{srcs or "<p class=cv-note>none</p>"}</div><div class="cv-list cv-kernlist"><div class="cv-listhead">'
            f'kernels</div>{kerns}</div><div class="cv-main">{bodies}</div></div>')


def _static_fusion(report: "CompileReport") -> str:
    """The Fusion tab of the static page: the groups and the refusals (filtered by rule); each shows
    its details and its place in the output IR, and a group links to its kernel in the Code tab."""
    esc = html.escape
    groups, refused = report.fusion.get("groups", []), report.fusion.get("refused", [])
    colours = fusion_colours(report)
    items, bodies = [], []
    for i, (g, colour) in enumerate(zip(groups, colours)):
        key = f"g{i}"
        items.append(f'<button data-f="{key}"><span class="cv-swatch" style="background: {colour}"></span>'
                     f'{esc(group_label(g, len(refusals_of(report, i))))}</button>')
        kernel = group_kernel(report, g)
        link = (f'<div class="cv-controls"><button class="cv-tokernel" data-k="{esc(kernel)}">show kernel '
                f'{esc(kernel)} in the Code tab</button></div>') if kernel else ""
        bodies.append(f'<div class="cv-fuseitem" data-f="{key}" hidden>{group_details_html(report, i)}{link}'
                      f'{fusion_ir_html(report, group_marks(report, i))}</div>')
    refused_items = []
    for j, r in enumerate(refused):
        key = f"r{j}"
        refused_items.append(f'<button data-f="{key}" data-rule="{esc(r["rule"])}">{esc(refusal_label(r))}</button>')
        bodies.append(f'<div class="cv-fuseitem" data-f="{key}" hidden>{refusal_details_html(report, j)}'
                      f'{fusion_ir_html(report, refusal_marks(report, j))}</div>')
    rules = "".join(f'<option value="{esc(rule)}">{esc(rule)} ({n})</option>'
                    for rule, n in sorted(fusion_rules(report).items()))
    return (f'{fusion_summary_html(report)}<div class="cv-controls"><label>rule <select id="cv-fuse-rule">'
            f'<option value="">all rules</option>{rules}</select></label></div>'
            f'<div class="cv-pipe"><div class="cv-list cv-fuselist"><div class="cv-listhead">groups</div>'
            f'{"".join(items) or "<p class=cv-note>none</p>"}</div><div class="cv-list cv-fuselist">'
            f'<div class="cv-listhead">refused candidates</div>{"".join(refused_items) or "<p class=cv-note>none</p>"}'
            f'</div><div class="cv-main">{"".join(bodies)}</div></div>')


def _static_profile(report: "CompileReport", prov: Provenance) -> str:
    from .profiler import profiles
    from .profiler.flame import flame_html

    profs = profiles(report)
    parts = [download_links_html(profs, report.name)]
    for prof in profs:
        parts.append(f'<h4 class="cv-h">{"Compile phases" if prof.name == "compile" else "Run, per thread"}</h4>'
                     + flame_html(prof))
    if prov.run_ns:
        parts.append('<h4 class="cv-h">Kernels by time</h4>' + kernel_times_html(prov))
    return "".join(parts)


def graph_notes_html(stage: Stage) -> str:
    """The legend, and what the pass removed (removed nodes are not in the drawing)."""
    parts = ['<div class="cv-legend"><span class="cv-new">new op</span>'
             '<span class="cv-changed">edited or rewired op</span></div>']
    if stage.removed:
        gone = ", ".join(f"{n.id} ({n.op})" for n in stage.removed)
        parts.append(f'<p class="cv-note">removed: {html.escape(gone)}</p>')
    return "".join(parts)


def _script_json(data) -> str:
    """JSON that is safe inside a <script> element."""
    return json.dumps(data).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
