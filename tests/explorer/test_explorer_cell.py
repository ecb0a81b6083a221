"""What a `%%cuvil` cell compiles: IR detection and the AST rules (no compilation here)."""
from __future__ import annotations

import pytest
import torch

from cuvil_explorer.cell import CellError, discover, is_ir_text


@pytest.mark.parametrize("text, expected", [
    ("cuvil.func @f() -> () {\n}\n", True),
    ("// comment\n\n   // another\ncuvil.func @f() -> () {\n}\n", True),
    ("\n\ncuvil.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {", True),
    ("x = 1\ncuvil.func", False),
    ("# cuvil.func @f\nx = 1", False),
    ("", False),
    ("// only comments", False),
])
def test_ir_detection(text, expected):
    assert is_ir_text(text) is expected


def find(cell, **options):
    ns = {}
    return discover(cell, ns, "<cell>", **options), ns


def test_last_expression_call_gives_callee_and_inputs():
    t, ns = find("import torch\nlin = torch.nn.Linear(3, 2)\nx = torch.ones(4, 3)\nlin(x)")
    assert t.fn is ns["lin"] and t.label == "lin" and t.how == "the last expression"
    assert len(t.args) == 1 and t.args[0] is ns["x"] and t.kwargs == {}


def test_last_expression_is_not_executed_eagerly():
    t, ns = find("calls = []\ndef f(x):\n    calls.append(x)\n    return x\nf(1)")
    assert t.fn is ns["f"] and t.args == (1,) and ns["calls"] == []


def test_callee_expression_evaluated_once():
    # `Model()(x)`: the call's callee creates the model; the target must be that very instance
    t, ns = find("import torch\nmade = []\nclass M(torch.nn.Module):\n"
                 "    def __init__(self):\n        super().__init__()\n        made.append(self)\n"
                 "    def forward(self, x):\n        return x\nM()(torch.ones(2))")
    assert len(ns["made"]) == 1 and t.fn is ns["made"][0] and t.args[0].shape == (2,)


def test_starred_and_keyword_arguments():
    t, _ = find("def f(a, b):\n    return a\nxs = (1, 2)\nf(*xs)")
    assert t.args == (1, 2)
    t, _ = find("def f(a, b):\n    return a\nf(a=1, **{'b': 2})")
    assert t.args == () and t.kwargs == {"a": 1, "b": 2}


def test_mixed_positional_and_keyword_inputs_are_refused():
    with pytest.raises(CellError, match="either all by position or all by keyword"):
        find("def f(a, b):\n    return a\nf(1, b=2)")


def test_compile_decorator_is_interpreted_and_removed():
    # cuvil.compile need not exist: the magic removes the decorator before running the cell
    t, ns = find('import cuvil\n@cuvil.compile\ndef g(x: "f32[B,4]"):\n    return x\n'
                 'def other(x: "f32[2]"):\n    return x')
    assert t.fn is ns["g"] and t.how == "@cuvil.compile"
    assert isinstance(t.args[0], torch.Tensor) and t.args[0].shape[1] == 4


def test_compile_decorator_with_arguments_under_an_alias():
    t, ns = find('import cuvil as cv\n@cv.compile(mode="x")\ndef g(x: "f32[3]"):\n    return x')
    assert t.fn is ns["g"]


def test_annotated_function_is_found_and_examples_follow_annotations():
    t, ns = find('def helper(x):\n    return x\ndef f(x: "f32[B,512]", m: "i64[B]"):\n    return x')
    assert t.fn is ns["f"] and t.how == "a function with shape annotations"
    x, m = t.args
    assert x.dtype == torch.float32 and x.shape[1] == 512 and m.dtype == torch.int64 and m.shape == (x.shape[0],)


def test_annotation_examples_are_deterministic_and_leave_the_rng_alone():
    state = torch.random.get_rng_state()
    a, _ = find('def f(x: "f32[B,4]"):\n    return x')
    b, _ = find('def f(x: "f32[B,4]"):\n    return x')
    assert torch.equal(a.args[0], b.args[0])
    assert torch.equal(torch.random.get_rng_state(), state)


def test_name_option_and_inputs_option():
    ns = {}
    t = discover("import torch\ndef f(x):\n    return x\ndef g(x):\n    return x\nx = torch.ones(3)",
                 ns, "<cell>", name="f", inputs="(x, )")
    assert t.fn is ns["f"] and t.args == (ns["x"],) and t.how == "--name f"


def test_option_expressions_see_the_cells_names_and_report_their_errors():
    t, ns = find('def f(x: "f32[B,4]"):\n    return x\nlimits = {"B": (5, 5)}', ranges="limits")
    assert t.ranges == {"B": (5, 5)} and t.args[0].shape == (5, 4)
    with pytest.raises(CellError, match=r"--inputs nope\(\): NameError: name 'nope' is not defined") as e:
        find('def f(x):\n    return x\nf', inputs="nope()")
    assert e.value.kind == "bad %%cuvil options"


def test_bare_last_expression_uses_annotations():
    t, ns = find('def f(x: "f32[2,3]"):\n    return x\nf')
    assert t.fn is ns["f"] and t.args[0].shape == (2, 3)


def test_module_without_inputs_is_a_clear_error():
    with pytest.raises(CellError, match="no example inputs for `model`") as e:
        find("import torch\nmodel = torch.nn.Linear(2, 2)\nmodel")
    assert "model(x)" in e.value.hint


def test_nothing_to_compile():
    with pytest.raises(CellError, match="nothing to compile") as e:
        find("x = 1\ny = x + 1")
    assert "--name" in e.value.hint


def test_not_callable_target():
    with pytest.raises(CellError, match="`x` is a int, not a model or a function"):
        find("x = 1\nx")


def test_ir_cell_is_not_executed():
    t, ns = find("// IR\ncuvil.func @f() -> () {\n}\n")
    assert t.is_ir and t.ir_text.startswith("// IR") and ns == {}
