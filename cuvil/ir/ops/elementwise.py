"""Elementwise ops: unary and binary maps, gelu, clamp, check_index, check_true, cast, where.

Binary ops broadcast like torch and promote dtypes like torch (`torch.result_type`; a rank-0
operand counts as a scalar). Each op is one declared class; the factories below only fill in the
class body so that the twenty-odd maps stay one line each.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from ..core import OpDef, optional, register_op, required
from ..types import DType, TensorType, dims_equal
from .common import (INTEGER_DTYPES, broadcast_shapes, promote, require_float, require_not_bool, to_float,
                     types_str)


# ----------------------------------------------------------------------------- unary

# How a unary op maps its input dtype to its result dtype (raising on inputs torch rejects).
def _same(t: TensorType) -> DType:
    return t.dtype


def _numeric(t: TensorType) -> DType:
    require_not_bool(t, "x")
    return t.dtype


def _floating(t: TensorType) -> DType:
    return to_float(t.dtype)


def _float_only(t: TensorType) -> DType:
    require_float(t, "x")
    return t.dtype


def _boolean(t: TensorType) -> DType:
    return DType.bool


class UnaryOp(OpDef):
    operands = ("x",)
    tags = frozenset({"elementwise"})
    amp = "follow"
    result_dtype: Callable[[TensorType], DType] = staticmethod(_same)
    fn: Callable[[torch.Tensor], torch.Tensor]

    @classmethod
    def infer(cls, types, attrs):
        (x,) = types
        return [x.with_dtype(cls.result_dtype(x))]

    @classmethod
    def evaluate(cls, attrs, x):
        return cls.fn(x)


def unary(name: str, fn, result_dtype=_same, amp: str = "follow") -> type[OpDef]:
    cls = type(_class_name(name), (UnaryOp,), {
        "name": f"cuvil.{name}", "fn": staticmethod(fn), "result_dtype": staticmethod(result_dtype),
        "amp": amp, "__doc__": f"Elementwise {name}.", "__module__": __name__})
    return register_op(cls)


def _class_name(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_")) + "Op"


NegOp = unary("neg", torch.neg, _numeric)
AbsOp = unary("abs", torch.abs, _numeric)
ExpOp = unary("exp", torch.exp, _floating, amp="never")
LogOp = unary("log", torch.log, _floating, amp="never")
Log1pOp = unary("log1p", torch.log1p, _floating, amp="never")
Expm1Op = unary("expm1", torch.expm1, _floating, amp="never")
SqrtOp = unary("sqrt", torch.sqrt, _floating)
RsqrtOp = unary("rsqrt", torch.rsqrt, _floating, amp="never")
SinOp = unary("sin", torch.sin, _floating)
CosOp = unary("cos", torch.cos, _floating)
TanOp = unary("tan", torch.tan, _floating)
AtanOp = unary("atan", torch.atan, _floating)
AsinOp = unary("asin", torch.asin, _floating)
AcosOp = unary("acos", torch.acos, _floating)
SinhOp = unary("sinh", torch.sinh, _floating)
CoshOp = unary("cosh", torch.cosh, _floating)
AsinhOp = unary("asinh", torch.asinh, _floating)
AcoshOp = unary("acosh", torch.acosh, _floating)
AtanhOp = unary("atanh", torch.atanh, _floating)
TanhOp = unary("tanh", torch.tanh, _floating)
SigmoidOp = unary("sigmoid", torch.sigmoid, _floating)
ReluOp = unary("relu", torch.relu, _numeric)
SiluOp = unary("silu", F.silu, _float_only)
ErfOp = unary("erf", torch.erf, _floating)
ReciprocalOp = unary("reciprocal", torch.reciprocal, _floating, amp="never")
LogicalNotOp = unary("logical_not", torch.logical_not, _boolean)
FloorOp = unary("floor", torch.floor, _numeric)
CeilOp = unary("ceil", torch.ceil, _numeric)
RoundOp = unary("round", torch.round, _numeric)
TruncOp = unary("trunc", torch.trunc, _numeric)
SignOp = unary("sign", torch.sign, _same)


@register_op
class GeluOp(OpDef):
    """GELU, exact (`none`) or with the tanh approximation."""
    name = "cuvil.gelu"
    operands = ("x",)
    attrs = {"approximate": optional("str", "none")}
    tags = frozenset({"elementwise"})
    amp = "follow"

    @staticmethod
    def infer(types, attrs):
        (x,) = types
        require_float(x, "x")
        if attrs["approximate"] not in ("none", "tanh"):
            raise ValueError(f"approximate must be \"none\" or \"tanh\", got {attrs['approximate']!r}")
        return [x]

    @staticmethod
    def evaluate(attrs, x):
        return F.gelu(x, approximate=attrs["approximate"])


@register_op
class ClampOp(OpDef):
    """Clamp to [min, max]; either bound may be none. The result keeps the input dtype, so the
    bounds of an integer tensor must be whole numbers."""
    name = "cuvil.clamp"
    operands = ("x",)
    attrs = {"min": optional("float?"), "max": optional("float?")}
    tags = frozenset({"elementwise"})
    amp = "follow"

    @staticmethod
    def infer(types, attrs):
        (x,) = types
        bounds = [attrs["min"], attrs["max"]]
        if not x.dtype.is_float and any(b is not None and not float(b).is_integer() for b in bounds):
            raise ValueError(f"bounds of an integer clamp must be whole numbers, got {bounds} for {x}")
        return [x]

    @staticmethod
    def evaluate(attrs, x):
        lo, hi = attrs["min"], attrs["max"]
        if not x.is_floating_point():
            lo, hi = (None if b is None else int(b) for b in (lo, hi))
        return torch.clamp(x, lo, hi)


@register_op
class CheckIndexOp(OpDef):
    """`index` itself, each value checked to lie in [0, size): the index of a scatter (`of`, along
    `dim`), whose decomposition into comparisons would write nothing for one outside, where torch
    raises. With `negative`, values in [-size, size) pass, those below 0 counted from the end
    (index + size: an index_put's). The kernel computing it fails the call with `CuvilIndexError`
    for one outside."""
    name = "cuvil.check_index"
    operands = ("index",)
    attrs = {"size": required("dims"), "dim": required("int"), "of": required("str"),
             "negative": optional("bool", False)}
    tags = frozenset({"elementwise"})

    @staticmethod
    def infer(types, attrs):
        (index,) = types
        if index.dtype not in (DType.i64, DType.i32):
            raise ValueError(f"index must be i64 or i32, got {index}")
        if len(attrs["size"]) != 1:
            raise ValueError(f"size must be one dim, got {attrs['size']}")
        return [index]

    @staticmethod
    def evaluate(attrs, index):
        size = int(attrs["size"][0])
        lo = -size if attrs["negative"] else 0
        if index.numel() and not (lo <= int(index.min()) and int(index.max()) < size):
            raise IndexError(f"{attrs['of']}: an index outside [{lo}, {size - 1}] in dim {attrs['dim']}")
        return torch.where(index < 0, index + size, index) if attrs["negative"] else index


@register_op
class CheckTrueOp(OpDef):
    """`x` itself, where every element of `cond` (bool, broadcast to x) is true; else the call
    fails with `message` (a model's `torch._assert_async`: F.one_hot's index range). The kernel
    computing it checks `cond`."""
    name = "cuvil.check_true"
    operands = ("x", "cond")
    attrs = {"message": required("str")}
    tags = frozenset({"elementwise"})

    @staticmethod
    def infer(types, attrs):
        x, cond = types
        if cond.dtype is not DType.bool:
            raise ValueError(f"cond must be bool, got {cond}")
        if cond.rank > x.rank or len(broadcast_shapes(x, cond)) != x.rank or \
                any(not dims_equal(a, b) for a, b in zip(broadcast_shapes(x, cond), x.shape)):
            raise ValueError(f"cond {cond} does not broadcast to x {x}")
        return [x]

    @staticmethod
    def evaluate(attrs, x, cond):
        if not bool(cond.all()):
            raise RuntimeError(attrs["message"])
        return x


@register_op
class CastOp(OpDef):
    """Convert to another dtype (torch `.to(dtype)`: floats truncate toward zero into integers)."""
    name = "cuvil.cast"
    operands = ("x",)
    attrs = {"dtype": required("dtype")}
    tags = frozenset({"elementwise"})

    @staticmethod
    def infer(types, attrs):
        return [types[0].with_dtype(attrs["dtype"])]

    @staticmethod
    def evaluate(attrs, x):
        return x.to(attrs["dtype"].torch)


# ----------------------------------------------------------------------------- binary

def _promoted(a: TensorType, b: TensorType) -> DType:
    return promote(a, b)


def _arith(a: TensorType, b: TensorType) -> DType:
    dtype = promote(a, b)
    if dtype is DType.bool:
        raise ValueError(f"this op is not defined on two bool tensors ({types_str([a, b])})")
    return dtype


def _subtract(a: TensorType, b: TensorType) -> DType:
    if DType.bool in (a.dtype, b.dtype):
        raise ValueError(f"sub is not defined on bool tensors ({types_str([a, b])})")
    return promote(a, b)


def _true_div(a: TensorType, b: TensorType) -> DType:
    return to_float(promote(a, b))


def _predicate(a: TensorType, b: TensorType) -> DType:
    return DType.bool


def _bitwise(a: TensorType, b: TensorType) -> DType:
    dtype = promote(a, b)
    if dtype not in INTEGER_DTYPES and dtype is not DType.bool:
        raise ValueError(f"bitwise ops need integer or bool tensors, got {types_str([a, b])}")
    return dtype


class BinaryOp(OpDef):
    operands = ("a", "b")
    amp = "follow"
    result_dtype: Callable[[TensorType, TensorType], DType] = staticmethod(_promoted)
    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

    @classmethod
    def infer(cls, types, attrs):
        a, b = types
        return [TensorType(cls.result_dtype(a, b), broadcast_shapes(a, b))]

    @classmethod
    def evaluate(cls, attrs, a, b):
        return cls.fn(a, b)


def binary(name: str, fn, result_dtype=_promoted, commutative: bool = False, amp: str = "follow") -> type[OpDef]:
    tags = {"elementwise", "commutative"} if commutative else {"elementwise"}
    cls = type(_class_name(name), (BinaryOp,), {
        "name": f"cuvil.{name}", "fn": staticmethod(fn), "result_dtype": staticmethod(result_dtype),
        "tags": frozenset(tags), "amp": amp, "__doc__": f"Elementwise {name} with broadcasting.",
        "__module__": __name__})
    return register_op(cls)


AddOp = binary("add", torch.add, commutative=True)
SubOp = binary("sub", torch.sub, _subtract)
MulOp = binary("mul", torch.mul, commutative=True)
DivOp = binary("div", torch.div, _true_div)
PowOp = binary("pow", torch.pow, _arith, amp="never")
Atan2Op = binary("atan2", torch.atan2, _true_div)
MaximumOp = binary("maximum", torch.maximum, commutative=True)
MinimumOp = binary("minimum", torch.minimum, commutative=True)
EqOp = binary("eq", torch.eq, _predicate, commutative=True)
NeOp = binary("ne", torch.ne, _predicate, commutative=True)
LtOp = binary("lt", torch.lt, _predicate)
LeOp = binary("le", torch.le, _predicate)
GtOp = binary("gt", torch.gt, _predicate)
GeOp = binary("ge", torch.ge, _predicate)
LogicalAndOp = binary("logical_and", torch.logical_and, _predicate, commutative=True)
LogicalOrOp = binary("logical_or", torch.logical_or, _predicate, commutative=True)
BitwiseAndOp = binary("bitwise_and", torch.bitwise_and, _bitwise, commutative=True)
BitwiseOrOp = binary("bitwise_or", torch.bitwise_or, _bitwise, commutative=True)
BitwiseXorOp = binary("bitwise_xor", torch.bitwise_xor, _bitwise, commutative=True)
FloorDivOp = binary("floor_div", lambda a, b: torch.div(a, b, rounding_mode="floor"), _arith)
RemainderOp = binary("remainder", torch.remainder, _arith)
FmodOp = binary("fmod", torch.fmod, _arith)


@register_op
class WhereOp(OpDef):
    """`cond ? a : b` with three-way broadcasting; `cond` is i1."""
    name = "cuvil.where"
    operands = ("cond", "a", "b")
    tags = frozenset({"elementwise"})
    amp = "follow"

    @staticmethod
    def infer(types, attrs):
        cond, a, b = types
        if cond.dtype is not DType.bool:
            raise ValueError(f"cond must be an i1 tensor, got {cond}")
        return [TensorType(promote(a, b), broadcast_shapes(cond, a, b))]

    @staticmethod
    def evaluate(attrs, cond, a, b):
        return torch.where(cond, a, b)

