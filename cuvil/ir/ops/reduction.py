"""Reductions over axes (sum, mean, amax, amin, prod, var, argmax, argmin), running folds along one
(cumsum, cumprod, cummax, cummin, logcumsumexp and the indices of cummax/cummin), argtopk and
softmax."""
from __future__ import annotations

from typing import Callable

import torch

from ..core import OpDef, optional, register_op, required
from ..types import DType, TensorType
from .common import check_axes, check_axis, require_float, require_not_bool


def reduced_shape(x: TensorType, axes: list[int], keepdim: bool) -> tuple:
    """Shape after reducing `axes` (all axes when empty)."""
    axes = set(axes) if axes else set(range(x.rank))
    if keepdim:
        return tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    return tuple(d for i, d in enumerate(x.shape) if i not in axes)


def _accumulate(x: TensorType) -> DType:
    """sum and prod accumulate integers and bools in i64, like torch."""
    return x.dtype if x.dtype.is_float else DType.i64


def _keep(x: TensorType) -> DType:
    return x.dtype


def _float_only(x: TensorType) -> DType:
    require_float(x, "x")
    return x.dtype


class ReduceOp(OpDef):
    operands = ("x",)
    attrs = {"dims": optional("ints", []), "keepdim": optional("bool", False)}
    tags = frozenset({"reduction"})
    amp = "never"
    result_dtype: Callable[[TensorType], DType] = staticmethod(_keep)
    fn: Callable

    @classmethod
    def infer(cls, types, attrs):
        (x,) = types
        axes = check_axes(attrs["dims"], x.rank)
        return [TensorType(cls.result_dtype(x), reduced_shape(x, axes, attrs["keepdim"]))]

    @classmethod
    def evaluate(cls, attrs, x):
        return cls.fn(x, tuple(attrs["dims"]), attrs["keepdim"])    # () reduces every axis


def reduction(name: str, fn, result_dtype=_keep, amp: str = "never") -> type[OpDef]:
    cls = type(name.capitalize() + "Op", (ReduceOp,), {
        "name": f"cuvil.{name}", "fn": staticmethod(fn), "result_dtype": staticmethod(result_dtype),
        "amp": amp, "__doc__": f"{name} over `dims` (all axes when empty).", "__module__": __name__})
    return register_op(cls)


def _prod(x, axes, keepdim):
    for a in sorted(axes or range(max(x.dim(), 1)), reverse=True):    # torch.prod takes one axis at a time
        x = torch.prod(x, a, keepdim=keepdim)
    return x


SumOp = reduction("sum", lambda x, axes, keepdim: torch.sum(x, axes, keepdim=keepdim), _accumulate)
MeanOp = reduction("mean", lambda x, axes, keepdim: torch.mean(x, axes, keepdim=keepdim), _float_only)
AmaxOp = reduction("amax", lambda x, axes, keepdim: torch.amax(x, axes, keepdim=keepdim), amp="follow")
AminOp = reduction("amin", lambda x, axes, keepdim: torch.amin(x, axes, keepdim=keepdim), amp="follow")
ProdOp = reduction("prod", _prod, _accumulate)


@register_op
class VarOp(OpDef):
    """Variance over `dims` with `correction` (1 = unbiased)."""
    name = "cuvil.var"
    operands = ("x",)
    attrs = {"dims": optional("ints", []), "correction": optional("float", 1.0), "keepdim": optional("bool", False)}
    tags = frozenset({"reduction"})
    amp = "never"

    @staticmethod
    def infer(types, attrs):
        (x,) = types
        require_float(x, "x")
        axes = check_axes(attrs["dims"], x.rank)
        return [x.with_shape(reduced_shape(x, axes, attrs["keepdim"]))]

    @staticmethod
    def evaluate(attrs, x):
        axes = tuple(attrs["dims"]) or None
        return torch.var(x, axes, correction=attrs["correction"], keepdim=attrs["keepdim"])


class ArgReduceOp(OpDef):
    operands = ("x",)
    attrs = {"dim": optional("int?"), "keepdim": optional("bool", False)}
    tags = frozenset({"reduction"})
    fn: Callable

    @staticmethod
    def infer(types, attrs):
        (x,) = types
        require_not_bool(x, "x")
        dim = attrs["dim"]
        axes = [] if dim is None else [check_axis(dim, x.rank)]
        return [TensorType(DType.i64, reduced_shape(x, axes, attrs["keepdim"]))]

    @classmethod
    def evaluate(cls, attrs, x):
        return cls.fn(x, attrs["dim"], keepdim=attrs["keepdim"])


@register_op
class ArgmaxOp(ArgReduceOp):
    """Index of the largest element along `dim` (of the flattened tensor when `dim` is none)."""
    name = "cuvil.argmax"
    fn = staticmethod(torch.argmax)


@register_op
class ArgminOp(ArgReduceOp):
    """Index of the smallest element along `dim` (of the flattened tensor when `dim` is none)."""
    name = "cuvil.argmin"
    fn = staticmethod(torch.argmin)


class ScanOp(OpDef):
    """A running fold along `dim`: element i is the fold of the elements 0..i."""
    operands = ("x",)
    attrs = {"dim": required("int")}
    amp = "never"
    result_dtype: Callable[[TensorType], DType]
    fn: Callable

    @classmethod
    def infer(cls, types, attrs):
        (x,) = types
        check_axis(attrs["dim"], max(x.rank, 1))
        return [x.with_dtype(cls.result_dtype(x))]

    @classmethod
    def evaluate(cls, attrs, x):
        return cls.fn(x, attrs["dim"])


def _not_bool(x: TensorType) -> DType:
    require_not_bool(x, "x")
    return x.dtype


def _indices_of(x: TensorType) -> DType:
    require_not_bool(x, "x")
    return DType.i64


def scan(name: str, fn, result_dtype, doc: str) -> type[OpDef]:
    cls = type(name.capitalize() + "Op", (ScanOp,), {
        "name": f"cuvil.{name}", "fn": staticmethod(fn), "result_dtype": staticmethod(result_dtype),
        "__doc__": doc, "__module__": __name__})
    return register_op(cls)


CumsumOp = scan("cumsum", torch.cumsum, _accumulate,
                "Running sum along `dim`; integers and bools accumulate in i64 like torch.")
CumprodOp = scan("cumprod", torch.cumprod, _accumulate,
                 "Running product along `dim`; integers and bools accumulate in i64 like torch.")
LogcumsumexpOp = scan("logcumsumexp", torch.logcumsumexp, _float_only,
                      "log of the running sum of exp along `dim`, without overflow.")
CummaxOp = scan("cummax", lambda x, dim: torch.cummax(x, dim).values, _not_bool,
                "Running maximum along `dim`, as torch.cummax's values: an element at least the maximum so "
                "far, or NaN, takes its place (so NaN stays, and -0 replaces an equal +0).")
CumminOp = scan("cummin", lambda x, dim: torch.cummin(x, dim).values, _not_bool,
                "Running minimum along `dim`, as torch.cummin's values.")
CumargmaxOp = scan("cumargmax", lambda x, dim: torch.cummax(x, dim).indices, _indices_of,
                   "The index of cummax's element: torch.cummax's indices (the last of equal maxima).")
CumargminOp = scan("cumargmin", lambda x, dim: torch.cummin(x, dim).indices, _indices_of,
                   "The index of cummin's element: torch.cummin's indices.")


TOPK_ORDERS = ("stable", "topk", "topk_unsorted", "kthvalue")


@register_op
class ArgtopkOp(OpDef):
    """Indices of the `k` largest elements along `dim` (the smallest with `largest` false; the
    whole row, sorted, when `k` is none), NaN above every number. Equal values by `order`:
    "stable" by index (torch.sort's order, and torch.median's), "topk" as torch.topk's CPU kernel
    leaves them (its selection's steps decide), "topk_unsorted" all in the order of
    torch.topk(sorted=False); "kthvalue" gives the k-th smallest alone (a size of 1 along `dim`),
    of equal values the one torch.kthvalue's quickselect picks. topk, sort, argsort, kthvalue and
    median gather their values at these."""
    name = "cuvil.argtopk"
    operands = ("x",)
    attrs = {"k": optional("int?"), "dim": required("int"), "largest": optional("bool", True),
             "order": optional("str", "stable")}

    @staticmethod
    def infer(types, attrs):
        (x,) = types
        require_not_bool(x, "x")
        if attrs["order"] not in TOPK_ORDERS:
            raise ValueError(f"order must be one of {', '.join(TOPK_ORDERS)}, not {attrs['order']!r}")
        if attrs["order"] != "stable" and attrs["k"] is None:
            raise ValueError(f"order {attrs['order']!r} needs a k")
        if attrs["order"] == "kthvalue" and attrs["largest"]:
            raise ValueError("order 'kthvalue' picks the smallest (largest = false)")
        d, k = check_axis(attrs["dim"], x.rank), attrs["k"]
        n = x.shape[d]
        if k is None:
            return [TensorType(DType.i64, x.shape)]
        if k < 0 or (isinstance(n, int) and k > n):
            raise ValueError(f"k = {k} is out of range for {n} elements along dim {d}")
        if attrs["order"] == "kthvalue" and k < 1:
            raise ValueError(f"order 'kthvalue' needs k >= 1, not {k}")
        kept = 1 if attrs["order"] == "kthvalue" else k
        return [TensorType(DType.i64, tuple(kept if a == d else s for a, s in enumerate(x.shape)))]

    @staticmethod
    def evaluate(attrs, x):
        if attrs["order"] == "kthvalue":
            return torch.kthvalue(x, attrs["k"], dim=attrs["dim"], keepdim=True).indices
        if attrs["order"] != "stable":
            return torch.topk(x, attrs["k"], dim=attrs["dim"], largest=attrs["largest"],
                              sorted=attrs["order"] == "topk").indices
        # a stable sort keeps equal values in index order; torch's sort puts NaN above numbers
        order = torch.sort(x, dim=attrs["dim"], descending=attrs["largest"], stable=True).indices
        return order if attrs["k"] is None else order.narrow(attrs["dim"], 0, attrs["k"])


class SoftmaxBase(OpDef):
    operands = ("x",)
    attrs = {"dim": required("int")}
    tags = frozenset({"reduction"})
    amp = "never"
    fn: Callable

    @staticmethod
    def infer(types, attrs):
        (x,) = types
        require_float(x, "x")
        check_axis(attrs["dim"], max(x.rank, 1))
        return [x]

    @classmethod
    def evaluate(cls, attrs, x):
        return cls.fn(x, attrs["dim"])


@register_op
class SoftmaxOp(SoftmaxBase):
    """softmax along `dim`."""
    name = "cuvil.softmax"
    fn = staticmethod(torch.softmax)


@register_op
class LogSoftmaxOp(SoftmaxBase):
    """log_softmax along `dim`."""
    name = "cuvil.log_softmax"
    fn = staticmethod(torch.log_softmax)
