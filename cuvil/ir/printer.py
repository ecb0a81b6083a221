"""Graph IR -> text, in the form docs/ir.md describes and `parser.parse` reads back."""
from __future__ import annotations

import math
import numbers
from typing import Any, Sequence

import sympy

from ..errors import CuvilVerifyError
from .core import Function, Loc, Module, Operation, Value
from .lexer import BARE_NAME, VALUE_HINT, quote_string
from .types import DType, TensorType, expr_str

RETURN_OP = "cuvil.return"
# Ops that print one string attribute as `@name` right after the op name.
NAME_ATTR = {"cuvil.const": "name"}


def print_module(module: Module) -> str:
    """Every function of the module, separated by blank lines. Constants' data is not printed."""
    return "\n".join(print_function(fn, module) for fn in module.functions.values())


def print_function(fn: Function, module: Module | None = None) -> str:
    """One function: header, two-space indented ops, closing brace, trailing newline.

    `module` is accepted for symmetry with `print_module`; a function prints the same in any module.
    """
    names = value_names(fn)
    args = ", ".join(f"%{names[v]}: {v.type}" for v in fn.args)
    ret = fn.ops[-1] if fn.ops and fn.ops[-1].name == RETURN_OP else None
    results = result_types_str([v.type for v in ret.operands] if ret else [])
    header = f"cuvil.func {symbol_ref(fn.name)}({args}) -> {results}"
    if fn.symbols:
        ranges = ", ".join(f"{s} = [{lo}, {hi}]" for s, (lo, hi) in fn.symbols.items())
        header += f" attributes {{symbols = {{{ranges}}}}}"
    lines = [header + " {"]
    lines += ["  " + print_op(op, names) for op in fn.ops]
    lines.append("}\n")
    return "\n".join(lines)


def value_names(fn: Function) -> dict[Value, str]:
    """Printed names (without '%'): a value keeps its name hint when the hint is an identifier not
    taken by an earlier value; the others are numbered 0, 1, ... in order of definition."""
    values = [*fn.args, *(r for op in fn.ops for r in op.results)]
    names: dict[Value, str] = {}
    taken: set[str] = set()
    for v in values:
        if v.name and VALUE_HINT.fullmatch(v.name) and v.name not in taken:
            names[v] = v.name
            taken.add(v.name)
    counter = 0
    for v in values:
        if v not in names:
            names[v] = str(counter)
            counter += 1
    return names


def print_value(v: Value, names: dict[Value, str] | None = None) -> str:
    """`%name`; a value missing from `names` (printed on its own, or not defined in the function)
    shows as `%?hint`."""
    if names is not None and v in names:
        return "%" + names[v]
    hint = v.name if v.name and VALUE_HINT.fullmatch(v.name) else ""
    return "%?" + hint


def print_op(op: Operation, names: dict[Value, str] | None = None) -> str:
    """One op on one line, without indentation: `%0 = cuvil.relu %x : T -> T loc("m.py":3)`."""
    parts = []
    if op.results:
        parts.append(", ".join(print_value(r, names) for r in op.results) + " = ")
    parts.append(op.name)
    name_attr = NAME_ATTR.get(op.name)
    if name_attr is not None:
        parts.append(" " + symbol_ref(str(op.attrs.get(name_attr))))
    elif op.operands:
        parts.append(" " + ", ".join(print_value(v, names) for v in op.operands))
    attrs = _attr_items(op, skip=name_attr)
    if attrs:
        parts.append(" {" + ", ".join(attrs) + "}")
    operand_types = [v.type for v in op.operands]
    if op.name == RETURN_OP:
        if operand_types:
            parts.append(" : " + ", ".join(map(str, operand_types)))
    else:
        parts.append(" : " + signature_str(operand_types, [r.type for r in op.results]))
    if op.loc is not None:
        parts.append(" " + loc_str(op.loc))
    return "".join(parts)


def signature_str(operand_types: Sequence[TensorType], result_types: Sequence[TensorType]) -> str:
    """`T -> T`, `(T1, T2) -> T`, `T -> (T1, T2)`; zero operands print only the results."""
    results = result_types_str(result_types)
    if not operand_types:
        return results
    if len(operand_types) == 1:
        return f"{operand_types[0]} -> {results}"
    return f"({', '.join(map(str, operand_types))}) -> {results}"


def result_types_str(types: Sequence[TensorType]) -> str:
    if len(types) == 1:
        return str(types[0])
    return "(" + ", ".join(map(str, types)) + ")"


def symbol_ref(name: str) -> str:
    """`@fc1.weight`, or `@"odd name"` when the name has characters outside [A-Za-z0-9_.$]."""
    return "@" + (name if BARE_NAME.fullmatch(name) else quote_string(name))


def loc_str(loc: Loc) -> str:
    col = f":{loc.col}" if loc.col else ""
    return f"loc({quote_string(loc.file)}:{loc.line}{col})"


def _attr_items(op: Operation, skip: str | None) -> list[str]:
    """`key = value` in declaration order (then undeclared keys), leaving out values that print
    like their default, so that parsing back (which fills in defaults) prints the same."""
    declared = op.opdef.attrs
    keys = [k for k in declared if k in op.attrs] + [k for k in op.attrs if k not in declared]
    items = []
    for key in keys:
        if key == skip:
            continue
        text = _attr_text(op, key, op.attrs[key])
        decl = declared.get(key)
        if decl is not None and not decl.required and text == _attr_text(op, key, decl.default):
            continue
        items.append(f"{key} = {text}")
    return items


def _attr_text(op: Operation, key: str, value: Any) -> str:
    try:
        return attr_value_str(value)
    except TypeError as e:
        raise CuvilVerifyError(f"attribute '{key}': {e}", op) from None


def attr_value_str(value: Any) -> str:
    """The text of one attribute value: `1`, `1e-05`, `inf`, `true`, `none`, `"s"`, `f32`, `[s0, 4]`."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        value = float(value)
        if math.isnan(value):
            return "nan"
        return repr(value)   # 'inf', '-inf', '1.0', '1e-05'
    if isinstance(value, str):
        return quote_string(value)
    if isinstance(value, DType):
        return value.value
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(attr_value_str, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {attr_value_str(v)}" for k, v in value.items()) + "}"
    if isinstance(value, sympy.Expr):
        try:
            return expr_str(value)
        except ValueError as e:
            raise TypeError(str(e)) from None
    raise TypeError(f"a value of type {type(value).__name__} ({value!r}) has no text form")
