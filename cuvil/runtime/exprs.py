"""Dimension expressions in the postfix form the native engine evaluates.

An expression is an int, or a list of tokens: an int pushes itself, `"$N"` pushes the value of
runtime symbol N, and `"+" "-" "*" "//" "%" "max" "min"` pop b, pop a and push `a op b`
(`//` and `%` floor, as in Python). `s0*512 + 64` with s0 as symbol 0 is `["$0", 512, "*", 64, "+"]`.
"""
from __future__ import annotations

import operator
from typing import Mapping, Sequence, Union

import sympy

Postfix = Union[int, list]

_BINARY = {"+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv,
           "%": operator.mod, "max": max, "min": min}


def to_postfix(dim, symbol_index: Mapping[str, int]) -> Postfix:
    """Translate an int or a sympy dimension expression; symbols are numbered by `symbol_index`."""
    if isinstance(dim, bool):
        raise TypeError("a dimension cannot be a bool")
    if isinstance(dim, int):
        return dim
    expr = sympy.sympify(dim)
    if expr.is_Integer:
        return int(expr)
    out: list = []
    _emit(expr, symbol_index, out, expr)
    return out


def _emit(e, index: Mapping[str, int], out: list, whole) -> None:
    if e.is_Integer:
        out.append(int(e))
    elif e.is_Symbol:
        if e.name not in index:
            raise ValueError(f"symbol '{e.name}' in dimension {whole} is not a symbol of the program "
                             f"(its symbols: {', '.join(index) or 'none'})")
        out.append(f"${index[e.name]}")
    elif e.is_Add or e.is_Mul or isinstance(e, (sympy.Max, sympy.Min)):
        if e.is_Mul and any(a.is_Rational and not a.is_Integer for a in e.args):
            raise ValueError(f"dimension {whole} is not an integer expression")
        op = "+" if e.is_Add else "*" if e.is_Mul else "max" if isinstance(e, sympy.Max) else "min"
        args = sorted(e.args, key=sympy.default_sort_key)
        _emit(args[0], index, out, whole)
        for a in args[1:]:
            _emit(a, index, out, whole)
            out.append(op)
    elif e.is_Pow and e.exp.is_Integer and e.exp > 0:
        _emit(e.base, index, out, whole)
        for _ in range(int(e.exp) - 1):
            _emit(e.base, index, out, whole)
            out.append("*")
    elif isinstance(e, (sympy.floor, sympy.ceiling)):
        num, den = sympy.fraction(sympy.together(e.args[0]))
        if isinstance(e, sympy.floor):
            _emit(num, index, out, whole)
            _emit(den, index, out, whole)
            out.append("//")
        else:  # ceil(n/d) = -((-n) // d)
            out.extend([0, 0])
            _emit(num, index, out, whole)
            out.append("-")
            _emit(den, index, out, whole)
            out.extend(["//", "-"])
    elif isinstance(e, sympy.Mod):
        _emit(e.args[0], index, out, whole)
        _emit(e.args[1], index, out, whole)
        out.append("%")
    else:
        raise ValueError(f"dimension {whole} uses '{type(e).__name__}', which the runtime cannot evaluate")


def binding(dim) -> tuple[sympy.Symbol, int] | None:
    """(symbol, q) where an input dim binds a symbol: a plain symbol (q = 1), or q times one (a dim
    the model needs a multiple of q: the size divided by q, checked to divide); else None."""
    if isinstance(dim, int):
        return None
    if dim.is_Symbol:
        return dim, 1
    if dim.is_Mul and len(dim.args) == 2 and dim.args[0].is_Integer and dim.args[0] > 1 and dim.args[1].is_Symbol:
        return dim.args[1], int(dim.args[0])
    return None


def evaluate(expr: Postfix, symbols: Sequence[int]) -> int:
    """Value of a postfix expression; the same semantics as the native engine."""
    if isinstance(expr, int):
        return expr
    stack: list[int] = []
    for t in expr:
        if isinstance(t, int):
            stack.append(t)
        elif t[0] == "$":
            stack.append(symbols[int(t[1:])])
        else:
            b = stack.pop()
            stack.append(_BINARY[t](stack.pop(), b))
    return stack[0]
