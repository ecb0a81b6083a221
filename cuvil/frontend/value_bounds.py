"""Bounds on the values of an integer tensor, from the ops that made it: what lets Cuvil prove an
assertion a model makes on its data (XLM's `assert lengths.max().item() <= slen`, where `lengths`
counts the non-padding tokens of each row) instead of refusing it. Cuvil's kernels raise no
errors, so an assertion on tensor values is compiled only when it holds for every value the
bounds allow."""
from __future__ import annotations

import math
from typing import Callable

import sympy
from sympy.core.relational import Relational

from ..errors import CuvilError
from ..ir.core import Value
from ..ir.types import DType, norm_dim

# ops whose every element is an element of their first operand
_SAME_VALUES = frozenset({"cuvil.reshape", "cuvil.permute", "cuvil.expand", "cuvil.squeeze", "cuvil.unsqueeze",
                          "cuvil.slice", "cuvil.select", "cuvil.copy", "cuvil.amax", "cuvil.amin", "cuvil.flip"})


def integer_bounds(v: Value) -> tuple | None:
    """(lo, hi), ints or size expressions, that every element of an integer or bool value lies in,
    or None where its ops do not bound it (a function argument, a float)."""
    if v.type.dtype is DType.bool:
        return 0, 1
    if v.type.dtype.is_float or v.is_arg:
        return None
    op = v.owner
    if op.name in ("cuvil.literal", "cuvil.full"):
        return int(op.attrs["value"]), int(op.attrs["value"])
    if op.name == "cuvil.cast" or op.name in _SAME_VALUES:
        return integer_bounds(op.operands[0])
    if op.name == "cuvil.sum":
        inner = integer_bounds(op.operands[0])
        x = op.operands[0].type
        n = math.prod(x.shape[d] for d in (op.attrs["dims"] or range(x.rank)))
        return None if inner is None else (n * inner[0], n * inner[1])
    return None


def proven(condition: sympy.Basic, bounds: dict, to_dim: Callable, span: Callable) -> bool:
    """Whether torch's `condition` holds for every value of its data symbols within `bounds`
    ({symbol: (lo, hi)}, Cuvil dims) and every size in the ranges: a comparison linear in one data
    symbol holds everywhere between its bounds when it holds at both (its sizes made Cuvil dims by
    `to_dim`, their extremes over the ranges given by `span`), or a conjunction of such."""
    if condition is sympy.true:
        return True
    if isinstance(condition, sympy.And):
        return all(proven(c, bounds, to_dim, span) for c in condition.args)
    if not isinstance(condition, Relational) or condition.rel_op not in _HOLDS:
        return False
    diff = sympy.expand(condition.lhs - condition.rhs)       # the condition is `diff <op> 0`
    data = [s for s in diff.free_symbols if s in bounds]
    if len(data) != 1:
        return False
    u = data[0]
    c = diff.coeff(u)
    if not c.is_Integer or (diff - c * u).has(u):
        return False
    try:
        rest = to_dim(diff - c * u)
    except CuvilError:
        return False
    for end in bounds[u]:
        value = norm_dim(int(c) * sympy.sympify(end) + sympy.sympify(rest))
        extremes = (value, value) if isinstance(value, int) else span(value)
        if extremes is None or not _HOLDS[condition.rel_op](*extremes):
            return False
    return True


# for `diff <op> 0`, whether it holds given the least and greatest values of diff
_HOLDS = {"<=": lambda lo, hi: hi <= 0, "<": lambda lo, hi: hi < 0,
          ">=": lambda lo, hi: lo >= 0, ">": lambda lo, hi: lo > 0}
