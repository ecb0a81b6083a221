"""Collapsing a reduction's loop nest into one loop over its flat position.

A reduction over several dims of a contiguous run (a mean over an NCHW image's H and W, a group
norm's channels and positions, a layer norm over [C, H, W]) is a nest of loops whose innermost one
is only a row long (7, 14 or 56 elements): the vectorised loop, its remainder and the pairwise
sum's bookkeeping start over at every row. Where every use of the nest's variables is a buffer
offset linear in them with row-major strides (the coefficient of each variable is the next one's
times the next loop's extent), the nest walks one run, and one loop over the flat position with
the inner variable standing for it (the outer ones 0) reads the same elements in the same order.
"""
from __future__ import annotations

import sympy

from .kernel_ir import Buffer, Call, Cast, Expr, Index, Let, Load, Range, Reduce, Store, free_symbols, loop_var


def collapsed_loops(s: Reduce) -> Range | None:
    """One loop that stands for `s`'s nest (its variable the innermost loop's), or None."""
    loops = s.loops
    if len(loops) < 2 or any(sympy.sympify(r.start) != 0 for r in loops):
        return None
    syms = [loop_var(r.var) for r in loops]
    names = {str(v) for v in syms}
    extents = [sympy.sympify(r.extent) for r in loops]

    def linear(buf: Buffer, index) -> bool:
        static, dynamic = buf.offset(index)
        if any(expr_uses(e) for e, _ in dynamic):
            return False
        offset = sympy.expand(static)
        coeffs = [offset.coeff(v) for v in syms]
        if any(c.free_symbols & set(syms) for c in coeffs) or \
                sympy.expand(offset - sum(c * v for c, v in zip(coeffs, syms))).free_symbols & set(syms):
            return False
        return all(sympy.expand(coeffs[k] - coeffs[k + 1] * extents[k + 1]) == 0 for k in range(len(syms) - 1))

    def expr_uses(e: Expr) -> bool:
        """Whether `e` uses a variable of the nest other than in a linear offset."""
        if isinstance(e, Load):
            if not linear(e.buf, e.index):
                return True
            return any(expr_uses(x) for x in [*(i for i in e.index if isinstance(i, Expr)), e.mask, e.other]
                       if x is not None)
        if isinstance(e, Index):
            return bool(free_symbols(e.expr) & names)
        if isinstance(e, Call):
            return any(expr_uses(a) for a in e.args)
        if isinstance(e, Cast):
            return expr_uses(e.value)
        return False

    for stmt in s.body:
        if isinstance(stmt, Let):
            if expr_uses(stmt.value):
                return None
        elif isinstance(stmt, Store):
            if not linear(stmt.buf, stmt.index) or expr_uses(stmt.value):
                return None
        else:
            return None         # a loop or reduction inside: left as it is
    if expr_uses(s.value):
        return None
    total = sympy.Integer(1)
    for e in extents:
        total = total * e
    return Range(loops[-1].var, 0, total)
