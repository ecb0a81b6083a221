"""What a `%%cuvil` cell compiles: textual Cuvil IR, or a Python callable found in the cell's AST.

Python cells, in order of precedence:
- `--name EXPR` names the model or function (evaluated after the cell body ran);
- else the last function decorated `@cuvil.compile` (the decorator is interpreted here and removed
  before the body runs);
- else the last expression: `model(x)` compiles `model` with the inputs `(x,)`, a bare `model`
  compiles `model`;
- else the last function whose parameters carry shape strings (`def f(x: "f32[B,512]")`).

Example inputs, in order: `--inputs EXPR`, the arguments of the last expression's call when it
calls the target, the target's shape annotations (random data).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

import torch

import cuvil
from cuvil import CuvilError
from cuvil.frontend.annotations import examples_from_annotations, function_annotations


class CellError(CuvilError):
    """A problem with the cell itself; `line`/`col` (1-based, in the cell body) say where, if known."""

    def __init__(self, message: str, line: int | None = None, col: int | None = None, hint: str = "",
                 kind: str = "cell problem"):
        self.message, self.line, self.col, self.hint, self.kind = message, line, col, hint, kind
        super().__init__(message)


@dataclass
class Target:
    source: str                      # the cell body
    filename: str                    # the name its code runs under (registered in linecache)
    ir_text: str | None = None       # set for an IR cell
    fn: Any = None                   # the nn.Module or function to compile
    label: str = ""                  # how the cell names it: "model", "f"
    how: str = ""                    # why it was chosen
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    ranges: dict | None = None       # ranges of the dynamic dims (--ranges)

    @property
    def is_ir(self) -> bool:
        return self.ir_text is not None


def is_ir_text(cell: str) -> bool:
    """True when the first line that is neither blank nor a `//` comment starts with `cuvil.func`."""
    for line in cell.splitlines():
        s = line.strip()
        if s and not s.startswith("//"):
            return s.startswith("cuvil.func")
    return False


def discover(cell: str, ns: dict, filename: str, name: str | None = None, inputs: str | None = None,
             ranges: str | None = None, force_ir: bool = False) -> Target:
    """Run the cell body in `ns` (except a final expression) and find what to compile. `name`,
    `inputs` and `ranges` are the options' Python expressions, evaluated after the body ran."""
    if force_ir or is_ir_text(cell):
        target = Target(cell, filename, ir_text=cell, label="IR", how="textual IR")
        if inputs:
            target.args, target.kwargs = _as_inputs(evaluate(inputs, ns, "--inputs"))
        return target
    tree = ast.parse(cell, filename)
    decorated = _strip_compile_decorators(tree, ns)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, filename, "exec", dont_inherit=True), ns)
    call = last.value if last is not None and isinstance(last.value, ast.Call) else None
    callee = _eval_node(call.func, ns, filename) if call is not None else None   # once: `M()(x)` makes a model
    target = Target(cell, filename, ranges=evaluate(ranges, ns, "--ranges") if ranges else None)

    if name:
        target.fn, target.label, target.how = evaluate(name, ns, "--name"), name, f"--name {name}"
    elif decorated:
        target.label = decorated[-1]
        target.fn, target.how = ns[target.label], "@cuvil.compile"
    elif last is not None:
        expr = call.func if call is not None else last.value
        target.fn = callee if call is not None else _eval_node(expr, ns, filename)
        target.label, target.how = ast.unparse(expr), "the last expression"
    else:
        annotated = [f.name for f in tree.body if isinstance(f, ast.FunctionDef) and _has_shape_strings(f)]
        if not annotated:
            raise CellError("nothing to compile in this cell", kind="nothing to compile",
                            hint='end the cell with the model or a call such as `model(x)`, decorate a function '
                                 'with @cuvil.compile, annotate its parameters (x: "f32[B,512]"), or pass --name')
        target.label = annotated[-1]
        target.fn, target.how = ns[target.label], "a function with shape annotations"

    if not callable(target.fn):
        raise CellError(f"`{target.label}` is a {type(target.fn).__name__}, not a model or a function",
                        last.lineno if last is not None and not name else None)
    if inputs:
        target.args, target.kwargs = _as_inputs(evaluate(inputs, ns, "--inputs"))
    elif call is not None and callee is target.fn:
        target.args, target.kwargs = _call_arguments(call, ns, filename)
    else:
        target.args = _annotation_examples(target, target.ranges or {})
    if target.args and target.kwargs:
        raise CellError("give the example inputs either all by position or all by keyword",
                        call.lineno if call is not None else None)
    return target


# compile(..., dont_inherit=True): the user's code must not inherit this module's
# `from __future__ import annotations` (it would turn "f32[B,8]" annotations into "'f32[B,8]'")

def evaluate(expr: str, ns: dict, option: str) -> Any:
    """An option's Python expression, evaluated in the user's namespace."""
    try:
        return eval(compile(expr, f"<{option}>", "eval", dont_inherit=True), ns)
    except Exception as e:
        raise CellError(f"{option} {expr}: {type(e).__name__}: {e}", kind="bad %%cuvil options") from None


def _eval_node(node: ast.expr, ns: dict, filename: str) -> Any:
    """Evaluate one expression of the cell; its line numbers stay those of the cell."""
    return eval(compile(ast.Expression(body=node), filename, "eval", dont_inherit=True), ns)


def _call_arguments(call: ast.Call, ns: dict, filename: str) -> tuple[tuple, dict]:
    args: list = []
    for a in call.args:
        if isinstance(a, ast.Starred):
            args.extend(_eval_node(a.value, ns, filename))
        else:
            args.append(_eval_node(a, ns, filename))
    kwargs: dict = {}
    for k in call.keywords:
        value = _eval_node(k.value, ns, filename)
        if k.arg is None:
            kwargs.update(value)
        else:
            kwargs[k.arg] = value
    return tuple(args), kwargs


def _as_inputs(value: Any) -> tuple[tuple, dict]:
    if isinstance(value, dict):
        return (), dict(value)
    if isinstance(value, (tuple, list)):
        return tuple(value), {}
    return (value,), {}


def _annotation_examples(target: Target, ranges: dict) -> tuple:
    fn = target.fn.forward if isinstance(target.fn, torch.nn.Module) else target.fn
    annotations = function_annotations(fn)
    if not annotations:
        raise CellError(f"no example inputs for `{target.label}`",
                        hint=f"end the cell with a call such as `{target.label}(x)`, pass --inputs EXPR, "
                             f'or annotate its parameters with shapes (x: "f32[B,512]")')
    with torch.random.fork_rng(devices=[]):   # the same examples every run, the user's RNG untouched
        torch.manual_seed(0)
        return examples_from_annotations(annotations, ranges)


def _has_shape_strings(fn: ast.FunctionDef) -> bool:
    args = [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]
    return any(isinstance(a.annotation, ast.Constant) and isinstance(a.annotation.value, str)
               and "[" in a.annotation.value for a in args)


def _cuvil_aliases(tree: ast.Module, ns: dict) -> set[str]:
    """Names that refer to the cuvil module: `cuvil`, `import cuvil as cv` in the cell, or in `ns`."""
    names = {"cuvil"} | {k for k, v in ns.items() if v is cuvil}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.asname for a in node.names if a.name == "cuvil" and a.asname}
    return names


def _strip_compile_decorators(tree: ast.Module, ns: dict) -> list[str]:
    """Remove `@cuvil.compile` (or `@cuvil.compile(...)`) from top-level functions; the names of
    those that had it."""
    aliases = _cuvil_aliases(tree, ns)

    def is_compile(d: ast.expr) -> bool:
        d = d.func if isinstance(d, ast.Call) else d
        return (isinstance(d, ast.Attribute) and d.attr == "compile" and isinstance(d.value, ast.Name)
                and d.value.id in aliases)

    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            kept = [d for d in node.decorator_list if not is_compile(d)]
            if len(kept) != len(node.decorator_list):
                node.decorator_list = kept
                names.append(node.name)
    return names
