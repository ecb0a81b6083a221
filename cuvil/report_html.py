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

import difflib
import html
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable

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
    """The input IR, then the IR after every pass (a pass that did not change the text shares the
    stage before it, with nothing marked)."""
    stages = [_stage("input", report.input_ir, None, 0)]
    for k, p in enumerate(report.passes, 1):
        prev = stages[-1]
        text = p.get("ir_after")
        title = f"after {p.get('spec') or p['name']}"
        if text is None or text == prev.text:
            stages.append(Stage(title, prev.text, prev.functions))
        else:
            stages.append(_stage(title, text, prev, k))
    return stages


def fusion_clusters(report: "CompileReport") -> list[tuple[str, list[str]]]:
    """Fusion groups as (label, printed value names in the output IR): `report.fusion["groups"]`
    entries `{"name": "g0", "values": ["%3", "%4"], ...}`."""
    return [(str(g.get("name", f"group {i}")), list(g.get("values", [])))
            for i, g in enumerate(report.fusion.get("groups", []))]


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


def graph_dot(stage: Stage, clusters: list[tuple[str, list[str]]] = ()) -> str:
    """Graphviz source of the dataflow graph of a stage; node names are the stable ids, `%` written `v`."""
    import graphviz

    g = graphviz.Digraph("cuvil", graph_attr={"bgcolor": "transparent", "rankdir": "TB", "ranksep": "0.3",
                                              "nodesep": "0.25"},
                         node_attr={"shape": "box", "style": "rounded", "fontname": "Helvetica",
                                    "fontsize": "10", "height": "0.3"},
                         edge_attr={"arrowsize": "0.6"})
    name_to_id = {name: n.id for n in stage.nodes() for name in n.names}
    in_cluster = {}
    for label, names in clusters:
        for name in names:
            if name in name_to_id:
                in_cluster[name_to_id[name]] = label
    bodies = {label: graphviz.Digraph(f"cluster_{i}", graph_attr={"label": label, "style": "dashed"})
              for i, (label, _) in enumerate(clusters)}
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
    for body in bodies.values():
        g.subgraph(body)
    return g.source


def graph_svg(stage: Stage, clusters: list[tuple[str, list[str]]] = ()) -> str | None:
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
        *[(f"phase: {ph['name']}", _ms(ph["time_s"]) + (f" <i>{html.escape(str(ph['error']))}</i>"
                                                         if ph.get("error") else ""))
          for ph in report.phases],
        ("compile time", _ms(sum(ph["time_s"] for ph in report.phases))),
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
        n = check["runs"]
        rows.append(("median time, compiled", f"{_ms(check['compiled_median_s'])} ({n} runs)"))
        if check.get("reference_median_s"):
            ref = check["reference_median_s"]
            rows.append((f"median time, {check['reference']}", f"{_ms(ref)} ({n} runs)"))
            rows.append(("speed", f"<b>{ref / check['compiled_median_s']:.2f}×</b> the reference's"))
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


# ----------------------------------------------------------------------------- pass headers

def pass_label(i: int, p: dict) -> str:
    """`3. ● canonicalize  0.35 ms`: ● changed the IR, ○ did not, ⊘ skipped."""
    mark = "⊘" if p.get("skipped") else ("●" if p.get("changed") else "○")
    return f"{i + 1}. {mark} {p.get('spec') or p['name']}  {_ms(p.get('time_s', 0.0))}"


def pass_header_html(i: int, p: dict) -> str:
    stats = ", ".join(f"{k}={v}" for k, v in p.get("statistics", {}).items())
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
.cv-graph svg .cluster polygon { stroke: currentColor; }
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
.cv-list button.cv-hit { font-weight: 700; }
.cv-main { flex: 1; min-width: 0; }
.cv-controls { margin: 6px 0; display: flex; gap: 8px; align-items: center; flex-wrap: wrap; }
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
    $$('.cv-list button').forEach((b) => b.classList.toggle('cv-on', +b.dataset.i === i));
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
    $$('.cv-list button').forEach((b) => { b.hidden = !vis.has(+b.dataset.i); b.classList.toggle('cv-hit', !!q && vis.has(+b.dataset.i)); });
    $('#cv-found').textContent = q ? vis.size + ' pass(es) match' : '';
    if (vis.size && !vis.has(cur)) show(Math.min(...vis));
  }
  $$('.cv-list button').forEach((b) => b.addEventListener('click', () => show(+b.dataset.i)));
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
})();
"""


def render_report_html(report: "CompileReport") -> str:
    """One self-contained HTML page (inline CSS and JS, no network) with the pipeline, graph,
    summary and IR of a report."""
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
        svg = graph_svg(st, clusters if k == len(stages) - 1 else [])
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
    data = {"passes": [{"spec": p.get("spec") or p["name"], "changed": bool(p.get("changed")),
                        "text": ((p.get("ir_before") or "") + "\n" + (p.get("ir_after") or "")).lower()}
                       for p in passes],
            "stageOf": stage_of}
    options = "".join(f'<option value="{k}">{html.escape(st.title)}</option>' for k, st in enumerate(stages))
    esc = html.escape
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Cuvil report: {esc(report.name)}</title>
<style>{PAGE_CSS}{CSS}</style></head>
<body class="cv-root">
<h2>Cuvil report: {esc(report.name)}</h2>
<p>{esc(report.summary())} · pipeline <code>{esc(report.pipeline)}</code> · cuvil {esc(__version__)}</p>
<nav class="cv-tabs"><button class="cv-on" data-tab="cv-t-pipeline">Pipeline</button><button
 data-tab="cv-t-graph">Graph</button><button data-tab="cv-t-summary">Summary</button><button
 data-tab="cv-t-ir">IR</button></nav>
<div class="cv-page">
<section id="cv-t-pipeline">
 <div class="cv-controls"><button id="cv-prev">◀ prev</button>
  <input id="cv-range" type="range" min="0" max="{max(len(passes) - 1, 0)}" value="0">
  <button id="cv-next">next ▶</button><span id="cv-pos"></span>
  <label><input id="cv-hide" type="checkbox"> hide unchanged passes</label>
  <input id="cv-search" type="search" placeholder="search the IR"><span id="cv-found"></span></div>
 <div class="cv-pipe"><div class="cv-list">{''.join(items) or '<p class="cv-note">no passes</p>'}</div>
 <div class="cv-main">{''.join(sections)}</div></div>
</section>
<section id="cv-t-graph" hidden>
 <div class="cv-controls"><label>IR <select id="cv-stage">{options}</select></label></div>
 {''.join(drawn)}
</section>
<section id="cv-t-summary" hidden>{summary_html(report, stages)}</section>
<section id="cv-t-ir" hidden><h4 class="cv-h">Input IR</h4><pre class="cv-pre cv-scroll">{esc(report.input_ir)}</pre>
<h4 class="cv-h">Output IR</h4><pre class="cv-pre cv-scroll">{esc(report.output_ir)}</pre></section>
</div>
<script type="application/json" id="cv-data">{_script_json(data)}</script>
<script>{_PAGE_JS}</script>
</body></html>
"""
    return page


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
