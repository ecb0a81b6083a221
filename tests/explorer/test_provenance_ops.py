"""Per-op provenance in the report, the static page and the code panel: a `%%cuvil` cell compiles
x -> linear -> relu -> add (one kernel: a GEMM with the relu and the add in its epilogue), and each
of its ops maps to its own lines of kernel IR, LLVM IR and assembly, and back. Hand-checked facts:
the relu's assembly holds the kernel's only max instruction, the linear's its GEMM's FMAs."""
from __future__ import annotations

import html
import json
import re

import pytest

from cuvil.codegen.target import Target
from cuvil.report import CompileReport
from cuvil.report_html import CODE_VIEWS, provenance, render_report_html

CELL = '''import torch

class LinearReluAdd(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 32)

    def forward(self, x, r):
        y = self.lin(x)
        y = torch.relu(y)
        return y + r

LinearReluAdd()(torch.randn(64, 16), torch.randn(64, 32))
'''
MAX = {"x86_64": r"\bv?maxps\b", "aarch64": r"\bfmax\b"}[Target.host().arch]


@pytest.fixture(scope="module")
def ex(cuvil_cell):
    return cuvil_cell("", CELL).explorer


@pytest.fixture(scope="module")
def kernel(ex):
    (k,) = ex.run.report.kernels
    assert [op["name"] for op in k["ops"]] == ["cuvil.linear", "cuvil.relu", "cuvil.add"]
    return k


def op_id(kernel: dict, name: str) -> int:
    return next(op["id"] for op in kernel["ops"] if op["name"] == f"cuvil.{name}")


def ranges(kernel: dict, op: int, view: str) -> list[list[int]]:
    return next(e[view] for e in kernel["op_lines"] if e["op"] == op)


def lines(kernel: dict, op: int, view: str) -> list[str]:
    rows = kernel[view].splitlines()
    return [rows[n - 1] for a, b in ranges(kernel, op, view) for n in range(a, b + 1)]


def count(kernel: dict, op: int, view: str) -> int:
    return sum(b - a + 1 for a, b in ranges(kernel, op, view))


def code_lines(page: str, cls: str = "", ops: str | None = None) -> list[str]:
    """The lines of code in the runs marked `cls` (and naming `ops`, if given) of rendered code."""
    out = []
    for c, named, body in re.findall(r'<span class="cv-cl ?([\w-]*)"(?: data-ops="([\d ]+)")?>(.*?)</span>'
                                     r'(?=<span class="cv-cl|</div>)', page, re.S):
        if c == cls and (ops is None or named == ops):
            out += html.unescape(re.sub(r"<[^>]+>", "", body)).split("\n")
    return out


def source_key(report, text: str) -> str:
    (s,) = [s for s in report.sources if text in s.text]
    return f"{s.file}:{s.line}"


def test_report_maps_ops_to_their_code_and_back(ex, kernel):
    relu, linear = op_id(kernel, "relu"), op_id(kernel, "linear")
    assert any(re.search(MAX, line) for line in lines(kernel, relu, "asm"))
    # the linear's weight is packed (O3's layout pass): its code is Cuvil's GEMM, inlined
    assert any(re.search(r"\bvfmadd\w*ps\b", line) for line in lines(kernel, linear, "asm"))
    assert [line.strip().split()[0] for line in lines(kernel, linear, "kernel_ir")][0] == "gemm"
    # the op's source line is the one that wrote it
    assert ex.run.report.sources and source_key(ex.run.report, "torch.relu") == provenance(
        ex.run.report).op_source[relu]
    # back: every line of an op's code leads to that op (and, in LLVM IR and assembly, to it alone)
    k = provenance(ex.run.report).kernels[kernel["name"]]
    for e in kernel["op_lines"]:
        for view in CODE_VIEWS:
            for a, b in e[view]:
                found = k.ops_in(view, a, b)
                assert found == [e["op"]] if view != "kernel_ir" else e["op"] in found
    # the mapping survives saving and loading the report
    again = CompileReport.from_json(json.loads(ex.run.report.dumps()))
    assert again.kernels[0]["op_lines"] == kernel["op_lines"]


def test_static_page_links_lines_to_ops(ex, kernel):
    page = render_report_html(ex.run.report)
    relu = op_id(kernel, "relu")
    asm = re.search(r'<div class="cv-kview" data-view="asm">(.*?)</pre>', page, re.S)[1]
    assert code_lines(asm, ops=str(relu)) == lines(kernel, relu, "asm")
    assert "function pickOp(event)" in page and "k.addEventListener('click', pickOp)" in page
    # the op's row says how many lines of each view its code takes
    row = re.search(rf'<tr data-src="[^"]*"><td>{relu}</td>.*?</tr>', page)[0]
    assert f"IR 1 · LLVM {count(kernel, relu, 'llvm_ir')} · asm {count(kernel, relu, 'asm')}" in row


def test_code_panel_from_op_to_lines_and_from_lines_to_op_and_source(ex, kernel):
    report = ex.run.report
    code = ex.select("code")
    relu, linear, add = (op_id(kernel, n) for n in ("relu", "linear", "add"))
    code.view.value = "asm"
    code.op.value = relu                       # an op: its lines are marked in the code shown
    assert code.picked == relu
    assert code_lines(code.code.value, "cv-pick") == lines(kernel, relu, "asm")
    assert re.search(rf'<tr data-src="[^"]*" class="cv-pick"><td>{relu}</td>', code.header.value)
    assert "torch.relu(y)" in code.header.value            # where it came from
    code.view.value = "side"                   # side by side: marked in all three views
    assert code_lines(code.code.value, "cv-pick") == [line for v in CODE_VIEWS for line in lines(kernel, relu, v)]
    # back: lines of the assembly lead to their op and its source line
    code.view.value = "asm"
    first, last = ranges(kernel, linear, "asm")[0]
    code.lines.value = f"{first}-{last}"
    assert code.picked == linear and code.op.value == linear
    assert code.sources.value == source_key(report, "self.lin(x)") == code.source
    # a source line marks the lines of its ops
    code.sources.value = source_key(report, "y + r")
    assert code_lines(code.code.value, "cv-hit") == lines(kernel, add, "asm")
    code.op.value = -1
    assert code.picked is None and 'class="cv-cl cv-pick"' not in code.code.value
