"""Ops without tensor operands (const, literal, size, full, arange) and the terminator, return."""
from __future__ import annotations

import math

import torch

from ..core import OpDef, optional, register_op, required
from ..types import DType, TensorType, norm_dim
from .common import ceildiv, dims, shape_str


@register_op
class ConstOp(OpDef):
    """A named module constant (a weight). Its type is given when the op is created:
    `Builder.create("cuvil.const", attrs={"name": n}, result_types=[t])`."""
    name = "cuvil.const"
    attrs = {"name": required("str")}
    amp = "follow"
    explicit_result_types = True

    @staticmethod
    def infer(types, attrs):
        raise ValueError(f"the type of constant @{attrs.get('name')} cannot be inferred; "
                         f"create cuvil.const with result_types=[its type]")

    @staticmethod
    def verify(op, module):
        if len(op.results) != 1:
            raise ValueError(f"cuvil.const has exactly one result, got {len(op.results)}")
        t = op.results[0].type
        if not t.is_static:
            raise ValueError(f"constant @{op.attrs['name']} must have a static type, got {t}")
        data = module.const_type(op.attrs["name"])
        if data is not None and data != t:
            raise ValueError(f"constant @{op.attrs['name']} is declared as {t} but its data is {data}")


def _check_scalar(value, dtype: DType) -> None:
    if isinstance(value, float) and not dtype.is_float and not value.is_integer():
        raise ValueError(f"value {value!r} does not fit dtype {dtype}")


@register_op
class LiteralOp(OpDef):
    """A rank-0 scalar constant."""
    name = "cuvil.literal"
    attrs = {"value": required("any"), "dtype": required("dtype")}
    amp = "follow"

    @staticmethod
    def infer(types, attrs):
        _check_scalar(attrs["value"], attrs["dtype"])
        return [TensorType(attrs["dtype"], ())]

    @staticmethod
    def evaluate(attrs):
        return torch.tensor(attrs["value"], dtype=attrs["dtype"].torch)


@register_op
class SizeOp(OpDef):
    """A rank-0 tensor holding a size (`size`: one dim, symbolic where the shapes are), used as a
    value: `torch.arange(n) + past_length` with a dynamic past length."""
    name = "cuvil.size"
    attrs = {"size": required("dims"), "dtype": required("dtype")}
    amp = "follow"

    @staticmethod
    def infer(types, attrs):
        if len(attrs["size"]) != 1:
            raise ValueError(f"cuvil.size holds one dim, got {shape_str(attrs['size'])}")
        if attrs["dtype"] is DType.bool:
            raise ValueError("cuvil.size cannot be bool")
        return [TensorType(attrs["dtype"], ())]

    @staticmethod
    def evaluate(attrs):
        return torch.tensor(attrs["size"][0], dtype=attrs["dtype"].torch)


@register_op
class FullOp(OpDef):
    """A tensor of `shape` filled with `value` (zeros, ones, full)."""
    name = "cuvil.full"
    attrs = {"shape": required("dims"), "value": required("any"), "dtype": required("dtype")}
    amp = "follow"

    @staticmethod
    def infer(types, attrs):
        _check_scalar(attrs["value"], attrs["dtype"])
        shape = dims(attrs["shape"])
        if any(isinstance(d, int) and d < 0 for d in shape):
            raise ValueError(f"shape {shape_str(shape)} has a negative size")
        return [TensorType(attrs["dtype"], shape)]

    @staticmethod
    def evaluate(attrs):
        return torch.full(attrs["shape"], attrs["value"], dtype=attrs["dtype"].torch)


@register_op
class ArangeOp(OpDef):
    """`[start, start + step, ...)` below `end`, a one-element dims list (it may be symbolic)."""
    name = "cuvil.arange"
    attrs = {"start": optional("any", 0), "end": required("dims"), "step": optional("any", 1),
             "dtype": required("dtype")}
    amp = "follow"

    @staticmethod
    def infer(types, attrs):
        start, step, end = attrs["start"], attrs["step"], attrs["end"]
        if len(end) != 1 or step == 0:
            raise ValueError(f"arange needs a one-element end and a non-zero step, got end = {end}, step = {step}")
        end = norm_dim(end[0])
        if isinstance(end, int):
            length = max(math.ceil((end - start) / step), 0)
        elif isinstance(start, int) and isinstance(step, int) and step > 0:
            length = ceildiv(norm_dim(end - start), step)
        else:
            raise ValueError(f"a symbolic end ({end}) needs an integer start and a positive integer step")
        return [TensorType(attrs["dtype"], (length,))]

    @staticmethod
    def evaluate(attrs):
        return torch.arange(attrs["start"], attrs["end"][0], attrs["step"], dtype=attrs["dtype"].torch)


@register_op
class ReturnOp(OpDef):
    """The terminator: the function's results."""
    name = "cuvil.return"
    operands = ("values*",)

    @staticmethod
    def infer(types, attrs):
        return []

