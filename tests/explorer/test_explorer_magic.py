"""The `%%cuvil` magic in an in-process IPython shell: the panels and their controls, the run and its
check against eager PyTorch, the cell cache, and the error panel."""
from __future__ import annotations

import re
import shutil

import ipywidgets as W
import pytest
import torch

import cuvil
from cuvil.passes import unregister_pass

from explorer_cases import FOLDABLE, FOLDABLE_IR

O1 = [p.spec() for p in cuvil.Pipeline.parse("O1")]


@pytest.fixture(scope="module")
def foldable(cuvil_cell):
    """One compilation of FOLDABLE through O1, shared by the tests that only look at it."""
    return cuvil_cell("--passes O1", FOLDABLE)


def test_bound_names_and_result_against_eager(foldable):
    bound, ex = foldable.bound, foldable.explorer
    assert bound["_cuvil_report"] is ex.run.report and bound["_cuvil_compiled"] is ex.run.compiled
    x = ex.run.target.args[0]
    f = ex.run.target.fn
    # independent reference: the cell's function run eagerly on the same input
    expected = f(x)
    assert torch.allclose(bound["_cuvil_result"], expected, rtol=1.3e-6, atol=1e-5)
    assert ex.run.max_abs_err == pytest.approx(float((bound["_cuvil_result"] - expected).abs().max()), abs=1e-7)
    # the compiled callable takes another size of the dynamic dim
    x7 = torch.randn(7, 8)
    assert torch.allclose(bound["_cuvil_compiled"](x7), f(x7), rtol=1.3e-6, atol=1e-5)


def test_explorer_widget_tree(foldable):
    ex = foldable.explorer
    (shown,) = foldable.shown
    assert shown is ex.widget
    # one fused kernel, no arena: no Memory tab
    assert ex.tab.titles == ("Pipeline", "Graph", "Fusion", "Code", "Profile", "Summary")
    pipe = ex.panels["pipeline"]
    assert [label.split()[2] for label, _ in pipe.list.options] == O1
    marks = [label.split()[1] for label, _ in pipe.list.options]
    assert marks == ["●" if p["changed"] else "○" for p in ex.run.report.passes]
    assert marks == ["○", "○", "●", "●", "○", "●"]   # canonicalize, cse and fuse change FOLDABLE, the rest do not


def test_stepping_with_buttons_slider_and_list(cuvil_cell):
    ex = cuvil_cell("--force --passes O1", FOLDABLE).explorer
    pipe = ex.panels["pipeline"]
    assert pipe.current == 0 and ex.state.stage == 1 and pipe.slider.value == 1
    assert "cv-add" not in pipe.diff.value            # verify changes nothing
    pipe.next.click()
    pipe.next.click()
    assert pipe.current == 2 and pipe.slider.value == 3 and pipe.list.value == 2 and ex.state.stage == 3
    assert "canonicalize" in pipe.position.value
    removed = re.findall(r'<td class="cv-code cv-del">(.*?)</td>', pipe.diff.value)
    assert any("cuvil.mul" in r for r in removed) and any("cuvil.permute" in r for r in removed)
    pipe.prev.click()
    assert pipe.current == 1
    pipe.slider.value = 4
    assert pipe.current == 3 and pipe.list.value == 3 and "cse" in pipe.header.value
    pipe.list.value = 0
    assert pipe.current == 0 and pipe.slider.value == 1
    pipe.prev.click()                                 # stays at the first pass
    assert pipe.current == 0


def test_hide_unchanged_and_search(cuvil_cell):
    ex = cuvil_cell("--force --passes O1", FOLDABLE).explorer
    pipe = ex.panels["pipeline"]
    pipe.hide.value = True
    assert [i for _, i in pipe.list.options] == [2, 3, 5] and pipe.current == 2 and pipe.slider.max == 3
    pipe.next.click()
    assert pipe.current == 3
    pipe.next.click()
    assert pipe.current == 5
    pipe.next.click()                                 # the last visible pass
    assert pipe.current == 5
    pipe.hide.value = False
    pipe.select(4)
    pipe.search.value = "PERMUTE"                     # only before canonicalize removed them
    assert pipe.matches() == [0, 1, 2] and pipe.current == 0
    assert "in 3 of 6 passes" in pipe.found.value and "<mark>permute</mark>" in pipe.diff.value
    pipe.find_next.click()
    pipe.find_next.click()
    assert pipe.current == 2
    pipe.find_next.click()                            # wraps around
    assert pipe.current == 0
    pipe.search.value = "no such text"
    assert pipe.found.value == "not found" and pipe.current == 0
    pipe.context.value = True
    assert "no change" in pipe.diff.value             # verify: no changed lines to show


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz's dot is not installed")
def test_graph_panel_draws_lazily_and_follows_the_pipeline(cuvil_cell):
    ex = cuvil_cell("--force --passes O1", FOLDABLE).explorer
    graph = ex.panels["graph"]
    assert "<svg" not in graph.svg.value              # not drawn until its tab is opened
    ex.panels["pipeline"].select(2)                   # canonicalize
    ex.select("graph")
    assert graph.stage_pick.value == 3
    titles = re.findall(r'class="node[^"]*">\s*<title>(.*?)</title>', graph.svg.value)
    # after canonicalize: x, full, add, two relus, add, return (the mul and the permutes are gone)
    assert len(titles) == 7
    assert "removed:" in graph.notes.value and "cuvil.mul" in graph.notes.value
    graph.stage_pick.value = 4                        # picking a stage moves the pipeline panel
    assert ex.panels["pipeline"].current == 3
    assert len(re.findall(r'class="node[^"]*">', graph.svg.value)) == 6


def test_summary_panel(foldable):
    html = foldable.explorer.panels["summary"].widget.value
    assert "all ops</th><td>9 → 4" in html             # hand-checked, see conftest.FOLDABLE
    assert "max abs error vs eager PyTorch" in html and "phase: import" in html
    assert "y = x * 1.0 + torch.zeros(8)" in html      # the user's source lines


def test_cache_hit_and_what_invalidates_it(cuvil_cell, shell):
    first = cuvil_cell("", FOLDABLE).explorer.run
    again = cuvil_cell("", FOLDABLE).explorer.run
    assert again is first and again.cached
    # another option line, another pipeline: a miss
    assert cuvil_cell("--passes canonicalize", FOLDABLE).explorer.run is not first
    # a variable the cell reads, rebound: a miss
    shell.user_ns["scale"] = torch.ones(8)
    body = 'def h(x: "f32[B,8]"):\n    return x * scale\n'
    a = cuvil_cell("", body).explorer.run
    assert cuvil_cell("", body).explorer.run is a
    shell.user_ns["scale"] = torch.full((8,), 2.0)
    b = cuvil_cell("", body).explorer.run
    assert b is not a and not b.cached
    assert torch.allclose(b.result, 2 * b.target.args[0])
    assert cuvil_cell("--force", body).explorer.run is not b


def test_a_model_changed_in_place_is_compiled_again(cuvil_cell, shell):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    shell.user_ns.update(net=net, x=torch.randn(4, 8))
    first = cuvil_cell("", "net(x)").explorer.run
    assert cuvil_cell("", "net(x)").explorer.run is first
    with torch.no_grad():
        net[0].weight.data.mul_(2.0)             # .data: no version counter sees it
    doubled = cuvil_cell("", "net(x)").explorer.run
    assert doubled is not first and not doubled.cached
    with torch.no_grad():
        torch.testing.assert_close(doubled.result, net(shell.user_ns["x"]))
    net[1] = torch.nn.Tanh()                      # a swapped submodule
    swapped = cuvil_cell("", "net(x)").explorer.run
    assert swapped is not doubled
    with torch.no_grad():
        torch.testing.assert_close(swapped.result, net(shell.user_ns["x"]))
    assert cuvil_cell("", "net(x)").explorer.run is swapped


def test_redefined_pass_misses_the_cache(cuvil_cell):
    def define(factor):
        @cuvil.register_pass("test-scale-literals")
        def scale_literals(module):
            for fn in module.functions.values():
                for op in fn.ops:
                    if op.name == "cuvil.literal":
                        op.attrs["value"] = op.attrs["value"] * factor
            return True
    try:
        define(1.0)
        body = 'def k(x: "f32[B,4]"):\n    return x * 3.0\n'
        a = cuvil_cell("--passes verify,test-scale-literals", body).explorer.run
        assert a.max_abs_err == 0.0
        define(2.0)                                    # a wrong pass: x * 6.0 instead of x * 3.0
        b = cuvil_cell("--passes verify,test-scale-literals", body).explorer.run
        assert b is not a
        x = b.target.args[0]
        assert b.max_abs_err == pytest.approx(float((3 * x).abs().max()), rel=1e-6) and b.max_abs_err > 0
    finally:
        unregister_pass("test-scale-literals")


def test_ir_cell_runs_against_the_input_ir(cuvil_cell):
    ex = cuvil_cell("--passes O1", FOLDABLE_IR).explorer
    run = ex.run
    assert run.target.is_ir and run.reference.startswith("the input IR")
    assert run.max_abs_err == 0.0 and run.result.shape == (4, 8)
    x = torch.randn(4, 8)
    assert torch.equal(run.compiled(x), 2 * torch.relu(x))
    assert [p["changed"] for p in run.report.passes] == [False, False, True, True, False, True]


def test_no_run_panels_and_html_options(cuvil_cell, tmp_path):
    path = tmp_path / "r.html"
    out = cuvil_cell(f"--no-run --panels summary,pipeline --html {path}", FOLDABLE_IR)
    ex = out.explorer
    assert out.bound["_cuvil_result"] is None and ex.run.result is None
    assert ex.tab.titles == ("Pipeline", "Summary")
    assert "max abs error" not in ex.panels["summary"].widget.value
    assert path.read_text().startswith("<!DOCTYPE html>")


@pytest.mark.parametrize("body", [FOLDABLE, FOLDABLE_IR], ids=["python", "ir"])
def test_target_option_shows_another_machines_code_without_running_it(cuvil_cell, body):
    out = cuvil_cell("--target aarch64 --panels code,summary", body)
    ex = out.explorer
    assert out.bound["_cuvil_result"] is None and ex.run.result is None
    asm = "".join(k["asm"] for k in ex.run.report.kernels)
    assert re.search(r"\bv\d+\.4s\b", asm), asm             # NEON registers: AArch64 code
    assert "compiled for aarch64" in ex.panels["summary"].widget.value


LINEAR_CELL = """import torch
torch.manual_seed(0)
layer = torch.nn.Linear(64, 32)
layer(torch.randn(4, 64))
"""


def test_precision_option_gives_autocast_numerics(cuvil_cell):
    out = cuvil_cell("--precision bf16 --panels pipeline,summary", LINEAR_CELL)
    ex = out.explorer
    layer, (x,) = ex.run.target.fn, ex.run.target.args
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = layer(x).float()
    result = out.bound["_cuvil_result"]
    assert (result - autocast).abs().max() <= 2 * 2.0 ** -8 * autocast.abs().max()
    assert ex.run.max_abs_err > 1e-4                         # against fp32 eager: bf16's error shows
    assert "mixed-precision" in [p["name"] for p in ex.run.report.passes]
    assert "<th>precision</th><td>bf16: torch.autocast's numerics" in ex.panels["summary"].widget.value
    assert "int8" in cuvil_cell("--precision int8", LINEAR_CELL).error.message


def test_an_unknown_target_is_an_option_error(cuvil_cell):
    assert "sparc" in cuvil_cell("--target sparc", FOLDABLE).error.message


def test_a_panel_is_one_small_class(cuvil_cell):
    from cuvil_explorer.panels import _PANELS, Panel, register_panel

    @register_panel
    class PassCount(Panel):
        name, title, order = "test-count", "Count", 5

        def build(self):
            return W.HTML(f"{len(self.run.report.passes)} passes")

    try:
        ex = cuvil_cell("--panels test-count,pipeline --passes O1", FOLDABLE_IR).explorer
        assert ex.tab.titles == ("Count", "Pipeline") and ex.panels["test-count"].widget.value == "6 passes"
    finally:
        _PANELS.pop("test-count")


# ----------------------------------------------------------------------------- the error panel

def shown_html(outcome) -> str:
    (display,) = outcome.shown
    return display.data


def test_python_syntax_error_shows_line_and_caret(cuvil_cell):
    out = cuvil_cell("", "import torch\ndef f(x):\n    return x +\n")
    err = out.error
    assert err.kind == "Python syntax error" and err.where == "cell line 4, column 15"
    assert (4, "    return x +") in err.snippet
    html = shown_html(out)
    assert '<span class="cv-focus">4 |     return x +</span>\n' + " " * 18 + "^" in html
    assert "Traceback" not in html and out.bound["_cuvil_report"] is None


def test_ir_parse_error_shows_line_and_caret(cuvil_cell):
    out = cuvil_cell("", FOLDABLE_IR.replace("cuvil.relu %1 :", "cuvil.relu %7 :", 1))
    err = out.error
    assert err.kind == "IR error" and "undefined value '%7'" in err.message
    assert err.where == "cell line 6, column 19" and err.focus == 6
    assert dict(err.snippet)[6] == "  %2 = cuvil.relu %7 : tensor<4x8xf32> -> tensor<4x8xf32>"


def test_unsupported_op_points_at_the_users_line(cuvil_cell):
    out = cuvil_cell("", 'import torch\ndef s(x: "f32[B,16]"):\n    y = x + 1\n    return torch.special.i0(y)\n')
    err = out.error
    assert err.kind == "unsupported op" and "aten.i0" in err.message
    assert err.where == "cell line 5" and dict(err.snippet)[5] == "    return torch.special.i0(y)"


def test_exception_in_the_users_code(cuvil_cell):
    out = cuvil_cell("", "import torch\ndef f(x):\n    return x\nitems = {}\nf(items['missing'])")
    err = out.error
    assert err.kind == "error in your code" and err.message == "KeyError: 'missing'"
    assert err.where == "cell line 6" and not err.details


def test_option_errors(cuvil_cell):
    err = cuvil_cell("--passes canonicalize,cse{aggresive=true}", FOLDABLE_IR).error
    assert err.kind == "bad pipeline (--passes)" and "did you mean 'aggressive'" in err.message
    assert err.snippet[-1][1].strip() == "^"
    err = cuvil_cell("--panels pipeline,kernelz", FOLDABLE_IR).error
    assert err.kind == "bad %%cuvil options" and "unknown panel(s) kernelz" in err.message
    assert cuvil_cell("--frobnicate", FOLDABLE_IR).error.kind == "bad %%cuvil options"
    err = cuvil_cell("--dynamic 'undefined_hints'", FOLDABLE).error
    assert err.kind == "bad %%cuvil options" and "NameError" in err.message
    assert "No closing quotation" in cuvil_cell("--passes 'cse", FOLDABLE_IR).error.message


def test_quoted_option_expressions(cuvil_cell):
    # POSIX quoting: the expression arrives without its quotes
    run = cuvil_cell("""--dynamic '[{0: "rows"}]' --ranges '{"rows": (2, 9)}'""",
                     'import torch\ndef g(x):\n    return x.exp()\ng(torch.ones(3, 2))').explorer.run
    assert "attributes {symbols = {s0 = [2, 9]}}" in run.report.input_ir


def test_internal_errors_keep_their_traceback(cuvil_cell, monkeypatch):
    import cuvil_explorer.magic as magic

    def broken(*args, **kwargs):
        return {}["internal"]
    monkeypatch.setattr(magic, "compile_target", broken)
    err = cuvil_cell("--force", FOLDABLE_IR).error
    assert err.kind == "internal error in Cuvil (KeyError)" and "Traceback" in err.details


def test_a_failed_cell_clears_the_previous_results(cuvil_cell):
    cuvil_cell("", FOLDABLE_IR)
    out = cuvil_cell("", "x = 1\n")
    assert out.error.kind == "nothing to compile"
    assert all(out.bound[n] is None for n in ("_cuvil_result", "_cuvil_report", "_cuvil_compiled", "_cuvil_explorer"))


def test_no_pass_changed_the_ir(cuvil_cell):
    ex = cuvil_cell("--passes verify", FOLDABLE_IR).explorer
    pipe = ex.panels["pipeline"]
    pipe.hide.value = True
    assert pipe.list.options == () and pipe.slider.disabled and "No pass changed the IR" in pipe.header.value
