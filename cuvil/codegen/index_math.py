"""Simplifying integer index expressions with known variable ranges.

Folding a reshape into load indexing gives `(512*i0 + 64*i1 + i2) // 512` and `... % 512`;
knowing `0 <= 64*i1 + i2 < 512` turns them into `i0` and `64*i1 + i2`, which keeps inner loops
free of divisions (and vectorisable). `Bounds` maps expressions (loop variables and other
sub-expressions) to their inclusive [lo, hi] ranges.
"""
from __future__ import annotations

import functools

import sympy

from ..ir.types import Bounds, bounds

TRANSPOSE_TILE = 8      # a tile of a transposing loop nest: 8 x 8 floats (half a line per row: 16 measured no faster)


def _split(num, den):
    """num = den * whole + rest, term by term (terms whose quotient is an integer go to `whole`)."""
    whole, rest = [], []
    for t in sympy.Add.make_args(sympy.expand(num)):
        q = t / den     # sympy combines powers and coefficients itself: (512*i0)/512 is i0
        (whole if q.is_integer else rest).append(q if q.is_integer else t)
    return sympy.Add(*whole), sympy.Add(*rest)


def _within(e, den, known: Bounds) -> bool:
    """0 <= e < den for every value of the variables?"""
    b = bounds(e, known)
    if b is None:
        return False
    lo, hi = sympy.sympify(b[0]), sympy.sympify(b[1])
    decided = _decided_by_ranges(lo, hi, den, known)
    if decided is not None:
        return decided
    return lo.is_nonnegative is True and sympy.sympify(den - 1 - hi).is_nonnegative is True


def _decided_by_ranges(lo, hi, den, known: Bounds) -> bool | None:
    """The answer where `e`'s bounds lo and hi are expressions of other loop variables (the extent
    of a last, partial tile) with numeric ranges of their own; None where they are not. Asking
    sympy instead took 17-40 ms a question, 0.1 s of a ConvNeXt block's compile."""
    if not sympy.sympify(den).is_number or lo.is_number and hi.is_number:
        return None
    lo_range, hi_range = bounds(lo, known), bounds(hi, known)
    if lo_range is None or hi_range is None or not all(sympy.sympify(x).is_number for x in (*lo_range, *hi_range)):
        return None
    # sympy cannot use those ranges, so it proves no more (the zoo's and the suite's kernels came out the same)
    return bool(lo_range[0] >= 0 and hi_range[1] <= den - 1)


def floor_div(num, den, known: Bounds):
    """num // den for a positive den, simplified where the ranges allow."""
    whole, rest = _split(num, den)
    if rest == 0 or _within(rest, den, known):
        return whole
    return whole + sympy.floor(rest / den)


def modulo(num, den, known: Bounds):
    """num % den for a positive den, simplified where the ranges allow."""
    _, rest = _split(num, den)
    if _within(rest, den, known):
        return rest
    # unevaluated: `_split` already took out the terms den divides, and Mod's own evaluation of a
    # symbolic sum (gcd extraction, sign queries) took 0.1-0.3 s per convolution
    return sympy.Mod(rest, den, evaluate=not sympy.sympify(rest).free_symbols)


@functools.lru_cache(maxsize=4096)
def fold_divisions(offset):
    """A flat offset with its divisions recombined where they cancel: `x % c` written
    `x - c*(x//c)`, and `(x//a)//b` as `x//(a*b)`, then the like terms collected. A reshape across
    dims that do not split or merge into each other (`[56, 56, 96]` read as `[96, 56, 56]`) indexes
    its contiguous source with `(L//5376)*5376 + ((L//96) % 56)*96 + L % 96`, which is `L`
    (floor(floor(y) / n) is floor(y / n) for a positive integer n): a
    division a element had kept the loop scalar (an add through such a reshape 5x eager's time).
    Only divisions of sums of several variables (which the inner loops' variables are among) are
    folded, and the folded form is kept only where no division is left in it: a convolution's
    offsets, whose divisions are of the parallel index alone (`16*(p % 16) + 256*(p//16)` as
    `16*p`), ran the small CNN 13-16% slower folded."""
    if not any(isinstance(e, (sympy.Mod, sympy.floor)) and len(e.args[0].free_symbols) > 1
               for e in sympy.preorder_traversal(offset)):
        return offset
    flat = offset.replace(lambda e: isinstance(e, sympy.Mod) and e.args[1].is_Integer and e.args[1] > 0,
                          lambda e: e.args[0] - e.args[1] * sympy.floor(e.args[0] / e.args[1]))
    flat = flat.replace(_nested_floor, lambda e: sympy.floor(e.args[0].args[1].args[0] * e.args[0].args[0]))
    flat = sympy.expand(flat)
    return offset if flat.has(sympy.Mod, sympy.floor) else flat


def _nested_floor(e) -> bool:
    """floor(floor(y) / n) for a positive integer n (which is floor(y / n))."""
    if not (isinstance(e, sympy.floor) and e.args[0].is_Mul and len(e.args[0].args) == 2):
        return False
    c, inner = e.args[0].args
    return c.is_Rational and c > 0 and c.p == 1 and isinstance(inner, sympy.floor)


def broadcast_index(idx, out_shape, in_shape) -> list:
    """The operand index of a broadcast: right-aligned, size-1 dims read element 0."""
    lead = len(out_shape) - len(in_shape)
    return [0 if _is_one(d) and not _is_one(out_shape[lead + k]) else idx[lead + k] for k, d in enumerate(in_shape)]


def _is_one(d) -> bool:
    return isinstance(d, int) and d == 1


def index_min(*args):
    """sympy.Min, left unevaluated when an argument is symbolic: evaluating it asks sympy's
    assumptions system about every pair of arguments (~2 ms a call; 0.1 s per convolution tile
    nest)."""
    return sympy.Min(*args, evaluate=all(sympy.sympify(a).is_number for a in args))


def tile_extent(tile: int, total, first):
    """The extent of the tile starting at `first` of `total`: `tile` itself when a static total
    is a multiple of it (a constant extent: a vectorised loop of known trip count), else
    min(tile, total - first)."""
    if isinstance(total, (int, sympy.Integer)) and int(total) % tile == 0:
        return tile
    return index_min(tile, total - first)


def index_max(*args):
    return sympy.Max(*args, evaluate=all(sympy.sympify(a).is_number for a in args))


def decompose(known: Bounds, flat, shape) -> list:
    """Indices into `shape` of a flat row-major position (below the product of `shape`, so the
    first index needs no `% d`; proving such bounds on symbolic extents is slow)."""
    out, stride = [], sympy.Integer(1)
    for d in shape:
        stride = stride * d
    for k, d in enumerate(shape):
        stride = stride / d
        if d == 1:
            out.append(sympy.Integer(0))
            continue
        q = flat if stride == 1 else floor_div(flat, stride, known)
        out.append(q if k == 0 else modulo(q, d, known))
    return out


def reshape_groups(in_shape, out_shape) -> list[tuple[list[int], list[int]]]:
    """A reshape's dims in groups of equal size, in order: (operand dims, result dims), each a
    run of adjacent dims that merge or split into the other's (`[2, 2, s + 1, 32] -> [4, s + 1,
    32]` is ([0, 1], [0]), ([2], [1]), ([3], [2])); size-1 dims are in none. Where the sizes do
    not pair up so (a ratio not known to be whole), one group of all the dims."""
    ins = [k for k, d in enumerate(in_shape) if d != 1]
    outs = [k for k, d in enumerate(out_shape) if d != 1]
    groups, i, j = [], 0, 0
    while i < len(ins) and j < len(outs):
        gi, gj = [ins[i]], [outs[j]]
        pi, pj = sympy.sympify(in_shape[ins[i]]), sympy.sympify(out_shape[outs[j]])
        i, j = i + 1, j + 1
        while sympy.expand(pi - pj) != 0:
            if sympy.cancel(pj / pi).is_integer and i < len(ins):
                gi.append(ins[i])
                pi, i = pi * in_shape[ins[i]], i + 1
            elif sympy.cancel(pi / pj).is_integer and j < len(outs):
                gj.append(outs[j])
                pj, j = pj * out_shape[outs[j]], j + 1
            else:
                return [(ins, outs)]
        groups.append((gi, gj))
    return groups if i == len(ins) and j == len(outs) else [(ins, outs)]
