"""The reduction ops' lowering: what each reduction (sum, mean, var, softmax, layer_norm, argmax,
...) computes per row of its kept dims (`REDUCTION_BODIES`), what its full-shaped result is at an
element (`REDUCTION_EPILOGUES`), and column reductions (`ColumnLanes`).

A reduction normally runs one row per parallel iteration, each of its scalars (a max, a mean, a
reciprocal square root) a `Reduce` or a `Let`: right when the input is contiguous along the reduced
dims. When it is contiguous along a kept dim instead (a sum over dim 0, a mean over the tokens of
`[B, S, H]`, a group norm of an NHWC image), a row's elements lie a row of the input apart and the
row loop reads one float per cache line. A column reduction carries `LANE_TILE` neighbouring rows
(columns of the input) at once: every scalar is a row of values in scratch, computed in a loop over
the columns, innermost everywhere, which reads the input's contiguous runs and vectorises.
"""
from __future__ import annotations

import math
from typing import Callable

import sympy

from ..ir.core import Operation, Value
from ..ir.types import DType, norm_dim
from . import scalar_ops
from .index_math import floor_div, tile_extent
from .kernel_ir import Buffer, Const, Expr, Index, Load, Store, compute_dtype, identity, loop_var
from .scalar_ops import call, cast, const

LANE_TILE = 64        # the columns one parallel iteration of a column reduction carries
MIN_LANES = 8         # fewer columns than a vector: row by row, their strided reads share cache lines
COLUMN_BLOCK = 16     # the rows a column's float sum adds plainly before its compensated total takes them
COMBINE = {"sum": "add", "prod": "mul", "max": "max", "min": "min"}    # a fold's step as an elementwise op


def reduction_space(op: Operation) -> tuple[tuple, list[int]]:
    """(the shape iterated, the reduced axes) of a reduction op."""
    x = op.operands[0].type
    if op.name in ("cuvil.softmax", "cuvil.log_softmax"):
        return x.shape, [op.attrs["dim"]] if x.rank else []
    if op.name in ("cuvil.layer_norm", "cuvil.rms_norm"):
        return x.shape, list(range(x.rank - op.attrs["normalized_ndim"], x.rank))
    if op.name in ("cuvil.argmax", "cuvil.argmin"):
        return x.shape, list(range(x.rank)) if op.attrs["dim"] is None else [op.attrs["dim"]]
    return x.shape, sorted(op.attrs["dims"]) or list(range(x.rank))


def _count(full, axes) -> sympy.Expr:
    n = sympy.Integer(1)
    for k in axes:
        n = n * full[k]
    return norm_dim(n)


def _count_expr(full, axes, dtype: DType) -> Expr:
    n = _count(full, axes)
    return const(n, dtype) if isinstance(n, int) else cast(Index(n), dtype)


def _ranges(axes, full, prefix="r"):
    return [(f"{prefix}{k}", 0, full[k]) for k in axes]


def _fold(lw, kind: str, x: Value, axes, full, full_index, dtype: DType,
          f: Callable[[Expr], Expr] = lambda e: e) -> Expr:
    return lw.reduce(kind, _ranges(axes, full), lambda vars: f(cast(lw.value(x, full_index(vars)), dtype)), dtype)


def _simple(kind):
    def body(lw, op, axes, full, full_index):
        dtype = compute_dtype(op.results[0].type.dtype)
        return {"result": _fold(lw, kind, op.operands[0], axes, full, full_index, dtype)}
    return body


def _shifted_mean(lw, x, axes, full, full_index, dtype) -> Expr:
    """The mean as `x0 + sum(x - x0) / n`, x0 the first element of the row: on data far from zero
    (offset by 100, say) the sum of x - x0 stays near zero and rounds far less than the sum of x
    (which rounds at n times the offset); the mean then rounds once, at its own magnitude. An
    empty row reads no element (x0 is 0). A row with an inf or NaN gives NaN either way."""
    n = _count(full, axes)
    saved = lw.mask
    if not (isinstance(n, int) and n > 0):
        nonempty = call("gt", Index(n), const(0, DType.i64))
        lw.mask = nonempty if saved is None else call("and", saved, nonempty)
    x0 = lw.let(cast(lw.value(x, full_index([0] * len(axes))), dtype), "x0")
    lw.mask = saved
    total = _fold(lw, "sum", x, axes, full, full_index, dtype, lambda e: call("sub", e, x0))
    return lw.let(call("add", x0, call("div", total, _count_expr(full, axes, dtype))), "mean")


def _mean(lw, op, axes, full, full_index):
    """sum / n, like eager (not shifted: where the data is not offset, subtracting x0 only adds a
    rounding per element, e.g. the second mean of a written-out variance, `mean(d * d)`)."""
    dtype = compute_dtype(op.results[0].type.dtype)
    total = _fold(lw, "sum", op.operands[0], axes, full, full_index, dtype)
    return {"result": lw.let(call("div", total, _count_expr(full, axes, dtype)), "mean")}


def _mean_and_var(lw, x, axes, full, full_index, dtype, correction):
    """Two-pass mean and variance (the second pass sums squared deviations: no cancellation). The
    mean is shifted: eager's var (fp64 accumulation) and layer_norm (running moments) keep the
    mean of offset data within about half an ulp, which sum / n does not."""
    mean = _shifted_mean(lw, x, axes, full, full_index, dtype)

    def dev2(e):
        d = lw.let(call("sub", e, mean), "d")
        return call("mul", d, d)
    ss = _fold(lw, "sum", x, axes, full, full_index, dtype, dev2)
    n = _count(full, axes)
    denom = norm_dim(n - int(correction)) if float(correction).is_integer() else None
    if denom is not None and isinstance(denom, int):
        dn = const(max(denom, 0), dtype)
    elif denom is not None:
        dn = cast(Index(denom), dtype)
    else:
        dn = call("sub", _count_expr(full, axes, dtype), const(correction, dtype))
    return mean, lw.let(call("div", ss, dn), "var")


def _var(lw, op, axes, full, full_index):
    dtype = compute_dtype(op.results[0].type.dtype)
    _, var = _mean_and_var(lw, op.operands[0], axes, full, full_index, dtype, op.attrs["correction"])
    return {"result": var}


def _softmax(lw, op, axes, full, full_index):
    dtype = compute_dtype(op.results[0].type.dtype)
    m = _fold(lw, "max", op.operands[0], axes, full, full_index, dtype)
    out = lw.outputs.get(id(op.result))
    read_in_group = any(id(u) in lw.members for u in op.result.uses)
    if op.name == "cuvil.softmax" and out is not None and out[1].dtype == DType.f32 and not read_in_group:
        # the sum pass keeps exp(x - max) in the output; the store pass only scales it (not when an
        # epilogue in the group reads the softmax too: it could read the output already scaled)
        def exp_kept(vars):
            e = lw.let(call("exp_ftz", call("sub", cast(lw.value(op.operands[0], full_index(vars)), dtype), m)), "e")
            lw.emit(Store(out[1], full_index(vars), e))
            return e
        s = lw.reduce("sum", _ranges(axes, full), exp_kept, dtype)
        return {"kept": out[1], "inv": lw.let(call("div", const(1.0, dtype), s), "inv")}
    s = _fold(lw, "sum", op.operands[0], axes, full, full_index, dtype, lambda e: call("exp_ftz", call("sub", e, m)))
    if op.name == "cuvil.log_softmax":
        return {"max": m, "shift": lw.let(call("add", m, call("log", s)), "shift")}
    return {"max": m, "inv": lw.let(call("div", const(1.0, dtype), s), "inv")}


def _layer_norm(lw, op, axes, full, full_index):
    dtype = compute_dtype(op.results[0].type.dtype)
    mean, var = _mean_and_var(lw, op.operands[0], axes, full, full_index, dtype, 0)
    rstd = lw.let(call("rsqrt", call("add", var, const(op.attrs["eps"], dtype))), "rstd")
    return {"mean": mean, "rstd": rstd}


def _rms_norm(lw, op, axes, full, full_index):
    dtype = compute_dtype(op.results[0].type.dtype)
    ss = _fold(lw, "sum", op.operands[0], axes, full, full_index, dtype, lambda e: call("mul", e, e))
    eps = op.attrs["eps"]
    if eps is None:
        eps = scalar_ops.float_eps(op.operands[0].type.dtype)
    ms = call("div", ss, _count_expr(full, axes, dtype))
    return {"rstd": lw.let(call("rsqrt", call("add", ms, const(eps, dtype))), "rstd")}


def _arg(kind):
    """argmax/argmin: the extreme value, then the first flat position holding it (NaN counts as
    the extreme, like torch)."""
    def body(lw, op, axes, full, full_index):
        x = op.operands[0]
        dtype = compute_dtype(x.type.dtype)
        best = _fold(lw, kind, x, axes, full, full_index, dtype)
        def position(vars):
            v = cast(lw.value(x, full_index(vars)), dtype)
            hit = call("eq", v, best)
            if dtype.is_float:
                hit = call("or", hit, call("and", call("ne", v, v), call("ne", best, best)))
            flat = sympy.Integer(0)
            for k, var in sorted(zip(axes, vars)):     # row-major over the dims (the loops may run in another order)
                flat = flat * full[k] + var
            return call("select", hit, Index(flat), const(2 ** 62, DType.i64))
        return {"result": lw.reduce("min", _ranges(axes, full), position, DType.i64, "arg")}
    return body


REDUCTION_BODIES: dict[str, Callable] = {
    "cuvil.argmax": _arg("max"), "cuvil.argmin": _arg("min"),
    "cuvil.sum": _simple("sum"), "cuvil.prod": _simple("prod"), "cuvil.amax": _simple("max"),
    "cuvil.amin": _simple("min"), "cuvil.mean": _mean, "cuvil.var": _var, "cuvil.softmax": _softmax,
    "cuvil.log_softmax": _softmax, "cuvil.layer_norm": _layer_norm, "cuvil.rms_norm": _rms_norm,
}


def _softmax_out(lw, op, vars, idx):
    if "kept" in vars:
        return call("mul", Load(vars["kept"], idx), vars["inv"])
    x = cast(lw.value(op.operands[0], idx), compute_dtype(op.results[0].type.dtype))
    if op.name == "cuvil.log_softmax":
        return call("sub", x, vars["shift"])
    return call("mul", call("exp_ftz", call("sub", x, vars["max"])), vars["inv"])


def _norm_out(lw, op, vars, idx):
    dtype = compute_dtype(op.results[0].type.dtype)
    x = cast(lw.value(op.operands[0], idx), dtype)
    y = call("mul", call("sub", x, vars["mean"]), vars["rstd"]) if "mean" in vars else call("mul", x, vars["rstd"])
    n = op.attrs["normalized_ndim"]
    for param, combine in zip(op.operands[1:], ("mul", "add")):
        y = call(combine, y, cast(lw.value(param, idx[len(idx) - n:]), dtype))
    return y


REDUCTION_EPILOGUES: dict[str, Callable] = {
    "cuvil.softmax": _softmax_out, "cuvil.log_softmax": _softmax_out,
    "cuvil.layer_norm": _norm_out, "cuvil.rms_norm": _norm_out,
}


# ----------------------------------------------------------------------------- column reductions

class ColumnLanes:
    """One parallel iteration of a column reduction: its columns are the lanes `col` of every
    scalar the reduction bodies make, each such scalar a row of `LANE_TILE` values in scratch
    (`[items, LANE_TILE]`, a row per parallel item). `GroupLowering.let` and `.reduce` come here
    outside a column loop; inside one (`inside`) they build the one column's plain scalars.
    `carried`: (place among the reduced dims, index, extent n) of a reduced dim the columns carry
    (a group norm's n channels of a group): each fold runs over the other reduced dims per column,
    then combines the n columns of its group."""
    VAR = "col"

    def __init__(self, lw, p, items, extent, axis: int, carried: tuple[int, Expr, int] | None = None):
        self.lw, self.p, self.items, self.extent, self.carried = lw, p, items, extent, carried
        self.axis = axis        # the dim of the reduction space the columns are consecutive along
        self.lane = loop_var(self.VAR)
        self.inside = False

    def at(self) -> list:
        return [self.p, self.lane]

    def loop(self, body: Callable[[], None]) -> None:
        """body() inside a loop over the columns (directly, when already inside one)."""
        if self.inside:
            body()
            return
        self.inside = True
        try:
            self.lw.loop(self.VAR, self.extent, lambda _: body())
        finally:
            self.inside = False

    def array(self, dtype: DType, init: Expr | None = None) -> Buffer:
        buf = self.lw.scratch(dtype, [self.items, LANE_TILE])
        if init is not None:
            self.loop(lambda: self.lw.emit(Store(buf, self.at(), init)))
        return buf

    def let(self, e: Expr) -> Expr:
        return Load(self.array(e.dtype, e), self.at())

    def reduce(self, kind: str, ranges, value: Callable[[list], Expr], dtype: DType) -> Expr:
        """The fold of `value` over `ranges` per column (then per group of columns, where they
        carry a reduced dim)."""
        if self.carried is None:
            return self._fold(kind, ranges, value, dtype)
        k, index, n = self.carried
        per_column = self._fold(kind, ranges[:k] + ranges[k + 1:],
                                lambda syms: value(syms[:k] + [index] + syms[k:]), dtype)
        lw, at = self.lw, self.at()
        out = self.array(dtype)

        def combine() -> None:
            first = n * floor_div(self.lane, n, lw.known)
            folded = lw.reduce(kind, [("k", 0, n)], lambda ks: Load(per_column.buf, [self.p, first + ks[0]]), dtype)
            lw.emit(Store(out, at, folded))
        self.loop(combine)
        return Load(out, at)

    def _fold(self, kind: str, ranges, value: Callable[[list], Expr], dtype: DType) -> Expr:
        """The reduced dims' loops outside, the column loop inside. A float sum goes in blocks of
        COLUMN_BLOCK rows, each block's plain sum added to a compensated total (Neumaier's): a plain
        sum down a column of n rows rounds like one of n terms, where eager's cascade and Cuvil's
        row sums round like log2(n)."""
        lw, at = self.lw, self.at()

        def nest(loops: list, syms: list, innermost: Callable[[list], None]) -> None:
            if not loops:
                innermost(syms)
                return
            (var, start, extent), *rest = loops
            lw.loop(var, extent, lambda r: nest(rest, syms + [r], innermost), start=start)

        def fold_into(acc: Buffer, syms: list) -> None:
            self.loop(lambda: lw.emit(Store(acc, at, call(COMBINE[kind], Load(acc, at), cast(value(syms), dtype)))))

        if not (kind == "sum" and dtype.is_float) or _static_at_most(ranges, COLUMN_BLOCK):
            acc = self.array(dtype, identity(kind, dtype))      # (a short sum: one block, added plainly)
            nest(ranges, [], lambda syms: fold_into(acc, syms))
            return Load(acc, at)
        zero = Const(0.0, dtype)
        total, error, part = self.array(dtype, zero), self.array(dtype, zero), self.array(dtype)
        *outer, (var, start, extent) = ranges

        def blocks(syms: list) -> None:
            def block(b) -> None:
                first = start + COLUMN_BLOCK * b
                self.loop(lambda: lw.emit(Store(part, at, zero)))
                lw.loop(var, tile_extent(COLUMN_BLOCK, extent, COLUMN_BLOCK * b),
                        lambda r: fold_into(part, syms + [first + r]))

                def add_block() -> None:
                    s, e, _ = neumaier_add(lw, Load(total, at), Load(error, at), Load(part, at))
                    lw.emit(Store(total, at, s))
                    lw.emit(Store(error, at, e))
                self.loop(add_block)
            lw.loop(var + "b", norm_dim(sympy.ceiling(sympy.sympify(extent) / COLUMN_BLOCK)), block)
        nest(outer, [], blocks)
        s = Load(total, at)
        return self.let(call("select", finite(s), call("add", s, Load(error, at)), s))


def _static_at_most(ranges, n: int) -> bool:
    """Whether `ranges` ((var, start, extent) each) run at most `n` iterations, known statically."""
    total = 1
    for _, _, extent in ranges:
        if not isinstance(extent, int):
            return False
        total *= extent
    return total <= n


def finite(x: Expr) -> Expr:
    return call("lt", call("abs", x), Const(math.inf, x.dtype))


def neumaier_add(lw, before: Expr, error: Expr, x: Expr) -> tuple[Expr, Expr, Expr]:
    """One step of Neumaier's compensated sum: (the rounded sum `before + x`, `error` plus what
    that rounding lost, whether the sum is finite). The lost part is exact: the larger operand's
    digits the sum dropped. No error is added once the sum is infinite or NaN (an inf - inf there
    would make the finite sums that follow NaN); the sum's value is `s + error` where finite."""
    before = lw.let(before, "acc")
    s = lw.let(call("add", before, x), "sum")
    lost = call("select", call("ge", call("abs", before), call("abs", x)),
                call("add", call("sub", before, s), x), call("add", call("sub", x, s), before))
    ok = finite(s)
    return s, call("add", error, call("select", ok, lost, Const(0.0, x.dtype))), ok
