"""Transposed tiles: which loop nests the LLVM emitter computes in registers (`llvm_emit`,
`KernelEmitter._transpose_tile`).

A tile is `for a in 8: for b in 8: Y[...] = f(...)` where Y is contiguous along b and some input
X is contiguous along a (a permute, an NCHW convolution input's copy, attention's K^T packing,
and an elementwise op that reads one operand through a permute: the residual add after a
ConvNeXt block's NHWC -> NCHW conversion). LLVM would vectorise the inner loop with gathers (a
Zen 4's cost model picks them) or leave it scalar. In registers, each such X is read as 8 vectors
along a and transposed by the shuffles of `TRANSPOSE_STAGES`; then every row of the tile is one
vector expression along b, whose other reads are vectors (contiguous along b) or one scalar
broadcast (the same for the whole row).
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy

from ..ir.types import DType
from .index_math import TRANSPOSE_TILE as TILE
from .kernel_ir import Call, Const, Expr, Load, Loop, Store, Var, loop_var

# An 8x8 transpose as three stages of two-vector shuffles (unpack, then pairs, then halves): each
# stage makes, from the pairs of the previous stage's vectors, one vector per mask.
TRANSPOSE_STAGES = (
    (((0, 1), (2, 3), (4, 5), (6, 7)), ([0, 8, 1, 9, 4, 12, 5, 13], [2, 10, 3, 11, 6, 14, 7, 15])),
    (((0, 2), (1, 3), (4, 6), (5, 7)), ([0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15])),
    (((0, 4), (1, 5), (2, 6), (3, 7)), ([0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15])),
)
TRANSPOSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)      # the row of the transposed tile each last-stage vector is

# The functions a tile row computes on whole vectors: their emitters in `llvm_emit.FLOAT_OPS` and
# `SHARED_OPS` take vectors as they take scalars.
VECTOR_FUNCS = frozenset({"add", "sub", "mul", "div", "max", "min", "neg", "abs", "fma", "sqrt", "floor", "ceil",
                          "trunc", "round", "select", "eq", "ne", "lt", "le", "gt", "ge"})

COLUMN, ROW, UNIFORM = "column", "row", "uniform"   # X's transposed reads, vectors along b, broadcasts


@dataclass(frozen=True)
class TransposedTile:
    store: Store
    reads: dict[int, str]      # id(load) -> COLUMN, ROW or UNIFORM
    columns: tuple             # the COLUMN loads, each transposed once


def transposed_tile(s: Loop) -> TransposedTile | None:
    """`s` as a transposed tile, or None. An extent that is not a number (an edge tile's
    `min(8, ...)`) is compared with TILE at run time."""
    inner = s.body[0] if len(s.body) == 1 else None
    if s.parallel or not isinstance(inner, Loop) or inner.parallel or len(inner.body) != 1:
        return None
    store = inner.body[0]
    if not isinstance(store, Store) or store.buf.dtype == DType.bool:
        return None
    if any(sympy.sympify(loop.extent).is_Integer and sympy.sympify(loop.extent) != TILE for loop in (s, inner)):
        return None
    a, b = loop_var(s.var), loop_var(inner.var)
    reads: dict[int, str] = {}
    loads: list[Load] = []
    if not unit_stride(store, b) or not _classify(store.value, a, b, reads, loads):
        return None
    columns = tuple(x for x in loads if reads[id(x)] == COLUMN)
    if not columns or any(x.buf.name == store.buf.name for x in columns):
        return None
    if not isinstance(store.value, Load) and store.value.dtype != DType.f32:
        return None      # arithmetic in f32 only; copies of any dtype
    return TransposedTile(store, reads, columns)


def _classify(e: Expr, a, b, reads: dict[int, str], loads: list[Load]) -> bool:
    """Record how the tile reads each load of `e`; False where a row cannot be one vector expression."""
    if isinstance(e, Load):
        if e.mask is not None or e.buf.dtype == DType.bool or e.buf.offset(e.index)[1]:
            return False
        static = e.buf.offset(e.index)[0]
        if b not in sympy.sympify(static).free_symbols:
            kind = UNIFORM
        elif unit_stride(e, b):
            kind = ROW
        elif unit_stride(e, a):
            kind = COLUMN
        else:
            return False
        if id(e) not in reads:
            loads.append(e)
        reads[id(e)] = kind
        return True
    if isinstance(e, (Const, Var)):
        return True
    if isinstance(e, Call):
        return e.fn in VECTOR_FUNCS and all(x.dtype in (DType.f32, DType.bool) for x in e.args) and \
            all(_classify(x, a, b, reads, loads) for x in e.args)
    return False


def unit_stride(access: Load | Store, var: sympy.Symbol) -> bool:
    """Consecutive values of `var` address consecutive elements."""
    static, dynamic = access.buf.offset(access.index)
    return not dynamic and sympy.expand(static.subs(var, var + 1) - static) == 1
