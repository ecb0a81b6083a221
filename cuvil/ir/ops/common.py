"""Shared pieces of the op declarations: dtype promotion, symbolic broadcasting, axis checks.

Every helper raises `ValueError` with a message that names the offending types, so that the
builder and the verifier can report it with the op and its location.
"""
from __future__ import annotations

import functools
from typing import Sequence

import sympy
import torch

from ..types import Dim, DType, TensorType, dim_str, dims_equal, floordiv, norm_dim

INTEGER_DTYPES = frozenset({DType.i64, DType.i32, DType.i8})


def types_str(types: Sequence[TensorType]) -> str:
    return ", ".join(map(str, types))


def shape_str(shape: Sequence[Dim]) -> str:
    return "[" + ", ".join(map(dim_str, shape)) + "]"


# ----------------------------------------------------------------------------- dtypes

@functools.lru_cache(maxsize=None)
def _result_type(key: tuple[tuple[DType, bool], ...]) -> DType:
    # torch's own promotion: rank-0 tensors rank below dimensioned ones of the same category.
    tensors = [torch.empty(() if scalar else (0,), dtype=dt.torch) for dt, scalar in key]
    out = tensors[0]
    dtype = out.dtype
    for t in tensors[1:]:
        dtype = torch.result_type(out, t)
        out = torch.empty(() if out.dim() == 0 and t.dim() == 0 else (0,), dtype=dtype)
    return DType.from_torch(dtype)


def promote(*types: TensorType) -> DType:
    """The dtype torch computes for an op on these operands (`torch.result_type`)."""
    return _result_type(tuple((t.dtype, t.rank == 0) for t in types))


def to_float(dtype: DType) -> DType:
    """Integer and bool inputs of a floating-point function compute in f32, like torch."""
    return dtype if dtype.is_float else DType.f32


def require_float(t: TensorType, what: str = "operand") -> None:
    if not t.dtype.is_float:
        raise ValueError(f"{what} must be a floating-point tensor, got {t}")


def require_not_bool(t: TensorType, what: str = "operand") -> None:
    if t.dtype is DType.bool:
        raise ValueError(f"{what} cannot be a bool tensor, got {t}")


def require_integer(t: TensorType, what: str) -> None:
    if t.dtype not in INTEGER_DTYPES:
        raise ValueError(f"{what} must be an integer tensor, got {t}")


def require_same_dtype(types: Sequence[TensorType]) -> DType:
    dtypes = {t.dtype for t in types}
    if len(dtypes) != 1:
        raise ValueError(f"operands must have one dtype, got {types_str(types)}")
    return types[0].dtype


# ----------------------------------------------------------------------------- shapes

def is_one(d: Dim) -> bool:
    return isinstance(d, int) and d == 1


def broadcast_shapes(*types: TensorType) -> tuple[Dim, ...]:
    """numpy broadcasting over symbolic dims: each pair is equal or one side is 1."""
    rank = max(t.rank for t in types)
    out: list[Dim] = [1] * rank
    for t in types:
        for i, d in enumerate(t.shape, start=rank - t.rank):
            if is_one(d):
                continue
            if is_one(out[i]) or dims_equal(out[i], d):
                out[i] = d
            else:
                raise ValueError(f"cannot broadcast {types_str(types)}: dim {d} against {out[i]}")
    return tuple(out)


def check_axis(axis, rank: int, what: str = "dim", allow_end: bool = False) -> int:
    """A non-negative axis below `rank` (or equal to it when `allow_end`)."""
    hi = rank + 1 if allow_end else rank
    if not isinstance(axis, int) or isinstance(axis, bool) or not 0 <= axis < hi:
        raise ValueError(f"{what} = {axis} is out of range for rank {rank} (the IR holds only axes 0..{hi - 1})")
    return axis


def check_axes(axes: Sequence[int], rank: int, what: str = "dims") -> list[int]:
    out = [check_axis(a, rank, what) for a in axes]
    if len(set(out)) != len(out):
        raise ValueError(f"{what} = {list(axes)} repeats an axis")
    return out


def dims(values: Sequence) -> list[Dim]:
    """A `dims` attribute as normalised dims (ints or sympy expressions)."""
    return [norm_dim(v) for v in values]


def product(ds: Sequence[Dim]) -> Dim:
    n = sympy.Integer(1)
    for d in ds:
        n = n * d
    return norm_dim(n)


def ceildiv(a: Dim, b: int) -> Dim:
    return floordiv(norm_dim(sympy.sympify(a) + b - 1), b)


def pair(values: Sequence[int], what: str) -> tuple[int, int]:
    """A 2-d window parameter given as one or two ints."""
    values = list(values)
    if len(values) == 1:
        values *= 2
    if len(values) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ValueError(f"{what} must be one or two ints, got {values}")
    return values[0], values[1]


def window_out(size: Dim, kernel: int, stride: int, padding: int, dilation: int, ceil_mode: bool) -> Dim:
    """Output length of a convolution or pooling window along one dim (torch's formula)."""
    span = norm_dim(sympy.sympify(size) + 2 * padding - dilation * (kernel - 1) - 1)
    if not ceil_mode:
        out = norm_dim(floordiv(span, stride) + 1)
    elif isinstance(size, int):
        out = -(-span // stride) + 1
        if (out - 1) * stride >= size + padding:   # the last window must start inside the input
            out -= 1
    elif dilation * (kernel - 1) + 1 > padding + stride - 1:
        # the last window always starts inside: (out - 1) * stride < span + stride, which is at
        # most size + padding when the window is longer than padding + stride - 1
        out = norm_dim(ceildiv(span, stride) + 1)
    else:
        raise ValueError(f"ceil_mode pooling over a symbolic dim ({size}) with a window of {kernel} no longer than "
                         f"padding + stride - 1 is not supported (whether its last window fits depends on the size)")
    if isinstance(out, int) and out <= 0:
        raise ValueError(f"window of {kernel} (dilation {dilation}, padding {padding}) does not fit in {size}")
    return out
