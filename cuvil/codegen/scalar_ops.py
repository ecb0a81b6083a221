"""Scalar semantics of the elementwise graph ops: one small emitter per op name (like Inductor's
`CppOverrides`). An emitter gets the op's attributes and its operands as kernel-IR expressions,
already converted to the op's compute dtype (`operand_dtypes`), and returns the result expression
in the result's compute dtype (f16/bf16 values compute in f32).
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from ..errors import CuvilUnsupportedOpError
from ..ir.ops.common import promote
from ..ir.types import DType
from .kernel_ir import Call, Cast, Const, Expr, Index, Load, Var, compute_dtype


def const(value, dtype: DType) -> Const:
    return Const(value, dtype)


def call(fn: str, *args: Expr) -> Call:
    return Call(fn, args)


def cast(e: Expr, dtype: DType) -> Expr:
    """`e` converted to `dtype`; constants are converted here (so `x ** 2` stays `x * x`)."""
    if e.dtype == dtype:
        return e
    if isinstance(e, Const) and (dtype.is_float or dtype == DType.bool or math.isfinite(e.value)):
        return Const(e.value if dtype.is_float or dtype == DType.bool else math.trunc(e.value), dtype)
    return Cast(e, dtype)


EMITTERS: dict[str, Callable] = {}
OPERAND_DTYPES: dict[str, str] = {}
REUSES_OPERANDS: set[str] = set()


def emitter(*names: str, operands: str = "result", reuses: bool = False):
    """Register an emitter. `operands` says what the operands are converted to first: `result`
    (the result's compute dtype), `promoted` (torch's promotion of the operands: comparisons),
    `bool`, `where`, or `keep`. `reuses`: the emitter uses an operand more than once, so
    computed operands are named first (a `Let`) instead of being duplicated."""
    def register(fn):
        for n in names:
            EMITTERS["cuvil." + n] = fn
            OPERAND_DTYPES["cuvil." + n] = operands
            if reuses:
                REUSES_OPERANDS.add("cuvil." + n)
        return fn
    return register


def operand_dtypes(op) -> list[DType]:
    """The compute dtypes the operands of `op` are converted to before its emitter runs."""
    rule = OPERAND_DTYPES[op.name]
    if rule == "result":
        return [compute_dtype(op.results[0].type.dtype)] * len(op.operands)
    if rule == "promoted":
        return [compute_dtype(promote(*(v.type for v in op.operands)))] * len(op.operands)
    if rule == "bool":
        return [DType.bool] * len(op.operands)
    if rule == "where":
        return [DType.bool] + [compute_dtype(op.results[0].type.dtype)] * 2
    return [compute_dtype(v.type.dtype) for v in op.operands]


def emit(op, args: list[Expr], let: Callable[[Expr], Expr]) -> Expr:
    """The result of `op` at one index from its operands there; `let` names a value."""
    fn = EMITTERS.get(op.name)
    if fn is None:
        raise CuvilUnsupportedOpError(op.name, detail="no native lowering for this op yet")
    args = [cast(a, dt) for a, dt in zip(args, operand_dtypes(op))]
    if op.name in REUSES_OPERANDS:
        args = [a if isinstance(a, (Var, Const, Load, Index)) else let(a) for a in args]
    out = fn(op.attrs, *args)
    dtype = op.results[0].type.dtype
    want = compute_dtype(dtype)
    if dtype != want and out.dtype != dtype:    # a half type: rounded to it after each op, as torch does
        out = cast(out, dtype)
    return cast(out, want)


# ----------------------------------------------------------------------------- unary

for _name in ("exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "sin", "cos", "tan", "atan", "asin", "acos", "sinh",
              "cosh", "asinh", "acosh", "atanh", "tanh", "sigmoid", "erf", "reciprocal", "neg", "abs"):
    emitter(_name)((lambda fn: lambda attrs, x: call(fn, x))(_name))


for _name in ("floor", "ceil", "round", "trunc"):   # integers are already whole
    emitter(_name)((lambda fn: lambda attrs, x: call(fn, x) if x.dtype.is_float else x)(_name))


@emitter("sign")
def _sign(attrs, x):
    return x if x.dtype == DType.bool else call("sign", x)


@emitter("relu")
def _relu(attrs, x):
    if not x.dtype.is_float:
        return call("max", x, const(0, x.dtype))
    zero = const(0.0, x.dtype)     # x < 0 ? 0 : x keeps -0.0 and NaN as torch does (max gives +0.0)
    return call("select", call("lt", x, zero), zero, x)


@emitter("silu", reuses=True)
def _silu(attrs, x):
    return call("div", x, call("add", const(1.0, x.dtype), call("exp", call("neg", x))))


@emitter("gelu", reuses=True)
def _gelu(attrs, x):
    half = call("mul", const(0.5, x.dtype), x)
    if attrs["approximate"] == "tanh":
        inner = call("mul", const(math.sqrt(2 / math.pi), x.dtype),
                     call("add", x, call("mul", const(0.044715, x.dtype), call("mul", x, call("mul", x, x)))))
        return call("mul", half, call("add", const(1.0, x.dtype), call("tanh", inner)))
    return call("mul", half, call("add", const(1.0, x.dtype), call("erf", call("mul", x, const(math.sqrt(0.5),
                                                                                                 x.dtype)))))


@emitter("logical_not", operands="bool")
def _logical_not(attrs, x):
    return call("not", x)


@emitter("clamp")
def _clamp(attrs, x):
    if attrs["min"] is not None:
        x = call("max", x, const(attrs["min"], x.dtype))
    if attrs["max"] is not None:
        x = call("min", x, const(attrs["max"], x.dtype))
    return x


@emitter("cast", operands="keep")
def _cast(attrs, x):
    return cast(x, compute_dtype(attrs["dtype"]))


# ----------------------------------------------------------------------------- binary

# torch on two bools: add is or, mul is and, maximum is or, minimum is and
_BOOL_FORMS = {"add": "or", "mul": "and", "max": "or", "min": "and"}

emitter("atan2")(lambda attrs, y, x: call("atan2", y, x))

for _name, _fn in (("add", "add"), ("sub", "sub"), ("mul", "mul"), ("div", "div"), ("maximum", "max"),
                   ("minimum", "min"), ("floor_div", "floordiv"), ("remainder", "rem"),
                   ("fmod", "fmod")):
    emitter(_name)((lambda fn: lambda attrs, a, b: call(_BOOL_FORMS.get(fn, fn) if a.dtype == DType.bool else fn,
                                                        a, b))(_fn))

for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    emitter(_name, operands="promoted")((lambda fn: lambda attrs, a, b: call(fn, a, b))(_name))

for _name, _fn in (("logical_and", "and"), ("logical_or", "or")):
    emitter(_name, operands="bool")((lambda fn: lambda attrs, a, b: call(fn, a, b))(_fn))

for _name, _fn in (("bitwise_and", "and"), ("bitwise_or", "or"), ("bitwise_xor", "xor")):
    emitter(_name)((lambda fn: lambda attrs, a, b: call(fn, a, b))(_fn))


@emitter("pow", reuses=True)
def _pow(attrs, a, b):
    if a.dtype.is_float:
        return _pow_by_constant(a, b) or call("pow", a, b)
    if isinstance(b, Const) and b.value >= 0:
        return _pow_by_constant(a, b)
    raise CuvilUnsupportedOpError("cuvil.pow", detail="integer pow needs a constant non-negative exponent")


def _pow_by_constant(a: Expr, b: Expr) -> Expr | None:
    """x**2 -> x*x, x**0.5 -> sqrt(x) ...: exact and fast forms for constant exponents."""
    if not isinstance(b, Const):
        return None
    v = b.value
    if v == 0.5:
        return call("sqrt", a)
    if v == -0.5:
        return call("rsqrt", a)
    if float(v).is_integer() and 0 <= v <= 4:
        if v == 0:
            return const(1, a.dtype)
        out = a
        for _ in range(int(v) - 1):
            out = call("mul", out, a)
        return out
    if float(v).is_integer() and -4 <= v < 0 and a.dtype.is_float:
        return call("reciprocal", _pow_by_constant(a, const(-v, a.dtype)))
    return None


@emitter("where", operands="where")
def _where(attrs, c, a, b):
    return call("select", c, a, b)


@emitter("copy")
def _copy(attrs, x):
    return x


@emitter("batch_norm")
def _batch_norm(attrs, x, mean, var, weight=None, bias=None):
    y = call("mul", call("sub", x, mean), call("rsqrt", call("add", var, const(attrs["eps"], x.dtype))))
    if weight is not None:
        y = call("mul", y, weight)
    if bias is not None:
        y = call("add", y, bias)
    return y


def float_eps(dtype: DType) -> float:
    return torch.finfo(dtype.torch).eps
