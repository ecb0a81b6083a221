"""ATen -> Cuvil graph IR: one row per ATen overload (Inductor-style lowering table).

A row is `row(L, *args)`: `L` is the importer's `Lowering` (emit ops, read torch's result
shape/dtype, literals, casts, axes) and `args` are the overload's schema arguments in order,
defaults filled in. A row returns a Cuvil value, a tuple of them (multi-result ATen ops; parts
Cuvil does not produce are `Unavailable`), a dim (symbolic-int arithmetic), or None (asserts).

Every overload with a row is also kept whole by `decomposition_table()`: `linear`,
`scaled_dot_product_attention`, `layer_norm`, `softmax`, `silu`... stay single ops instead of
being decomposed into core ATen, because Cuvil has them directly.

Shapes that ATen states with `-1` or symbolic sizes (view, expand, full, split) are read from
torch's own result metadata (`L.out_shape()`), already expressed in Cuvil's symbols.
"""
from __future__ import annotations

import functools
import math
import operator

import sympy
import torch

from ..ir import DType
from ..ir.core import Value
from ..ir.types import dims_equal, norm_dim
from ..ir.ops.common import broadcast_shapes, window_out
from ..ir.ops.layout import PAD_MODES
from .decompositions import cuvil_decompositions
from .importer import DATA_SIZED, Lowering, Unavailable, op_name
from .resampling import RESAMPLING, repeat_each
from .random_draws import NOT_DECOMPOSED
from .value_bounds import integer_bounds, proven

aten = torch.ops.aten


# ----------------------------------------------------------------------------- row makers

def unary(name: str):
    """Elementwise op; the input is cast to the result dtype first (torch promotes int -> float)."""
    def row(L: Lowering, x, *_):
        dtype = L.out_dtype()
        return L.op(name, x if dtype is DType.bool else L.cast(x, dtype))
    return row


def binary(name: str, int_to_float: bool = False):
    """Elementwise op on tensors or scalars, both brought to torch's promoted dtype."""
    def row(L: Lowering, a, b, *_):
        dtype = L.promoted(a, b, int_to_float=int_to_float)
        return L.op(name, L.tensor(a, dtype), L.tensor(b, dtype))
    return row


def scaled(name: str):
    """add/sub with torch's `alpha` multiplier on the second operand."""
    def row(L: Lowering, a, b, alpha=1):
        return binary(name)(L, a, _times(L, b, alpha))
    return row


def logical_or_bitwise(logical: str, bitwise: str):
    def row(L: Lowering, a, b):
        return binary(logical if L.out_dtype() is DType.bool else bitwise)(L, a, b)
    return row


def reduction(name: str):
    """sum/mean/amax/amin/prod over `dims` (None or [] = all); the input is cast to the result dtype."""
    def row(L: Lowering, x, dims=None, keepdim=False, *_):
        return _as_out_dtype(L, L.op(name, L.cast(x, L.out_dtype()), dims=_reduced_axes(L, dims, x),
                                     keepdim=bool(keepdim)))
    return row


def _reduced_axes(L: Lowering, dims, x) -> list[int]:
    """torch lets a 0-d tensor be reduced over dim 0 or -1: that is the whole (one-element) tensor."""
    return L.axes(dims, x.type.rank) if x.type.rank else []


def reduction_all(name: str):
    """sum/mean/max/min of every element (`sum.default`, `mean.default`, `max.default`, `min.default`)."""
    def row(L: Lowering, x, *_):
        return _as_out_dtype(L, L.op(name, L.cast(x, L.out_dtype()), dims=[], keepdim=False))
    return row


def _as_out_dtype(L: Lowering, y):
    """A sum or product of integers is i64 in Cuvil as in torch unless `dtype=` asks for i32 (the
    wrapped i64 result is the wrapped i32 one: both are the exact result modulo 2^32)."""
    return y if y.type.dtype is L.out_dtype() else L.cast(y, L.out_dtype())


def arg_reduction(name: str):
    def row(L: Lowering, x, dim=None, keepdim=False):
        return L.op(name, x, dim=None if dim is None or not x.type.rank else L.axis(dim, x.type.rank),
                    keepdim=keepdim)
    return row


def along_dim(name: str):
    """softmax / log_softmax / cumsum / cumprod / logcumsumexp: one axis; the input is cast to the
    result dtype (and a running sum of i32 asked for, which Cuvil folds in i64, cast back: the
    same wrapped values)."""
    def row(L: Lowering, x, dim, *_):
        dtype = L.out_dtype()
        return L.cast(L.op(name, L.cast(x, dtype), dim=L.axis(dim, x.type.rank)), dtype)
    return row


def running_extreme(which: str):
    """cummax / cummin: the running values and their indices (bools compared as integers)."""
    def row(L: Lowering, x, dim):
        d = L.axis(dim, x.type.rank) if x.type.rank else 0
        keys = L.cast(x, DType.i8) if x.type.dtype is DType.bool else x
        values = L.op(f"cuvil.cum{which}", keys, dim=d)
        return L.cast(values, x.type.dtype), L.op(f"cuvil.cumarg{which}", keys, dim=d)
    return row


def identity(L: Lowering, x, *_):
    return x


def no_op(L: Lowering, *_):
    return None


def size_condition(L: Lowering, *_):
    """A comparison of sizes; only `_assert_scalar` may use it, and capture has decided those."""
    for user in L.node.users:
        if user.target is not aten._assert_scalar.default and ATEN_TABLE.get(user.target) is not size_condition:
            L.unsupported(f"a condition on sizes used by {op_name(user.target)}, not by an assertion")
    return None


def symbolic_int(L: Lowering, *_):
    """sym_size and arithmetic on symbolic ints: the value torch computed, as a Cuvil dim."""
    return L.torch_dim(L.val())


_SIZE_ARITHMETIC = {"cuvil.add": operator.add, "cuvil.sub": operator.sub, "cuvil.mul": operator.mul}


def _size_value(x):
    """The integer a rank-0 tensor holds where it is sizes and constants combined by +, - and *
    (DeBERTa's `torch.tensor(min(q, 32))` and `32 - att_span`), or the greatest or least element
    of an arange over a size, else None."""
    if x.is_arg or x.type.rank != 0 or x.type.dtype.is_float:
        return None
    op = x.owner
    if op.name == "cuvil.size":
        return sympy.sympify(op.attrs["size"][0])
    if op.name in ("cuvil.literal", "cuvil.full"):
        return sympy.Integer(op.attrs["value"])
    if op.name == "cuvil.cast":
        return _size_value(op.operands[0])
    if op.name == "cuvil.neg":
        v = _size_value(op.operands[0])
        return None if v is None else -v
    if op.name in _SIZE_ARITHMETIC:
        a, b = (_size_value(v) for v in op.operands)
        return None if a is None or b is None else _SIZE_ARITHMETIC[op.name](a, b)
    if op.name in ("cuvil.amax", "cuvil.amin") and (ends := _arange_ends(op.operands[0])) is not None:
        return ends[1] if op.name == "cuvil.amax" else ends[0]
    return None


def _arange_ends(x):
    """The least and greatest values of an integer `arange` over a size (and of views that list its
    elements again: Reformer's `position_ids.max().item()`, positions broadcast over the batch)."""
    if x.is_arg or x.type.dtype.is_float:
        return None
    op = x.owner
    if op.name in ("cuvil.reshape", "cuvil.permute", "cuvil.expand", "cuvil.squeeze", "cuvil.unsqueeze",
                   "cuvil.flip", "cuvil.copy", "cuvil.cast"):
        return _arange_ends(op.operands[0])
    if op.name != "cuvil.arange" or not all(float(op.attrs[k]).is_integer() for k in ("start", "step")):
        return None
    start, step = int(op.attrs["start"]), int(op.attrs["step"])
    last = start + step * (sympy.sympify(x.type.shape[0]) - 1)
    return (start, last) if step > 0 else (last, start)


def local_scalar_dense(L: Lowering, x):
    """`.item()` of a tensor that holds a size (`_size_value`: a slice bound): that size, as a dim.
    A value only assertions read gets the bounds its ops give it, which `assert_scalar` proves
    them with (value_bounds.py). Any other tensor's value is data a compiled program's shapes
    cannot follow."""
    size = _size_value(x)
    bounds = integer_bounds(x) if size is None else None
    if bounds is not None and all(ATEN_TABLE.get(u.target) is size_condition for u in L.node.users):
        L.data_bounds[L.val().node.expr] = bounds
        return None
    if size is None:
        L.unsupported("a tensor's value read as a Python number (.item(), or a tensor as a slice bound or "
                      "size): Cuvil compiles no sizes that depend on tensor values")
    expr = L.val().node.expr
    if isinstance(expr, sympy.Symbol) and not L.symbols.knows(expr):
        L.symbols.bind(expr, size)
    return norm_dim(size)


def sym_storage_offset(L: Lowering, x):
    """Where a slice starts in its base's storage, for torch's checks on it (a slice between
    `.item()` bounds): the base's offset plus the start times its stride, from torch's own view of
    the base. Cuvil's values have no storage; any other view is refused."""
    view = L.node.args[0]
    if view.target is not aten.slice.Tensor:
        L.unsupported("the storage offset of a view other than a slice")
    base, dim, first = (list(view.args) + [0, None])[:3]
    first = L.torch_dim(first.meta["val"] if isinstance(first, torch.fx.Node) else first or 0)
    base = base.meta["val"]
    offset, strides = base.storage_offset(), base.stride()
    span = L.symbols.span(first)
    if not isinstance(offset, int) or not all(isinstance(st, int) for st in strides) or span is None or span[0] < 0:
        L.unsupported("the storage offset of a slice with a dynamic offset or stride, or a start from the end")
    result = norm_dim(offset + sympy.sympify(first) * strides[L.axis(dim, base.dim())])
    expr = L.val().node.expr
    if isinstance(expr, sympy.Symbol) and not L.symbols.knows(expr):
        L.symbols.bind(expr, result)
    return result


def like_full(value_index: int | None = None, fill=None):
    """full / zeros / ones / *_like / new_* / scalar_tensor: shape and dtype from torch's result."""
    def row(L: Lowering, *args):
        value = fill if value_index is None else args[value_index]
        dtype, shape = L.out_dtype(), list(L.out_shape())
        if isinstance(value, sympy.Basic) and dtype is not DType.bool:   # a size as the value: torch.tensor(n)
            size = L.literal(value, dtype)
            return size if not shape else L.op("cuvil.expand", size, shape=shape)
        return L.op("cuvil.full", shape=shape, value=L.scalar(value, dtype), dtype=dtype)
    return row


def pair(v) -> list[int]:
    v = [v] if isinstance(v, int) else list(v)
    return v * 2 if len(v) == 1 else v


# ----------------------------------------------------------------------------- rows with their own logic

def reshape(L: Lowering, x, *_):
    shape = L.out_shape()
    return x if x.type.shape == shape else L.op("cuvil.reshape", x, shape=list(shape))


def expand(L: Lowering, x, *_):
    shape = L.out_shape()
    return x if x.type.shape == shape else L.op("cuvil.expand", x, shape=list(shape))


def copy(L: Lowering, x, src, *_):
    """aten.copy (functionalised `x[...] = src` / `x.copy_(src)`): src broadcast to x's shape, in
    x's dtype; x's values are not read."""
    return expand(L, L.cast(src, L.out_dtype()))


def permute(L: Lowering, x, perm):
    return L.op("cuvil.permute", x, perm=L.axes(perm, x.type.rank))


def transpose(L: Lowering, x, d0, d1):
    if x.type.rank == 0:    # torch allows dims 0 and -1 of a 0-d tensor: nothing to swap
        return x
    perm = list(range(x.type.rank))
    d0, d1 = L.axis(d0, x.type.rank), L.axis(d1, x.type.rank)
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return x if d0 == d1 else L.op("cuvil.permute", x, perm=perm)


def t(L: Lowering, x):
    return transpose(L, x, 0, 1) if x.type.rank == 2 else x


def numpy_t(L: Lowering, x):
    """`x.T`: the dims reversed (Falcon's attention)."""
    return x if x.type.rank < 2 else L.op("cuvil.permute", x, perm=list(range(x.type.rank))[::-1])


def slice_(L: Lowering, x, dim=0, start=None, end=None, step=1):
    dim = L.axis(dim, x.type.rank)
    size = x.type.shape[dim]
    start, end = _bound(L, start, size, 0), _bound(L, end, size, size)
    if _at_most(L, norm_dim(sympy.sympify(end) - start), 0):
        start = end             # empty at every size in the range (x[:, -3:18] of a dim from 21 on)
    if start == 0 and end == size and step == 1:
        return x
    return L.op("cuvil.slice", x, dim=dim, start=[start], end=[end], step=step)


def slice_scatter(L: Lowering, x, src, dim=0, start=None, end=None, step=1):
    dim = L.axis(dim, x.type.rank)
    size = x.type.shape[dim]
    start, end = _bound(L, start, size, 0), _bound(L, end, size, size)
    src = L.cast(src, x.type.dtype)
    if start == 0 and end == size and step == 1 and src.type.shape == x.type.shape:
        return src
    return L.op("cuvil.slice_scatter", x, src, dim=dim, start=[start], end=[end], step=step)


def select_scatter(L: Lowering, x, src, dim, index):
    """x[..., index, ...] = src: a one-wide slice_scatter of src with the dim put back."""
    dim = L.axis(dim, x.type.rank)
    size = x.type.shape[dim]
    at = index % size if isinstance(size, int) else (size + index if index < 0 else index)
    piece = L.op("cuvil.unsqueeze", L.cast(src, x.type.dtype), dim=dim)
    return L.op("cuvil.slice_scatter", x, piece, dim=dim, start=[at], end=[norm_dim(sympy.sympify(at) + 1)], step=1)


def _bound(L: Lowering, b, size, default):
    """A slice bound as a dim: None -> default; negative ints count from the end; static ints are
    clamped (torch writes "to the end" as a huge int), also at a symbolic size whose range
    torch.export settled lies below them (`x[:, :100]` of a dim it found to be at most 99).
    Symbolic bounds are Cuvil dims already, counted from the end where they are negative over the
    ranges (`x[-(n//2):]`)."""
    if b is None:
        return default
    if not isinstance(b, int):
        span = L.symbols.span(b)
        if span is not None and span[1] < 0:
            return norm_dim(sympy.sympify(size) + b)
        if span is None or span[0] < 0:
            L.unsupported(f"a slice bound {b} that is negative at some sizes and not at others")
        return b
    if isinstance(size, int):
        return max(0, min(b + size if b < 0 else b, size))
    if b >= 1 << 62 or _at_most(L, size, b):
        return size
    if b < 0 and _at_most(L, size, -b):     # counts from the end past the start at every size: clamped
        return 0
    L.symbols.require_at_least(size, abs(b))    # a smaller size would clamp the bound
    return size + b if b < 0 else b


def _at_most(L: Lowering, d, n: int) -> bool:
    """Dim `d` is at most `n` over the ranges of its symbols."""
    span = L.symbols.span(d)
    return span is not None and span[1] <= n


def select(L: Lowering, x, dim, index):
    dim = L.axis(dim, x.type.rank)
    size = x.type.shape[dim]
    L.symbols.require_at_least(size, index + 1 if index >= 0 else -index)
    if index >= 0 or isinstance(size, int):
        return L.op("cuvil.select", x, dim=dim, index=index % size if isinstance(size, int) else index)
    # a negative index into a symbolic dim: a one-wide slice at size+index, then drop the dim
    one = L.op("cuvil.slice", x, dim=dim, start=[size + index], end=[size + index + 1], step=1)
    return L.op("cuvil.squeeze", one, dims=[dim])


def split(L: Lowering, x, _sizes, dim=0):
    """The pieces' sizes from torch's results, pinned as `x`'s dim was (`_pinned`): over a range
    that torch narrowed, `x[:-1:3]`'s length is a number while its pieces' read `(1 + s0)//3 - 1`."""
    dim = L.axis(dim, x.type.rank)
    sizes = [L.symbols.pin(L.symbols.shape(v)[dim]) for v in L.val()]
    return tuple(L.multi("cuvil.split", [x], dim=dim, sizes=sizes))


def unfold(L: Lowering, x, dim, size, step):
    return L.op("cuvil.unfold", x, dim=L.axis(dim, max(x.type.rank, 1)), size=size, step=step)


def im2col(L: Lowering, x, kernel_size, dilation, padding, stride):
    """F.unfold: each (dilated, strided, zero-padded) kh x kw window of each channel as a column,
    [N, C * kh * kw, windows]: two sliding-window views of the padded image, the dilated taps
    picked by strided slices, then one permute and reshape (the only copy)."""
    if x.type.rank == 3:        # an unbatched image
        return L.op("cuvil.squeeze", im2col(L, L.op("cuvil.unsqueeze", x, dim=0), kernel_size, dilation, padding,
                                              stride), dims=[0])
    (kh, kw), (dh, dw), (ph, pw), (sh, sw) = (pair(v) for v in (kernel_size, dilation, padding, stride))
    y = pad(L, x, [pw, pw, ph, ph]) if ph or pw else x
    for dim, k, d, step in ((2, kh, dh, sh), (3, kw, dw, sw)):
        y = L.op("cuvil.unfold", y, dim=dim, size=(k - 1) * d + 1, step=step)       # taps as a new last dim
        if d > 1:
            y = L.op("cuvil.slice", y, dim=y.type.rank - 1, start=[0], end=[(k - 1) * d + 1], step=d)
    y = L.op("cuvil.permute", y, perm=[0, 1, 4, 5, 2, 3])      # [N, C, kh, kw, OH, OW]
    n, c, _, _, oh, ow = y.type.shape
    return L.op("cuvil.reshape", y, shape=[n, norm_dim(sympy.sympify(c) * kh * kw), norm_dim(sympy.sympify(oh) * ow)])


def cat(L: Lowering, xs, dim=0):
    dtype = L.out_dtype()
    rank = max(x.type.rank for x in xs)
    kept = [x for x in xs if not (x.type.rank == 1 and x.type.shape[0] == 0)] or xs[:1]   # torch skips empty 1-d
    xs = [L.cast(x, dtype) for x in kept]
    return xs[0] if len(xs) == 1 else L.op("cuvil.cat", *xs, dim=L.axis(dim, rank))


def stack(L: Lowering, xs, dim=0):
    """Each tensor given a new dim of size 1 there, then joined along it (GPT-J's rotary embeddings)."""
    dim = L.axis(dim, xs[0].type.rank + 1)
    return cat(L, [L.op("cuvil.unsqueeze", x, dim=dim) for x in xs], dim)


def diff(L: Lowering, x, n=1, dim=-1, prepend=None, append=None):
    """x[1:] - x[:-1] along `dim`, n times, after prepend and append are joined on (a bool tensor's
    difference is `!=`, as torch's)."""
    dim = L.axis(dim, x.type.rank)
    parts = [p for p in (prepend, x, append) if p is not None]
    if len(parts) > 1:
        x = L.op("cuvil.cat", *parts, dim=dim)
    step = "cuvil.ne" if x.type.dtype is DType.bool else "cuvil.sub"
    for _ in range(n):
        size = x.type.shape[dim]
        x = L.op(step, slice_(L, x, dim, 1, size), slice_(L, x, dim, 0, size - 1))
    return x


def flip(L: Lowering, x, dims):
    rank = x.type.rank
    return L.op("cuvil.flip", x, dims=sorted({L.axis(d, rank) for d in dims}))


def pad(L: Lowering, x, pads, mode="constant", value=None):
    """torch.nn.functional.pad: (before, after) amounts from the last dim backwards."""
    rank = x.type.rank
    if len(pads) % 2 or len(pads) // 2 > rank:
        L.unsupported(f"padding {list(pads)} for a rank-{rank} tensor")
    if mode not in PAD_MODES:
        L.unsupported(f"pad mode '{mode}'")
    low, high = [0] * rank, [0] * rank
    for k in range(len(pads) // 2):
        low[rank - 1 - k], high[rank - 1 - k] = pads[2 * k], pads[2 * k + 1]
    if all(isinstance(p, int) for p in pads):
        return L.op("cuvil.pad", x, low=low, high=high, mode=mode, value=float(value or 0))
    if mode != "constant" or not all(L.symbols.never_negative(p) for p in pads):
        L.unsupported(f"{mode} padding by amounts that depend on the input's shape ({list(pads)}), which Cuvil "
                      f"compiles only for constant padding by amounts that cannot be negative")
    return _pad_by_sizes(L, x, low, high, value or 0)


def _pad_by_sizes(L: Lowering, x, low: list, high: list, value):
    """Constant padding by amounts that are sizes (Swin pads an image to whole windows by
    (4 - h % 4) % 4): along each padded dim, the fill joined on before and after (either may be
    empty at run time)."""
    for d, amounts in enumerate(zip(low, high)):
        shape = list(x.type.shape)
        fills = []
        for amount in amounts:
            shape[d] = amount
            fills.append(None if amount == 0 else
                         L.op("cuvil.full", shape=list(shape), value=L.scalar(value, x.type.dtype), dtype=x.type.dtype))
        if fills != [None, None]:
            x = L.op("cuvil.cat", *[p for p in (fills[0], x, fills[1]) if p is not None], dim=d)
    return x


def unsqueeze(L: Lowering, x, dim):
    return L.op("cuvil.unsqueeze", x, dim=L.axis(dim, x.type.rank + 1))


def squeeze(L: Lowering, x, dims=None):
    if x.type.rank == 0:    # dim 0 / -1 of a 0-d tensor: nothing to squeeze
        return x
    dims = range(x.type.rank) if dims is None else L.axes(dims, x.type.rank)
    ones = [d for d in dims if x.type.shape[d] == 1]
    return L.op("cuvil.squeeze", x, dims=ones) if ones else x


def to_copy(L: Lowering, x, *_):
    return L.cast(x, L.out_dtype())


def where(L: Lowering, cond, a, b):
    dtype = L.promoted(a, b)
    return L.op("cuvil.where", cond, L.tensor(a, dtype), L.tensor(b, dtype))


def masked_fill(L: Lowering, x, mask, value):
    """The result keeps x's dtype (the fill value is converted to it, not promoted with it)."""
    return L.op("cuvil.where", mask, L.tensor(value, x.type.dtype), x)


def logical_not(L: Lowering, x):
    if x.type.dtype is not DType.bool:
        L.unsupported("bitwise not of an integer tensor")
    return L.op("cuvil.logical_not", x)


def clamp(L: Lowering, x, lo=None, hi=None):
    if isinstance(lo, sympy.Basic) or isinstance(hi, sympy.Basic):     # a size as a bound
        return clamp_tensor(L, L.cast(x, L.out_dtype()), lo, hi)
    return L.op("cuvil.clamp", L.cast(x, L.out_dtype()), min=None if lo is None else float(lo),
                max=None if hi is None else float(hi))


def gelu(L: Lowering, x, approximate="none"):
    return L.op("cuvil.gelu", x, approximate=approximate)


def hardsigmoid(L: Lowering, x):
    """relu6(x + 3) / 6."""
    return binary("cuvil.div")(L, clamp(L, binary("cuvil.add")(L, x, 3), 0, 6), 6)


def hardswish(L: Lowering, x):
    """x * relu6(x + 3) / 6, multiplied before the division as torch's kernel does."""
    return binary("cuvil.div")(L, binary("cuvil.mul")(L, x, clamp(L, binary("cuvil.add")(L, x, 3), 0, 6)), 6)


def glu(L: Lowering, x, dim=-1):
    """F.glu: the first half along `dim` times the sigmoid of the second, as torch's kernel
    computes it. Imported directly: without this row the whole model went through
    `run_decompositions` (a Conformer's convolution module: 0.28 s of its 0.75 s compile)."""
    dim = L.axis(dim, x.type.rank)
    half = L.symbols.pin(L.out_shape()[dim])
    first, second = slice_(L, x, dim, 0, half), slice_(L, x, dim, half, None)
    return binary("cuvil.mul")(L, first, unary("cuvil.sigmoid")(L, second))


def div_mode(L: Lowering, a, b, rounding_mode=None):
    if rounding_mode is None:
        return binary("cuvil.div", int_to_float=True)(L, a, b)
    if rounding_mode == "floor":
        return binary("cuvil.floor_div")(L, a, b)
    if rounding_mode != "trunc":
        L.unsupported(f"rounding_mode={rounding_mode!r}")
    if L.out_dtype().is_float:
        return L.op("cuvil.trunc", binary("cuvil.div")(L, a, b))
    # integers: the floor quotient, one up where the division is inexact and the signs differ
    q = binary("cuvil.floor_div")(L, a, b)
    inexact = binary("cuvil.ne")(L, binary("cuvil.remainder")(L, a, b), 0)
    signs_differ = binary("cuvil.ne")(L, binary("cuvil.lt")(L, a, 0), binary("cuvil.lt")(L, b, 0))
    return binary("cuvil.add")(L, q, L.op("cuvil.logical_and", inexact, signs_differ))


def pow_(L: Lowering, a, b):
    return binary("cuvil.pow")(L, a, b)


def rsub(L: Lowering, x, other, alpha=1):
    return binary("cuvil.sub")(L, other, _times(L, x, alpha))


def leaky_relu(L: Lowering, x, slope=0.01):
    return where(L, binary("cuvil.gt")(L, x, 0), x, binary("cuvil.mul")(L, x, slope))


def elu(L: Lowering, x, alpha=1.0, scale=1.0, input_scale=1.0):
    """scale * x above 0, scale * alpha * expm1(input_scale * x) at or below (selu and celu too)."""
    neg = binary("cuvil.mul")(L, L.op("cuvil.expm1", _times(L, x, input_scale)), float(alpha) * float(scale))
    return where(L, binary("cuvil.gt")(L, x, 0), _times(L, x, scale), neg)


def softplus(L: Lowering, x, beta=1.0, threshold=20.0):
    """log1p(exp(beta * x)) / beta, and x itself where beta * x is above the threshold."""
    bx = _times(L, x, beta)
    soft = L.op("cuvil.log1p", L.op("cuvil.exp", bx))
    return where(L, binary("cuvil.gt")(L, bx, threshold), x, soft if beta == 1 else binary("cuvil.div")(L, soft, beta))


def log_sigmoid(L: Lowering, x):
    """min(x, 0) - log1p(exp(-|x|)): no overflow at either end."""
    tail = L.op("cuvil.log1p", L.op("cuvil.exp", L.op("cuvil.neg", L.op("cuvil.abs", x))))
    return L.op("cuvil.sub", binary("cuvil.minimum")(L, x, 0.0), tail)


def var(L: Lowering, x, dims=None, correction=None, keepdim=False):
    correction = 1.0 if correction is None else float(correction)
    return L.op("cuvil.var", x, dims=_reduced_axes(L, dims, x), correction=correction, keepdim=keepdim)


def max_dim(L: Lowering, x, dim, keepdim=False):
    values = L.op("cuvil.amax", x, dims=_reduced_axes(L, [dim], x), keepdim=keepdim)
    ordered = L.cast(x, DType.i8) if x.type.dtype is DType.bool else x     # argmax orders numbers, not bools
    return values, arg_reduction("cuvil.argmax")(L, ordered, dim, keepdim)


def min_dim(L: Lowering, x, dim, keepdim=False):
    values = L.op("cuvil.amin", x, dims=_reduced_axes(L, [dim], x), keepdim=keepdim)
    ordered = L.cast(x, DType.i8) if x.type.dtype is DType.bool else x
    return values, arg_reduction("cuvil.argmin")(L, ordered, dim, keepdim)


def _argtopk(L: Lowering, x, d: int, k, largest: bool, order: str = "stable"):
    """`cuvil.argtopk` over x (half floats widened, exactly, for the runtime's topk)."""
    if x.type.dtype is DType.bool:
        L.unsupported("a bool tensor (torch has no topk or sort for it either)")
    keys = L.cast(x, DType.f32) if x.type.dtype in (DType.f16, DType.bf16) else x
    return L.op("cuvil.argtopk", keys, k=k, dim=d, largest=largest, order=order)


def topk(L: Lowering, x, k, dim=-1, largest=True, sorted=True):
    """The k largest (or smallest) elements along `dim` and their indices, in torch's order: NaN
    above every number, equal values as torch.topk's CPU kernel leaves them (and with
    `sorted=False` every value in its order)."""
    rank = x.type.rank
    if rank == 0:
        x = _vector(L, x)
    if isinstance(k, sympy.Basic):
        L.unsupported(f"a symbolic k ({k})")
    d = L.axis(dim, x.type.rank)
    indices = _argtopk(L, x, d, k, largest, "topk" if sorted else "topk_unsorted")
    values = L.op("cuvil.gather", x, indices, dim=d)
    if rank == 0:
        values, indices = (L.op("cuvil.reshape", v, shape=[]) for v in (values, indices))
    return values, indices


def sort(L: Lowering, x, dim=-1, descending=False):
    if x.type.rank == 0:
        return topk(L, x, 1, dim, descending)
    d = L.axis(dim, x.type.rank)
    indices = _argtopk(L, x, d, None, descending)
    return L.op("cuvil.gather", x, indices, dim=d), indices


def sort_stable(L: Lowering, x, stable=None, dim=-1, descending=False):
    return sort(L, x, dim, descending)         # ties keep their order either way


def kthvalue(L: Lowering, x, k, dim=-1, keepdim=False):
    """The k-th smallest along `dim` (NaN counted above every number); of equal values the one
    torch.kthvalue's quickselect picks."""
    return _kth(L, x, k, dim, keepdim, "kthvalue")


def _kth(L: Lowering, x, k, dim, keepdim: bool, order: str):
    """The k-th smallest along `dim` and its index: `cuvil.argtopk` in `order` ("kthvalue": the
    k-th alone; "stable": the k smallest, the last of them the k-th)."""
    rank = x.type.rank
    x1 = _vector(L, x) if rank == 0 else x
    d = L.axis(dim, x1.type.rank)
    indices = _argtopk(L, x1, d, k, False, order)
    if order != "kthvalue":
        indices = slice_(L, indices, d, k - 1, k)
    values = L.op("cuvil.gather", x1, indices, dim=d)
    if rank and keepdim:
        return values, indices
    shape = [s for i, s in enumerate(values.type.shape) if i != d]
    return tuple(L.op("cuvil.reshape", v, shape=shape) for v in (values, indices))


def _flat(L: Lowering, x):
    numel = 1
    for s in x.type.shape:
        numel = numel * s
    return x if x.type.rank == 1 else L.op("cuvil.reshape", x, shape=[norm_dim(numel)])


def median_dim(L: Lowering, x, dim=-1, keepdim=False):
    """The lower median along `dim`; a row holding NaN gives NaN at its first NaN, as torch does."""
    d = L.axis(dim, x.type.rank) if x.type.rank else 0
    n = x.type.shape[d] if x.type.rank else 1
    if not isinstance(n, int):
        L.unsupported(f"a row of symbolic length ({n}): Cuvil needs the median's position when compiling")
    values, indices = _kth(L, x, (n - 1) // 2 + 1, dim, keepdim, "stable")     # torch's median: the lowest index
    if not x.type.dtype.is_float:
        return values, indices
    nan = binary("cuvil.ne")(L, x, x)
    dims = [d] if x.type.rank else []
    any_nan = L.op("cuvil.amax", nan, dims=dims, keepdim=keepdim)
    shape = [1] * x.type.rank
    if x.type.rank:
        shape[d] = n
    iota = L.op("cuvil.reshape", L.op("cuvil.arange", start=0, end=[n], step=1, dtype=DType.i64), shape=shape)
    first_nan = L.op("cuvil.amin", where(L, nan, iota, n), dims=dims, keepdim=keepdim)
    return where(L, any_nan, math.nan, values), where(L, any_nan, first_nan, indices)


def truth(L: Lowering, x):
    """x != 0 as a bool tensor (x itself when it is one)."""
    return x if x.type.dtype is DType.bool else binary("cuvil.ne")(L, x, 0)


def any_(L: Lowering, x, dims=None, keepdim=False):
    return L.op("cuvil.amax", truth(L, x), dims=_reduced_axes(L, [dims] if isinstance(dims, int) else dims, x),
                keepdim=bool(keepdim))


def all_(L: Lowering, x, dims=None, keepdim=False):
    """Every element true: none false."""
    return L.op("cuvil.logical_not", any_(L, L.op("cuvil.logical_not", truth(L, x)), dims, keepdim))


def clamp_tensor(L: Lowering, x, lo=None, hi=None):
    """clamp with tensor bounds: max(x, lo), then min(., hi) (NaN in either propagates, as in torch)."""
    y = x if lo is None else binary("cuvil.maximum")(L, x, lo)
    return y if hi is None else binary("cuvil.minimum")(L, y, hi)


def vector_norm(L: Lowering, x, ord=2, dims=None, keepdim=False, dtype=None):
    """torch.linalg.vector_norm: sum(|x|^ord)^(1/ord); inf / -inf the largest / smallest |x|, 0 the
    count of non-zeros."""
    if dtype is not None:
        x = L.cast(x, DType.from_torch(dtype))
    axes, keep = _reduced_axes(L, dims, x), bool(keepdim)
    mag = L.op("cuvil.abs", x)
    if ord in (math.inf, -math.inf):
        return L.op("cuvil.amax" if ord > 0 else "cuvil.amin", mag, dims=axes, keepdim=keep)
    if ord == 0:
        return L.op("cuvil.sum", L.cast(truth(L, x), x.type.dtype), dims=axes, keepdim=keep)
    if ord == 1:
        return L.op("cuvil.sum", mag, dims=axes, keepdim=keep)
    if ord == 2:
        return L.op("cuvil.sqrt", L.op("cuvil.sum", L.op("cuvil.mul", x, x), dims=axes, keepdim=keep))
    total = L.op("cuvil.sum", binary("cuvil.pow")(L, mag, float(ord)), dims=axes, keepdim=keep)
    return binary("cuvil.pow")(L, total, 1.0 / float(ord))


def weight_norm(L: Lowering, v, g, dim=0):
    """torch's `_weight_norm`: v * (g / the 2-norm of v over every dim but `dim`; -1: over all of v).
    On a module's weights, fold-constants computes it at compile time."""
    keep = [] if dim == -1 else [L.axis(dim, v.type.rank)]
    axes = [a for a in range(v.type.rank) if a not in keep]
    norm = L.op("cuvil.sqrt", L.op("cuvil.sum", L.op("cuvil.mul", v, v), dims=axes, keepdim=True))
    return binary("cuvil.mul")(L, v, binary("cuvil.div")(L, g, norm))


def repeat_interleave(L: Lowering, x, repeats, dim=None, output_size=None):
    """Each element repeated `repeats` times in place along `dim` (along the flattened tensor
    without one): views."""
    if not isinstance(repeats, int):
        L.unsupported("a repeat count that is not a constant")
    if dim is None:
        x, dim = _flat(L, x), 0
    return repeat_each(L, x, L.axis(dim, x.type.rank), repeats)


def repeat(L: Lowering, x, repeats):
    """x tiled `repeats` times along each dim (leading repeats add dims): per dim, a new axis in
    front expanded to the count, then merged into the dim. Views only."""
    shape = [1] * (len(repeats) - x.type.rank) + list(x.type.shape)
    y = L.op("cuvil.reshape", x, shape=shape) if len(shape) != x.type.rank else x
    tiled = [d for r, n in zip(repeats, shape) for d in (r, n)]
    y = L.op("cuvil.reshape", y, shape=[d for n in shape for d in (1, n)])
    y = L.op("cuvil.expand", y, shape=tiled)
    return L.op("cuvil.reshape", y, shape=[norm_dim(sympy.sympify(n) * r) for r, n in zip(repeats, shape)])


def roll(L: Lowering, x, shifts, dims=()):
    """Each dim rotated by its shift: a circular pad by the shift, cut back to the dim's size (the
    index becomes (i - shift) mod size). Without dims, the flattened tensor is rolled."""
    if not dims:
        flat = L.op("cuvil.reshape", x, shape=[-1])
        return L.op("cuvil.reshape", roll(L, flat, shifts, [0]), shape=list(x.type.shape))
    rank, y = x.type.rank, x
    for shift, dim in zip(shifts, dims):
        d = L.axis(dim, rank)
        size = y.type.shape[d]
        if not isinstance(size, int):
            y = _roll_by_pieces(L, y, shift, d, size)
            continue
        k = shift % size if size else 0
        if k:
            low = [k if i == d else 0 for i in range(rank)]
            y = L.op("cuvil.pad", y, low=low, high=[0] * rank, mode="circular", value=0.0)
            y = L.op("cuvil.slice", y, dim=d, start=[0], end=[size], step=1)
    return y


def _roll_by_pieces(L: Lowering, x, shift: int, d: int, size):
    """x rolled by a constant along dim d of symbolic size: its last `shift` rows, then the rest
    (Swin's shifted windows over a dynamic image). Every size the range allows must be at least
    the shift, which then needs no modulo (a shift of the whole size is none)."""
    span = L.symbols.span(size)
    if span is None or span[0] < abs(shift):
        L.unsupported(f"roll by {shift} along a dim of symbolic size {size}, whose range allows sizes below "
                      f"{abs(shift)} (where the shift wraps around more than once)")
    if shift == 0:
        return x
    cut = norm_dim(sympy.sympify(size) - shift) if shift > 0 else -shift
    tail = L.op("cuvil.slice", x, dim=d, start=[cut], end=[size], step=1)
    head = L.op("cuvil.slice", x, dim=d, start=[0], end=[cut], step=1)
    return L.op("cuvil.cat", tail, head, dim=d)


def _ones(L: Lowering, shape, like):
    """A missing weight in front of a present bias (optional operands can only be left off at the end)."""
    return L.op("cuvil.full", shape=list(shape), value=1.0, dtype=like.type.dtype)


def _trailing(*vals):
    vals = list(vals)
    while vals and vals[-1] is None:
        vals.pop()
    return vals


def layer_norm(L: Lowering, x, normalized_shape, weight=None, bias=None, eps=1e-5, *_):
    if weight is None and bias is not None:
        weight = _ones(L, normalized_shape, x)
    return L.op("cuvil.layer_norm", x, *_trailing(weight, bias), normalized_ndim=len(normalized_shape),
                eps=float(eps))


def native_layer_norm(L: Lowering, x, normalized_shape, weight, bias, eps):
    missing = Unavailable("the saved mean/rstd of native_layer_norm (training-only outputs)")
    return layer_norm(L, x, normalized_shape, weight, bias, eps), missing, missing


def group_norm(L: Lowering, x, groups, weight=None, bias=None, eps=1e-5, *_):
    """[N, C, *S] normalised over each group of C/groups channels and S: a layer norm over the
    last dims of [N, groups, C/groups, *S], then the per-channel affine."""
    n, c, *spatial = x.type.shape
    if not isinstance(c, int) or c % groups:
        L.unsupported(f"group_norm of {c} channels in {groups} groups")
    y = L.op("cuvil.reshape", x, shape=[n, groups, c // groups, *spatial])
    y = L.op("cuvil.layer_norm", y, normalized_ndim=1 + len(spatial), eps=float(eps))
    y = L.op("cuvil.reshape", y, shape=[n, c, *spatial])
    per_channel = [c] + [1] * len(spatial)
    if weight is not None:
        y = L.op("cuvil.mul", y, L.op("cuvil.reshape", weight, shape=per_channel))
    if bias is not None:
        y = L.op("cuvil.add", y, L.op("cuvil.reshape", bias, shape=per_channel))
    return y


def native_group_norm(L: Lowering, x, weight, bias, _n, _c, _hw, groups, eps):
    missing = Unavailable("the saved mean/rstd of native_group_norm (training-only outputs)")
    return group_norm(L, x, groups, weight, bias, eps), missing, missing


def instance_norm(L: Lowering, x, weight, bias, mean, var_, use_input_stats, momentum, eps, *_):
    """Each sample's channels normalised over their own spatial dims (group norm with a group per
    channel); with running statistics instead (track_running_stats in eval), a batch norm."""
    if not use_input_stats:
        return batch_norm(L, x, weight, bias, mean, var_, momentum, eps)[0]
    return group_norm(L, x, x.type.shape[1], weight, bias, eps)


def rms_norm(L: Lowering, x, normalized_shape, weight=None, eps=None):
    return L.op("cuvil.rms_norm", x, *_trailing(weight), normalized_ndim=len(normalized_shape),
                eps=None if eps is None else float(eps))


def batch_norm(L: Lowering, x, weight, bias, mean, var_, momentum, eps):
    if weight is None and bias is not None:
        weight = _ones(L, mean.type.shape, x)
    out = L.op("cuvil.batch_norm", x, mean, var_, *_trailing(weight, bias), eps=float(eps))
    missing = Unavailable("the saved statistics of batch_norm (training-only outputs)")
    return out, missing, missing


def batch_statistics_norm(L: Lowering, x, weight, bias, training, momentum, eps):
    """Batch norm over the batch's own statistics, with no running ones to update (BiT's weight
    standardisation normalises its convolution weights this way): mean and biased variance per
    channel, over every dim but the channels."""
    dims = [0, *range(2, x.type.rank)]
    mean = L.op("cuvil.mean", x, dims=dims, keepdim=False)
    var_ = L.op("cuvil.var", x, dims=dims, correction=0.0, keepdim=False)
    out = batch_norm(L, x, weight, bias, mean, var_, momentum, eps)[0]
    return out, mean, L.op("cuvil.rsqrt", binary("cuvil.add")(L, var_, float(eps)))


def inference_batch_norm(L: Lowering, x, weight, bias, mean, var_, training, momentum, eps, *_):
    """aten.batch_norm as torch.export leaves it before decompositions (`export.needs_decomposition`
    sends training mode through the decompositions)."""
    return batch_norm(L, x, weight, bias, mean, var_, momentum, eps)[0]


def gemm_op(L: Lowering, name: str, *operands, **attrs):
    """A GEMM-based op (linear, matmul, conv2d, sdpa). With f16 or bf16 operands it computes in f32
    and rounds its result once, as torch's CPU kernels accumulate in f32 (Cuvil's GEMMs are f32).
    An integer matmul or linear is computed exactly without a GEMM (`_integer_matmul`)."""
    dtype = operands[0].type.dtype
    mixed = sorted({o.type.dtype.name for o in operands[:2]} - {dtype.name})
    if mixed:      # torch.export's shapes pass this; eager refuses it when it runs
        L.unsupported(f"operands of dtypes {dtype.name} and {', '.join(mixed)}: a product of mixed dtypes, "
                      f"which eager PyTorch refuses too (cast one operand to the other's dtype)")
    if dtype is DType.bool:
        L.unsupported("a product of bool tensors, which eager PyTorch refuses too (cast them to an integer dtype)")
    if not dtype.is_float and name in _INTEGER_PRODUCTS:
        return _INTEGER_PRODUCTS[name](L, *operands)
    if dtype not in (DType.f16, DType.bf16):
        return L.op(name, *operands, **attrs)
    wide = [L.cast(o, DType.f32) if o.type.dtype is dtype else o for o in operands]
    return L.cast(L.op(name, *wide, **attrs), dtype)


def _integer_matmul(L: Lowering, a, b):
    """torch.matmul of integer tensors: a[..., i, k] * b[..., k, j] broadcast over [..., i, k, j]
    and summed over k. A GEMM computes in f32, whose sums are inexact past 2**24; integer sums are
    exact, and wrap on overflow as torch's integer kernels do (the i64 sum cast back to the dtype
    keeps the low bits that the dtype's own sum would)."""
    rows = a if a.type.rank > 1 else L.op("cuvil.unsqueeze", a, dim=0)
    cols = b if b.type.rank > 1 else L.op("cuvil.unsqueeze", b, dim=1)
    products = L.op("cuvil.mul", L.op("cuvil.unsqueeze", rows, dim=rows.type.rank),
                    L.op("cuvil.unsqueeze", cols, dim=cols.type.rank - 2))
    out = L.cast(L.op("cuvil.sum", products, dims=[products.type.rank - 2], keepdim=False), a.type.dtype)
    vectors = [d for d, x in ((out.type.rank - 2, a), (out.type.rank - 1, b)) if x.type.rank == 1]
    return L.op("cuvil.squeeze", out, dims=vectors) if vectors else out


def _integer_linear(L: Lowering, x, weight, bias=None):
    out = _integer_matmul(L, x, t(L, weight))
    return out if bias is None else L.op("cuvil.add", out, bias)


_INTEGER_PRODUCTS = {"cuvil.matmul": _integer_matmul, "cuvil.linear": _integer_linear}


def linear(L: Lowering, x, weight, bias=None):
    return gemm_op(L, "cuvil.linear", x, weight, *_trailing(bias))


def matmul(L: Lowering, a, b):
    return gemm_op(L, "cuvil.matmul", a, b)


def einsum(L: Lowering, equation: str, operands, path=None):
    """torch.einsum as products of two operands at a time, left to right, as torch's own einsum
    computes it: letters that one operand has and nothing later needs are summed out first; then
    the pair is permuted to [batch, free, contracted] and [batch, contracted, free], each run of
    letters merged into one dim, and multiplied as one batched matmul (views around one product).
    A letter repeated within one operand (a diagonal) is refused."""
    terms, out = _einsum_subscripts(L, equation, operands)
    cur, letters = operands[0], terms[0]
    for k in range(1, len(operands)):
        after = set(out).union(*terms[k + 1:])      # the letters needed once this pair is multiplied
        cur, letters = _sum_out(L, cur, letters, after | set(terms[k]))
        other, other_letters = _sum_out(L, operands[k], terms[k], after | set(letters))
        cur, letters = _einsum_pair(L, cur, letters, other, other_letters, after)
    cur, letters = _sum_out(L, cur, letters, set(out))
    return _permuted(L, cur, [letters.index(c) for c in out])


def _einsum_subscripts(L: Lowering, equation: str, operands) -> tuple[list[str], str]:
    """Each operand's letters and the output's, an ellipsis spelled out as letters of its own
    (right-aligned across operands, as torch broadcasts them)."""
    lhs, arrow, rhs = equation.replace(" ", "").partition("->")
    terms = lhs.split(",")
    widths = [x.type.rank - len(t.replace("...", "")) for t, x in zip(terms, operands)]
    ellipsis = "".join(chr(0x100 + i) for i in range(max([w for t, w in zip(terms, widths) if "..." in t], default=0)))
    terms = [t.replace("...", ellipsis[len(ellipsis) - w:]) for t, w in zip(terms, widths)]
    if arrow:
        out = rhs.replace("...", ellipsis)
    else:       # torch's implicit output: the ellipsis, then the letters used once, sorted
        once = [c for c in set("".join(terms)) if c not in ellipsis and "".join(terms).count(c) == 1]
        out = ellipsis + "".join(sorted(once))
    for t in terms:
        if len(set(t)) != len(t):
            L.unsupported(f"einsum '{equation}': a subscript repeated within one operand (a diagonal)")
    return terms, out


def _sum_out(L: Lowering, x, letters: str, keep: set) -> tuple:
    gone = [i for i, c in enumerate(letters) if c not in keep]
    if not gone:
        return x, letters
    return L.op("cuvil.sum", x, dims=gone, keepdim=False), "".join(c for c in letters if c in keep)


def _einsum_pair(L: Lowering, a, a_letters: str, b, b_letters: str, keep: set) -> tuple:
    batch = [c for c in a_letters if c in b_letters and c in keep]
    summed = [c for c in a_letters if c in b_letters and c not in keep]
    left = [c for c in a_letters if c not in b_letters]
    right = [c for c in b_letters if c not in a_letters]
    size_a = dict(zip(a_letters, a.type.shape))
    size_b = dict(zip(b_letters, b.type.shape))
    if not all(dims_equal(size_a[c], size_b[c]) for c in summed):
        L.unsupported("einsum over a summed subscript whose sizes differ between operands (broadcast)")
    a = _permuted(L, a, [a_letters.index(c) for c in batch + left + summed])
    b = _permuted(L, b, [b_letters.index(c) for c in batch + summed + right])
    a = _reshaped(L, a, [size_a[c] for c in batch] + [_product(size_a, left), _product(size_a, summed)])
    b = _reshaped(L, b, [size_b[c] for c in batch] + [_product(size_b, summed), _product(size_b, right)])
    batch_sizes = [size_b[c] if size_a[c] == 1 else size_a[c] for c in batch]     # broadcast
    product = _reshaped(L, matmul(L, a, b), batch_sizes + [size_a[c] for c in left] + [size_b[c] for c in right])
    return product, "".join(batch + left + right)


def _product(sizes: dict, letters) -> int:
    total = 1
    for c in letters:
        total = total * sizes[c]
    return norm_dim(total)


def _permuted(L: Lowering, x, perm: list[int]):
    return x if perm == sorted(perm) else L.op("cuvil.permute", x, perm=perm)


def _reshaped(L: Lowering, x, shape: list):
    return x if list(x.type.shape) == shape else L.op("cuvil.reshape", x, shape=shape)


def addmm(L: Lowering, bias, a, b, beta=1, alpha=1):
    """bias*beta + (a @ b)*alpha; the plain case (1-d bias, beta = alpha = 1) is a linear."""
    if beta == 1 and alpha == 1 and bias.type.rank == 1:
        return gemm_op(L, "cuvil.linear", a, transpose(L, b, 0, 1), bias)
    return _plus_product(L, bias, gemm_op(L, "cuvil.matmul", a, b), beta, alpha)


def baddbmm(L: Lowering, bias, a, b, beta=1, alpha=1):
    """bias*beta + (a @ b)*alpha over a batch (BLOOM adds its ALiBi biases to the scores so)."""
    return _plus_product(L, bias, gemm_op(L, "cuvil.matmul", a, b), beta, alpha)


def _plus_product(L: Lowering, bias, product, beta, alpha):
    """As torch computes addmm and baddbmm: with beta = 0 the bias is not read at all (its NaN and
    inf do not reach the result)."""
    scaled = _times(L, product, alpha)
    return scaled if beta == 0 else binary("cuvil.add")(L, _times(L, bias, beta), scaled)


def _times(L: Lowering, x, factor):
    return x if factor == 1 else binary("cuvil.mul")(L, x, factor)


def conv2d(L: Lowering, x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    if x.type.rank == 3:    # an unbatched image: a batch of one
        out = conv2d(L, L.op("cuvil.unsqueeze", x, dim=0), weight, bias, stride, padding, dilation, groups)
        return L.op("cuvil.squeeze", out, dims=[0])
    return gemm_op(L, "cuvil.conv2d", x, weight, *_trailing(bias), stride=pair(stride), padding=pair(padding),
                dilation=pair(dilation), groups=groups)


def conv1d(L: Lowering, x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """A 1-d convolution as a 2-d one over images one row high: [N, C, L] -> [N, C, 1, L]."""
    row = x.type.rank - 1            # the new height axis: before the length, batched or not
    out = conv2d(L, L.op("cuvil.unsqueeze", x, dim=row), L.op("cuvil.unsqueeze", weight, dim=2), bias,
                 [1, _single(stride)], [0, _single(padding)], [1, _single(dilation)], groups)
    return L.op("cuvil.squeeze", out, dims=[row])


def _single(v) -> int:
    """A 1-d window parameter, given as v or [v]."""
    return v[0] if isinstance(v, (list, tuple)) else v


def convolution(L: Lowering, x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    if transposed:
        return conv_transpose(L, x, weight, bias, stride, padding, output_padding, groups, dilation)
    return {3: conv1d, 4: conv2d, 5: conv3d}[weight.type.rank](L, x, weight, bias, stride, padding, dilation, groups)


def padded_by_name(conv, dims: int):
    """The `.padding` overload of conv1d/2d/3d, whose padding is "valid" (none) or "same" (the
    output as large as the input, stride 1): dilation * (k - 1) in all along each axis, half of it
    before (rounded down) and the rest after, as torch pads (an odd total's extra element goes
    last). Imported directly: without this row the whole model went through `run_decompositions`
    (EfficientNet's 273 such convolutions: 5.3 s of a 7.2 s import)."""
    def row(L: Lowering, x, weight, bias=None, stride=1, padding="valid", dilation=1, groups=1):
        if padding == "valid":
            return conv(L, x, weight, bias, stride, 0, dilation, groups)
        kernel = weight.type.shape[-dims:]
        if padding != "same" or not all(isinstance(k, int) for k in kernel):
            L.unsupported(f"conv{dims}d with padding='{padding}' and kernel {list(kernel)}")
        dilation = [dilation] * dims if isinstance(dilation, int) else list(dilation) * (dims // len(dilation))
        totals = [d * (k - 1) for d, k in zip(dilation, kernel)]
        if any(t % 2 for t in totals):      # the extra element after, last axis first (F.pad's order)
            x = pad(L, x, [a for t in reversed(totals) for a in (0, t % 2)])
        return conv(L, x, weight, bias, stride, [t // 2 for t in totals], dilation, groups)
    return row


# ----------------------------------------------------------------------------- 3-d windows as 2-d ones
# A 3-d convolution or pooling is its 2-d counterpart over every output depth's input slices: for
# each tap i of the window's depth, the input slice each output depth reads at that tap (stride
# and dilation apart, after padding the depth) is one image of a batch of N * D' images; the
# taps' 2-d results are combined (summed, or their maximum) and the batch folded back to depth.

def _triple(v) -> list[int]:
    v = [v] if isinstance(v, int) else list(v)
    return v * 3 if len(v) == 1 else v


def _unbatched_3d(fn):
    """A row of a 3-d window op that also takes an unbatched [C, D, H, W] input."""
    def row(L: Lowering, x, *args):
        if x.type.rank == 4:
            out = fn(L, L.op("cuvil.unsqueeze", x, dim=0), *args)
            return L.op("cuvil.squeeze", out, dims=[0])
        return fn(L, x, *args)
    return row


def _depth_taps(L: Lowering, x, kernel: int, stride: int, padding: int, dilation: int, fill: float,
                ceil_mode: bool = False, overhang: float | None = None):
    """[N * D', C, H, W] per depth tap of the window, and D'. The depth is padded by `padding` of
    `fill`, and, where ceil_mode lets the last window hang past that, by `overhang` (`fill` unless
    given) up to its end."""
    depth = window_out(x.type.shape[2], kernel, stride, padding, dilation, ceil_mode)
    span = norm_dim((sympy.sympify(depth) - 1) * stride + dilation * (kernel - 1) + 1)
    past = sympy.sympify(span) - x.type.shape[2] - 2 * padding
    if padding:
        x = L.op("cuvil.pad", x, low=[0, 0, padding, 0, 0], high=[0, 0, padding, 0, 0], mode="constant", value=fill)
    if past.is_Integer and past > 0:
        x = L.op("cuvil.pad", x, low=[0] * 5, high=[0, 0, int(past), 0, 0], mode="constant",
                 value=fill if overhang is None else overhang)
    n, c, _, h, w = x.type.shape
    taps = []
    for i in range(kernel):
        first = i * dilation
        y = L.op("cuvil.slice", x, dim=2, start=[first], end=[norm_dim(first + (sympy.sympify(depth) - 1) * stride + 1)],
                 step=stride)
        y = L.op("cuvil.permute", y, perm=[0, 2, 1, 3, 4])
        taps.append(L.op("cuvil.reshape", y, shape=[norm_dim(sympy.sympify(n) * depth), c, h, w]))
    return taps, depth


def _as_volume(L: Lowering, images, n, depth):
    """[N * D', C, H, W] -> [N, C, D', H, W]."""
    _, c, h, w = images.type.shape
    return L.op("cuvil.permute", L.op("cuvil.reshape", images, shape=[n, depth, c, h, w]), perm=[0, 2, 1, 3, 4])


def _fold(L: Lowering, name: str, values):
    return functools.reduce(lambda a, b: L.op(name, a, b), values)


@_unbatched_3d
def conv3d(L: Lowering, x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    stride, padding, dilation = _triple(stride), _triple(padding), _triple(dilation)
    out_c, in_g, kd, kh, kw = weight.type.shape
    taps, depth = _depth_taps(L, x, kd, stride[0], padding[0], dilation[0], 0.0)
    sums = []
    for i, images in enumerate(taps):
        w = L.op("cuvil.slice", weight, dim=2, start=[i], end=[i + 1], step=1)
        w = L.op("cuvil.reshape", w, shape=[out_c, in_g, kh, kw])
        sums.append(conv2d(L, images, w, None, stride[1:], padding[1:], dilation[1:], groups))
    y = _as_volume(L, _fold(L, "cuvil.add", sums), x.type.shape[0], depth)
    if bias is not None:
        y = L.op("cuvil.add", y, L.op("cuvil.reshape", bias, shape=[out_c, 1, 1, 1]))
    return y


@_unbatched_3d
def max_pool3d(L: Lowering, x, kernel, stride=(), padding=0, dilation=1, ceil_mode=False):
    kernel = _triple(kernel)
    stride, padding, dilation = _triple(stride or kernel), _triple(padding), _triple(dilation)
    taps, depth = _depth_taps(L, x, kernel[0], stride[0], padding[0], dilation[0], -math.inf, ceil_mode)
    pooled = [max_pool2d(L, t, kernel[1:], stride[1:], padding[1:], dilation[1:], ceil_mode) for t in taps]
    return _as_volume(L, _fold(L, "cuvil.maximum", pooled), x.type.shape[0], depth)


def max_pool3d_with_indices(L: Lowering, *args):
    return max_pool3d(L, *args), Unavailable("the indices output of max_pool3d_with_indices")


@_unbatched_3d
def avg_pool3d(L: Lowering, x, kernel, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor=None):
    """The taps' 2-d averages summed and divided by the depth's count, which is torch's: the taps
    inside the padded input (count_include_pad) or inside the input, never past its padding;
    counted by summing the same taps of ones. With a divisor override: the window sums over it."""
    kernel = _triple(kernel)
    stride, padding = _triple(stride or kernel), _triple(padding)
    taps, depth = _depth_taps(L, x, kernel[0], stride[0], padding[0], 1, 0.0, ceil_mode)
    sums = [avg_pool2d(L, t, kernel[1:], stride[1:], padding[1:], ceil_mode, count_include_pad,
                       1 if divisor else None) for t in taps]
    total = _as_volume(L, _fold(L, "cuvil.add", sums), x.type.shape[0], depth)
    if divisor:
        return binary("cuvil.div")(L, total, float(divisor))
    ones = L.op("cuvil.full", shape=[1, 1, x.type.shape[2], 1, 1], value=1.0, dtype=DType.f32)
    counted, _ = _depth_taps(L, ones, kernel[0], stride[0], padding[0], 1, float(bool(count_include_pad)), ceil_mode,
                             overhang=0.0)
    return L.op("cuvil.div", total, _as_volume(L, _fold(L, "cuvil.add", counted), 1, depth))


@_unbatched_3d
def adaptive_avg_pool3d(L: Lowering, x, output_size):
    """2-d adaptive pooling of every depth slice, then each output depth the mean of its window of
    slices (torch's windows: floor(j * D / d') to ceil((j + 1) * D / d'))."""
    od, oh, ow = _triple(output_size)
    n, c, d, h, w = x.type.shape
    if (od, oh, ow) == (1, 1, 1):
        return L.op("cuvil.mean", x, dims=[2, 3, 4], keepdim=True)
    if not isinstance(d, int):
        L.unsupported(f"adaptive_avg_pool3d over a symbolic depth ({d}) to {od} other than 1")
    slices = L.op("cuvil.reshape", L.op("cuvil.permute", x, perm=[0, 2, 1, 3, 4]), shape=[norm_dim(n * d), c, h, w])
    y = _as_volume(L, adaptive_avg_pool2d(L, slices, [oh, ow]), n, d)
    windows = [L.op("cuvil.mean", L.op("cuvil.slice", y, dim=2, start=[j * d // od], end=[-(-(j + 1) * d // od)],
                                       step=1), dims=[2], keepdim=True) for j in range(od)]
    return windows[0] if od == 1 else L.op("cuvil.cat", *windows, dim=2)


def conv_transpose(L: Lowering, x, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """A transposed convolution (1-d, 2-d or 3-d) as a stride-1 convolution followed by a pixel shuffle.

    Output row o = q * s + r of phase r sums x[q + t] * w[ky] over the taps with ky * d = r (mod s),
    t = (r - ky * d) / s. So each of the s phases (per axis) is an ordinary convolution of x, padded
    by P = d * (k - 1) // s before, with a kernel of P + 1 taps picked from w (zero where no tap
    falls); the phases become extra output channels of one convolution (3-d: `conv3d`), which a
    reshape and permute interleave into rows and columns (and depths), and a slice crops to the
    output. No multiplication by inserted zeros, as a convolution over the stride-dilated input
    would do."""
    if x.type.rank == weight.type.rank - 1:     # unbatched
        out = conv_transpose(L, L.op("cuvil.unsqueeze", x, dim=0), weight, bias, stride, padding, output_padding,
                             groups, dilation)
        return L.op("cuvil.squeeze", out, dims=[0])
    if weight.type.rank == 3:                   # 1-d: images one row high
        out = conv_transpose(L, L.op("cuvil.unsqueeze", x, dim=2), L.op("cuvil.unsqueeze", weight, dim=2), bias,
                             [1, _single(stride)], [0, _single(padding)], [0, _single(output_padding)], groups,
                             [1, _single(dilation)])
        return L.op("cuvil.squeeze", out, dims=[2])
    nd = weight.type.rank - 2
    spatial = pair if nd == 2 else _triple
    stride, padding, output_padding, dilation = map(spatial, (stride, padding, output_padding, dilation))
    cin, cout_g, *k = weight.type.shape
    if not all(isinstance(v, int) for v in (cin, cout_g, *k)):
        L.unsupported(f"a transposed convolution weight of symbolic shape {weight.type}")
    taps = [(d * (kk - 1)) // s + 1 for kk, s, d in zip(k, stride, dilation)]
    axes = range(nd)
    # the weight: a zero tap appended on each axis, the phases' taps picked, the phases made channels
    w = L.op("cuvil.pad", weight, low=[0] * (2 + nd), high=[0, 0] + [1] * nd, mode="constant", value=0.0)
    for axis, (kk, s, d, n) in enumerate(zip(k, stride, dilation, taps)):
        picks = [kk] * (s * n)                  # phase r, tap j -> kernel index (kk: the zero tap)
        for ky in range(kk):
            picks[(ky * d) % s * n + (n - 1) - (ky * d) // s] = ky
        w = L.op("cuvil.index_select", w, L.constant("conv_transpose.taps", torch.tensor(picks)), dim=2 + axis)
    phases = math.prod(stride)
    # [groups, cin/g, cout/g, s0, n0, s1, n1, ...] -> [groups, s0, s1, ..., cout/g, cin/g, n0, n1, ...]
    w = L.op("cuvil.reshape", w, shape=[groups, cin // groups, cout_g, *(v for sn in zip(stride, taps) for v in sn)])
    w = L.op("cuvil.permute", w, perm=[0, *(3 + 2 * a for a in axes), 2, 1, *(4 + 2 * a for a in axes)])
    w = L.op("cuvil.reshape", w, shape=[groups * phases * cout_g, cin // groups, *taps])
    # rows past the input: enough phases' rows to reach the last output row (output_padding included)
    after = [max(0, -(-(d * (kk - 1) + op + 1 - p) // s) - 1)
             for kk, s, d, p, op in zip(k, stride, dilation, padding, output_padding)]
    xp = L.op("cuvil.pad", x, low=[0, 0, *(n - 1 for n in taps)], high=[0, 0, *after], mode="constant", value=0.0)
    if nd == 2:
        y = gemm_op(L, "cuvil.conv2d", xp, w, stride=[1, 1], padding=[0, 0], dilation=[1, 1], groups=groups)
    else:
        y = conv3d(L, xp, w, None, 1, 0, 1, groups)
    n_, _, *q = y.type.shape
    # [N, groups, s0, s1, ..., cout/g, q0, q1, ...] -> [N, groups, cout/g, q0, s0, q1, s1, ...]
    y = L.op("cuvil.reshape", y, shape=[n_, groups, *stride, cout_g, *q])
    y = L.op("cuvil.permute", y, perm=[0, 1, 2 + nd, *(v for a in axes for v in (3 + nd + a, 2 + a))])
    y = L.op("cuvil.reshape", y, shape=[n_, groups * cout_g, *(norm_dim(sympy.sympify(qq) * s) for qq, s in zip(q, stride))])
    for axis, (kk, s, d, p, op) in enumerate(zip(k, stride, dilation, padding, output_padding)):
        size = norm_dim((sympy.sympify(x.type.shape[2 + axis]) - 1) * s - 2 * p + d * (kk - 1) + op + 1)
        y = L.op("cuvil.slice", y, dim=2 + axis, start=[p], end=[norm_dim(p + sympy.sympify(size))], step=1)
    if bias is not None:        # after the shuffle: one bias per channel, not one per phase and channel
        y = L.op("cuvil.add", y, L.op("cuvil.reshape", bias, shape=[groups * cout_g] + [1] * nd))
    return y


# ----------------------------------------------------------------------------- pixel shuffles

def pixel_shuffle(L: Lowering, x, r):
    """[..., C*r*r, H, W] -> [..., C, H*r, W*r] as a reshape, permute and reshape."""
    *lead, c, h, w = x.type.shape
    n = len(lead)
    y = L.op("cuvil.reshape", x, shape=[*lead, norm_dim(sympy.sympify(c) / (r * r)), r, r, h, w])
    y = L.op("cuvil.permute", y, perm=[*range(n), n, n + 3, n + 1, n + 4, n + 2])
    return L.op("cuvil.reshape", y, shape=[*lead, norm_dim(sympy.sympify(c) / (r * r)),
                                         norm_dim(sympy.sympify(h) * r), norm_dim(sympy.sympify(w) * r)])


def pixel_unshuffle(L: Lowering, x, r):
    """[..., C, H*r, W*r] -> [..., C*r*r, H, W]."""
    *lead, c, h, w = x.type.shape
    n = len(lead)
    hh, ww = norm_dim(sympy.sympify(h) / r), norm_dim(sympy.sympify(w) / r)
    y = L.op("cuvil.reshape", x, shape=[*lead, c, hh, r, ww, r])
    y = L.op("cuvil.permute", y, perm=[*range(n), n, n + 2, n + 4, n + 1, n + 3])
    return L.op("cuvil.reshape", y, shape=[*lead, norm_dim(sympy.sympify(c) * r * r), hh, ww])


def max_pool2d(L: Lowering, x, kernel, stride=(), padding=0, dilation=1, ceil_mode=False):
    return L.op("cuvil.max_pool2d", x, kernel=pair(kernel), stride=pair(stride or kernel), padding=pair(padding),
                dilation=pair(dilation), ceil_mode=ceil_mode)


def max_pool1d(L: Lowering, x, kernel, stride=(), padding=0, dilation=1, ceil_mode=False):
    """As a 2-d pool over rows one high: [N, C, L] -> [N, C, 1, L] (see conv1d)."""
    row = x.type.rank - 1
    out = max_pool2d(L, L.op("cuvil.unsqueeze", x, dim=row), [1, _single(kernel)], [1, _single(stride or kernel)],
                     [0, _single(padding)], [1, _single(dilation)], ceil_mode)
    return L.op("cuvil.squeeze", out, dims=[row])


def max_pool2d_with_indices(L: Lowering, *args):
    return max_pool2d(L, *args), Unavailable("the indices output of max_pool2d_with_indices")


def avg_pool2d(L: Lowering, x, kernel, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor=None):
    return L.op("cuvil.avg_pool2d", x, kernel=pair(kernel), stride=pair(stride or kernel), padding=pair(padding),
                ceil_mode=ceil_mode, count_include_pad=count_include_pad, divisor=divisor)


def adaptive_avg_pool2d(L: Lowering, x, output_size):
    return L.op("cuvil.adaptive_avg_pool2d", x, output_size=pair(output_size))


def adaptive_avg_pool1d(L: Lowering, x, output_size):
    """As a 2-d pool over rows one high: [N, C, L] -> [N, C, 1, L] (see conv1d)."""
    row = x.type.rank - 1
    out = adaptive_avg_pool2d(L, L.op("cuvil.unsqueeze", x, dim=row), [1, _single(output_size)])
    return L.op("cuvil.squeeze", out, dims=[row])


def adaptive_max_pool2d(L: Lowering, x, output_size):
    return (L.op("cuvil.adaptive_max_pool2d", x, output_size=pair(output_size)),
            Unavailable("the indices output of adaptive_max_pool2d"))


def embedding(L: Lowering, weight, indices, *_):
    return L.op("cuvil.embedding", weight, indices)


def sdpa(L: Lowering, q, k, v, mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if dropout_p:
        L.unsupported(f"dropout_p={dropout_p} (inference needs 0)")
    if enable_gqa:      # each of k's and v's heads serves a group of q's heads (repeat_interleave)
        k, v = (_repeat_heads(L, t, q.type.shape[-3]) for t in (k, v))
    if mask is not None and mask.type.dtype is not DType.bool:
        mask = L.cast(mask, q.type.dtype)
    # batch dims broadcast (multi-query attention: one head of k and v for all of q's): cuvil.sdpa
    # takes equal ones, so the smaller operands are expanded (a copy: sdpa reads them from memory)
    batch = L.out_shape()[:-2]
    q, k, v = (t if t.type.shape[:-2] == batch else L.op("cuvil.expand", t, shape=[*batch, *t.type.shape[-2:]])
               for t in (q, k, v))
    return gemm_op(L, "cuvil.sdpa", q, k, v, *_trailing(mask), is_causal=is_causal,
                scale=None if scale is None else float(scale))


def _repeat_heads(L: Lowering, t, heads):
    """[..., Hkv, S, E] -> [..., heads, S, E], each head repeated heads / Hkv times in a row."""
    *lead, hkv, s, e = t.type.shape
    if dims_equal(hkv, heads):
        return t
    group = norm_dim(sympy.sympify(heads) / hkv)
    wide = L.op("cuvil.expand", L.op("cuvil.unsqueeze", t, dim=len(lead) + 1), shape=[*lead, hkv, group, s, e])
    return L.op("cuvil.reshape", wide, shape=[*lead, heads, s, e])


def index(L: Lowering, x, indices):
    """x[i0, i1, ...]: index tensors, None for a dim taken whole (`x[:, idx]`). `cuvil.index` takes
    index tensors on leading dims, so the indexed dims are permuted to the front (a view), and the
    result's index dims are put back where torch puts them: in place of the indexed dims when
    those are adjacent, first otherwise."""
    if any(i is not None and i.type.dtype is DType.bool for i in indices):
        L.unsupported(f"boolean-mask indexing: {DATA_SIZED}")
    picked = [k for k, i in enumerate(indices) if i is not None]
    if picked == list(range(len(picked))):
        return L.op("cuvil.index", x, *(indices[k] for k in picked))
    rest = [d for d in range(x.type.rank) if d not in picked]
    y = L.op("cuvil.index", L.op("cuvil.permute", x, perm=picked + rest), *(indices[k] for k in picked))
    if picked != list(range(picked[0], picked[-1] + 1)):
        return y
    n = y.type.rank - len(rest)         # the broadcast index tensors' rank
    first = picked[0]                   # dims before the indexed ones
    perm = [n + j for j in range(first)] + list(range(n)) + [n + j for j in range(first, len(rest))]
    return L.op("cuvil.permute", y, perm=perm)


def index_put(L: Lowering, x, indices, values, accumulate=False):
    """`x[idx] = values` (and `+=` with accumulate) by one 1-d index tensor: `cuvil.index_put`,
    values cast to x's dtype and broadcast to one row per index. Along another dim (`x[:, idx] =
    v`) the indexed dim is permuted to the front and back (copies)."""
    picked = [d for d, i in enumerate(indices) if i is not None]
    if values.type.dtype is not x.type.dtype:
        L.unsupported(f"values of {values.type.dtype} put into a tensor of {x.type.dtype}: eager raises "
                      f"'Index put requires the source and destination dtypes match'")
    if accumulate and x.type.dtype is DType.bool:
        L.unsupported("accumulating into a bool tensor")
    if len(picked) > 1:
        if any(indices[d].type.dtype is DType.bool for d in picked):
            L.unsupported("index_put through a boolean mask and other indices")
        return _index_put_several(L, x, picked, [indices[d] for d in picked], values, accumulate)
    (d,), index = picked, indices[picked[0]]
    if index.type.dtype is DType.bool:
        return _masked_put(L, x, d, index, values, accumulate)
    if index.type.rank != 1:
        L.unsupported(f"an index of rank {index.type.rank} (Cuvil's index_put takes a 1-d index)")
    shape = list(x.type.shape)
    shape[d] = index.type.shape[0]          # the indexed slices, in x's order of dims
    values = L.cast(values, x.type.dtype)
    if values.type.rank > len(shape):       # leading dims of size 1 (torch broadcasts them away)
        values = L.op("cuvil.reshape", values, shape=list(values.type.shape[values.type.rank - len(shape):]))
    if list(values.type.shape) != shape:
        values = L.op("cuvil.expand", values, shape=shape)
    if d == 0:
        return L.op("cuvil.index_put", x, index, values, accumulate=bool(accumulate))
    # checked here, where the dim is still the user's (index_put's own check would name dim 0)
    index = L.op("cuvil.check_index", index, size=[x.type.shape[d]], dim=d, of="index_put",
                 negative=True)
    front = [d] + [a for a in range(x.type.rank) if a != d]
    back = [front.index(a) for a in range(x.type.rank)]
    y = L.op("cuvil.index_put", L.op("cuvil.permute", x, perm=front), index, L.op("cuvil.permute", values, perm=front),
             accumulate=bool(accumulate))
    return L.op("cuvil.permute", y, perm=back)


def _index_put_several(L: Lowering, x, picked: list[int], indices: list, values, accumulate):
    """`x[i, j] = values` (`+=` with accumulate) through several index tensors: the indexed dims,
    permuted to the front, read as one dim, and the index tensors (broadcast together) combined
    into one index along it. Each is checked against its own dim first, where it still counts
    from the end if negative: past its dim it would name another element of the row."""
    shape = list(x.type.shape)
    rest = [d for d in range(x.type.rank) if d not in picked]
    common = broadcast_shapes(*(i.type for i in indices))
    count = functools.reduce(operator.mul, common, 1)
    linear = None
    for d, i in zip(picked, indices):
        i = L.cast(i, DType.i64)
        if list(i.type.shape) != list(common):
            i = L.op("cuvil.expand", i, shape=list(common))
        i = L.op("cuvil.reshape", i, shape=[count])
        i = L.op("cuvil.check_index", i, size=[shape[d]], dim=d, of="index_put", negative=True)
        linear = i if linear is None else L.op("cuvil.add", L.op("cuvil.mul", linear, L.literal(shape[d], DType.i64)), i)
    # values broadcast to x[indices]'s shape: the index dims in place of adjacent indexed dims, else first
    adjacent = picked == list(range(picked[0], picked[-1] + 1))
    lead = picked[0] if adjacent else 0
    target = shape[:lead] + list(common) + [shape[d] for d in rest[lead:]]
    values = L.cast(values, x.type.dtype)
    if values.type.rank > len(target):       # leading dims of size 1 (torch broadcasts them away)
        values = L.op("cuvil.reshape", values, shape=list(values.type.shape[values.type.rank - len(target):]))
    if list(values.type.shape) != target:
        values = L.op("cuvil.expand", values, shape=target)
    if lead:
        n = len(common)
        values = L.op("cuvil.permute", values, perm=list(range(lead, lead + n)) + list(range(lead))
                      + list(range(lead + n, len(target))))
    rows = [shape[d] for d in rest]
    values = L.op("cuvil.reshape", values, shape=[count] + rows)
    front = L.op("cuvil.permute", x, perm=picked + rest) if picked + rest != list(range(x.type.rank)) else x
    flat = L.op("cuvil.reshape", front, shape=[functools.reduce(operator.mul, (shape[d] for d in picked), 1)] + rows)
    y = L.op("cuvil.index_put", flat, linear, values, accumulate=bool(accumulate))
    y = L.op("cuvil.reshape", y, shape=[shape[d] for d in picked] + rows)
    if picked + rest == list(range(x.type.rank)):
        return y
    order = picked + rest
    return L.op("cuvil.permute", y, perm=[order.index(a) for a in range(x.type.rank)])


def _masked_put(L: Lowering, x, d, mask, values, accumulate):
    """`x[mask] = values` (`x[:, mask] = ...`, `+=` with accumulate) where the values do not run
    along the selected elements (a number, or one row for each: `input_ids[image_mask] = 0`): every
    selected element gets the same values, so it is where(mask, values, x), and no size depends on
    the mask's values. The mask covers x's dims from d on (torch checks its sizes)."""
    values = L.cast(values, x.type.dtype)
    shape = list(values.type.shape)
    while shape and shape[0] == 1:        # torch broadcasts leading 1s away
        shape.pop(0)
    rest = x.type.rank - d - mask.type.rank         # the dims after the mask's, taken whole
    if len(shape) > rest:
        L.unsupported("a bool mask as the index with values for each selected element (how many it selects "
                      "depends on its values)")
    if len(shape) != values.type.rank:
        values = L.op("cuvil.reshape", values, shape=shape)
    if rest:
        mask = L.op("cuvil.reshape", mask, shape=list(mask.type.shape) + [1] * rest)
    if accumulate:
        if x.type.dtype is DType.bool:
            L.unsupported("accumulating into a bool tensor")
        values = L.op("cuvil.add", x, values)
    return L.op("cuvil.where", mask, values, x)


def arange(L: Lowering, start, end, step=1, *_):
    start, end, step = (int(v) if isinstance(v, bool) else v for v in (start, end, step))   # torch takes bools
    counts_up = isinstance(start, int) and isinstance(step, int) and step > 0
    if isinstance(start, sympy.Basic) or isinstance(step, sympy.Basic) or (isinstance(end, sympy.Basic) and not counts_up):
        return _arange_from_count(L, start, step)
    if isinstance(end, float):   # a static count: restate the end as start + count*step
        end = start + L.out_shape()[0] * step
        if not float(end).is_integer():
            L.unsupported("a fractional range (Cuvil states the end as an integer size)")
        end = int(end)
    return L.op("cuvil.arange", start=start, end=[end], step=step, dtype=L.out_dtype())


def _arange_from_count(L: Lowering, start, step):
    """start + i * step for i below torch's own count of the range, in i64: a symbolic start or step,
    or a symbolic end counted down to (XLNet's relative positions run from the key length down
    to minus the query length)."""
    if any(isinstance(v, float) and not v.is_integer() for v in (start, step)):
        L.unsupported(f"a fractional start or step ({start}, {step}) with a symbolic range (Cuvil computes "
                      f"such ranges in integers)")
    start, step = (v if isinstance(v, sympy.Basic) else int(v) for v in (start, step))
    values = L.op("cuvil.arange", start=0, end=[L.out_shape()[0]], step=1, dtype=DType.i64)
    if step != 1:
        values = L.op("cuvil.mul", values, L.literal(step, DType.i64))
    if start != 0:
        values = L.op("cuvil.add", values, L.literal(start, DType.i64))
    return L.cast(values, L.out_dtype())


def eye(L: Lowering, n, *_):
    return eye_m(L, n, n)


def eye_m(L: Lowering, n, m, *_):
    """torch.eye: row index == column index, in the result's dtype (torch's decomposition
    compares uint8 aranges, a dtype Cuvil lacks)."""
    rows = L.op("cuvil.unsqueeze", L.op("cuvil.arange", start=0, end=[n], step=1, dtype=DType.i64), dim=1)
    cols = L.op("cuvil.unsqueeze", L.op("cuvil.arange", start=0, end=[m], step=1, dtype=DType.i64), dim=0)
    return L.cast(L.op("cuvil.eq", rows, cols), L.out_dtype())


def assert_scalar(L: Lowering, cond, msg=None):
    """An assertion on sizes: decided at capture (size_conditions.py). One on a tensor value read
    with `.item()`: proven here from the value's bounds, or refused (Cuvil's kernels cannot raise
    the error it would raise)."""
    node = L.node.args[0]       # (`cond` is its lowered value: none, for a condition)
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if not isinstance(value, torch.SymBool):
        return None
    expr = value.node.expr
    data = {s: L.data_bounds[s] for s in expr.free_symbols if s in L.data_bounds}
    if data and not proven(expr, data, L.symbols.dim, L.symbols.span):
        bounds = ", ".join(f"{s} in [{lo}, {hi}]" for s, (lo, hi) in data.items())
        L.unsupported(f"an assertion on tensor values ({expr}) that their bounds ({bounds}) do not prove: "
                      f"Cuvil's kernels cannot raise the error it would")
    return None


def assert_async(L: Lowering, cond, msg=""):
    """A check of tensor values at run time (F.one_hot's index range): checked by the kernel of the
    model's first output (`importer._return`), which fails the call with torch's message."""
    if not isinstance(cond, Value):
        if not cond:
            L.unsupported(f"an assertion that always fails ({msg!r})")
        return None
    L.assertions.append((L.cast(cond, DType.bool), msg, L.frame))
    return None


def arange_end(L: Lowering, end, *_):
    return arange(L, 0, end)


def triangle(name: str):
    def row(L: Lowering, x, diagonal=0):
        return L.op(name, x, diagonal=diagonal)
    return row


def index_select(L: Lowering, x, dim, idx):
    if idx.type.rank == 0:      # torch takes a 0-d index as a one-element one
        idx = _vector(L, idx)
    if x.type.rank == 0:        # and a 0-d tensor as a one-element one along dim 0
        picked = L.op("cuvil.index_select", _vector(L, x), idx, dim=0)
        return L.op("cuvil.reshape", picked, shape=[])
    return L.op("cuvil.index_select", x, idx, dim=L.axis(dim, x.type.rank))


def gather(L: Lowering, x, dim, idx, *_):
    idx = L.cast(idx, DType.i64)
    if x.type.rank == 0:        # torch gathers from a 0-d tensor as from a one-element vector
        picked = L.op("cuvil.gather", _vector(L, x), L.op("cuvil.reshape", idx, shape=[1]), dim=0)
        return L.op("cuvil.reshape", picked, shape=list(idx.type.shape))
    return L.op("cuvil.gather", x, idx, dim=L.axis(dim, x.type.rank))


def _vector(L: Lowering, x):
    """A 0-d value as a one-element 1-d one."""
    return L.op("cuvil.reshape", x, shape=[1])


def getitem(L: Lowering, seq, i):
    return seq[i]


# ----------------------------------------------------------------------------- the table

ATEN_TABLE = {
    # elementwise, unary
    aten.relu.default: unary("cuvil.relu"),
    aten.neg.default: unary("cuvil.neg"),
    aten.abs.default: unary("cuvil.abs"),
    aten.exp.default: unary("cuvil.exp"),
    aten.log.default: unary("cuvil.log"),
    aten.log1p.default: unary("cuvil.log1p"),
    aten.trunc.default: unary("cuvil.trunc"),
    aten.frac.default: lambda L, x: L.op("cuvil.sub", x, L.op("cuvil.trunc", x)),
    aten.expm1.default: unary("cuvil.expm1"),
    aten.elu.default: elu,
    aten.selu.default: lambda L, x: elu(L, x, 1.6732632423543772848170429916717, 1.0507009873554804934193349852946),
    aten.celu.default: lambda L, x, alpha=1.0: elu(L, x, alpha, 1.0, 1.0 / float(alpha)),
    aten.softplus.default: softplus,
    aten.mish.default: lambda L, x: L.op("cuvil.mul", x, L.op("cuvil.tanh", softplus(L, x))),
    aten.log_sigmoid.default: log_sigmoid,
    aten.sqrt.default: unary("cuvil.sqrt"),
    aten.rsqrt.default: unary("cuvil.rsqrt"),
    aten.sin.default: unary("cuvil.sin"),
    aten.cos.default: unary("cuvil.cos"),
    aten.tan.default: unary("cuvil.tan"),
    aten.atan.default: unary("cuvil.atan"),
    aten.asin.default: unary("cuvil.asin"),
    aten.acos.default: unary("cuvil.acos"),
    aten.sinh.default: unary("cuvil.sinh"),
    aten.cosh.default: unary("cuvil.cosh"),
    aten.asinh.default: unary("cuvil.asinh"),
    aten.acosh.default: unary("cuvil.acosh"),
    aten.atanh.default: unary("cuvil.atanh"),
    aten.tanh.default: unary("cuvil.tanh"),
    aten.sigmoid.default: unary("cuvil.sigmoid"),
    aten.silu.default: unary("cuvil.silu"),
    aten.erf.default: unary("cuvil.erf"),
    aten.reciprocal.default: unary("cuvil.reciprocal"),
    aten.logical_not.default: unary("cuvil.logical_not"),
    aten.bitwise_not.default: logical_not,
    aten.floor.default: unary("cuvil.floor"),
    aten.ceil.default: unary("cuvil.ceil"),
    aten.round.default: unary("cuvil.round"),
    aten.sign.default: unary("cuvil.sign"),
    aten.gelu.default: gelu,
    aten.hardsigmoid.default: hardsigmoid,
    aten.hardswish.default: hardswish,
    aten.glu.default: glu,
    aten.clamp.default: clamp,
    aten.clamp.Tensor: clamp_tensor,
    aten.isnan.default: lambda L, x: binary("cuvil.ne")(L, x, x),
    aten.isinf.default: lambda L, x: binary("cuvil.eq")(L, L.op("cuvil.abs", x), math.inf),
    aten.isfinite.default: lambda L, x: binary("cuvil.lt")(L, L.op("cuvil.abs", x), math.inf),   # NaN: False
    aten.isposinf.default: lambda L, x: binary("cuvil.eq")(L, x, math.inf),
    aten.isneginf.default: lambda L, x: binary("cuvil.eq")(L, x, -math.inf),
    aten.clamp_min.default: lambda L, x, lo: clamp(L, x, lo, None),
    aten.clamp_max.default: lambda L, x, hi: clamp(L, x, None, hi),
    aten.hardtanh.default: clamp,
    aten.leaky_relu.default: leaky_relu,
    aten._to_copy.default: to_copy,
    aten.to.dtype: to_copy,
    aten.to.device: to_copy,
    aten.to.dtype_layout: to_copy,
    aten.type_as.default: to_copy,
    aten.dropout.default: identity,     # inference only: `export.needs_decomposition`
    # elementwise, binary
    aten.add.Tensor: scaled("cuvil.add"),
    aten.add.Scalar: scaled("cuvil.add"),
    aten.sub.Tensor: scaled("cuvil.sub"),
    aten.sub.Scalar: scaled("cuvil.sub"),
    aten.rsub.Scalar: rsub,
    aten.mul.Tensor: binary("cuvil.mul"),
    aten.multiply.Tensor: binary("cuvil.mul"),
    aten.mul.Scalar: binary("cuvil.mul"),
    aten.div.Tensor: binary("cuvil.div", int_to_float=True),
    aten.atan2.default: binary("cuvil.atan2", int_to_float=True),
    aten.div.Scalar: binary("cuvil.div", int_to_float=True),
    aten.div.Tensor_mode: div_mode,
    aten.floor_divide.default: binary("cuvil.floor_div"),
    aten.remainder.Tensor: binary("cuvil.remainder"),
    aten.remainder.Scalar: binary("cuvil.remainder"),
    aten.fmod.Tensor: binary("cuvil.fmod"),
    aten.fmod.Scalar: binary("cuvil.fmod"),
    aten.pow.Tensor_Scalar: pow_,
    aten.pow.Tensor_Tensor: pow_,
    aten.pow.Scalar: pow_,
    aten.maximum.default: binary("cuvil.maximum"),
    aten.minimum.default: binary("cuvil.minimum"),
    aten.max.other: binary("cuvil.maximum"),
    aten.min.other: binary("cuvil.minimum"),
    aten.eq.Tensor: binary("cuvil.eq"),
    aten.eq.Scalar: binary("cuvil.eq"),
    aten.ne.Tensor: binary("cuvil.ne"),
    aten.ne.Scalar: binary("cuvil.ne"),
    aten.lt.Tensor: binary("cuvil.lt"),
    aten.lt.Scalar: binary("cuvil.lt"),
    aten.le.Tensor: binary("cuvil.le"),
    aten.le.Scalar: binary("cuvil.le"),
    aten.gt.Tensor: binary("cuvil.gt"),
    aten.gt.Scalar: binary("cuvil.gt"),
    aten.ge.Tensor: binary("cuvil.ge"),
    aten.ge.Scalar: binary("cuvil.ge"),
    aten.logical_and.default: binary("cuvil.logical_and"),
    aten.logical_or.default: binary("cuvil.logical_or"),
    aten.bitwise_and.Tensor: logical_or_bitwise("cuvil.logical_and", "cuvil.bitwise_and"),
    aten.__and__.Tensor: logical_or_bitwise("cuvil.logical_and", "cuvil.bitwise_and"),
    aten.bitwise_or.Tensor: logical_or_bitwise("cuvil.logical_or", "cuvil.bitwise_or"),
    aten.__or__.Tensor: logical_or_bitwise("cuvil.logical_or", "cuvil.bitwise_or"),
    aten.bitwise_xor.Tensor: logical_or_bitwise("cuvil.ne", "cuvil.bitwise_xor"),
    aten.bitwise_and.Scalar: logical_or_bitwise("cuvil.logical_and", "cuvil.bitwise_and"),
    aten.bitwise_or.Scalar: logical_or_bitwise("cuvil.logical_or", "cuvil.bitwise_or"),
    aten.bitwise_xor.Scalar: logical_or_bitwise("cuvil.ne", "cuvil.bitwise_xor"),
    aten.where.self: where,
    aten.where.ScalarSelf: where,
    aten.where.ScalarOther: where,
    aten.where.Scalar: where,
    aten.masked_fill.Scalar: masked_fill,
    aten.masked_fill.Tensor: masked_fill,
    # reductions and normalisations
    aten.sum.default: reduction_all("cuvil.sum"),
    aten.sum.dim_IntList: reduction("cuvil.sum"),
    aten.mean.default: reduction_all("cuvil.mean"),
    aten.mean.dim: reduction("cuvil.mean"),
    aten.amax.default: reduction("cuvil.amax"),
    aten.max.default: reduction_all("cuvil.amax"),
    aten.min.default: reduction_all("cuvil.amin"),
    aten.amin.default: reduction("cuvil.amin"),
    aten.prod.default: reduction_all("cuvil.prod"),
    aten.prod.dim_int: reduction("cuvil.prod"),
    aten.var.correction: var,
    aten.max.dim: max_dim,
    aten.topk.default: topk,
    aten.kthvalue.default: kthvalue,
    aten.median.dim: median_dim,
    aten.median.default: lambda L, x: median_dim(L, _flat(L, x))[0],
    aten.sort.default: sort,
    aten.sort.stable: sort_stable,
    aten.argsort.default: lambda L, x, dim=-1, descending=False: sort(L, x, dim, descending)[1],
    aten.argsort.stable: lambda L, x, stable=False, dim=-1, descending=False: sort(L, x, dim, descending)[1],
    aten.min.dim: min_dim,
    aten.any.default: any_,
    aten.any.dim: any_,
    aten.any.dims: any_,
    aten.all.default: all_,
    aten.all.dim: all_,
    aten.all.dims: all_,
    aten.linalg_vector_norm.default: vector_norm,
    aten.argmax.default: arg_reduction("cuvil.argmax"),
    aten.argmin.default: arg_reduction("cuvil.argmin"),
    aten.softmax.int: along_dim("cuvil.softmax"),
    aten._softmax.default: along_dim("cuvil.softmax"),
    aten.log_softmax.int: along_dim("cuvil.log_softmax"),
    aten._log_softmax.default: along_dim("cuvil.log_softmax"),
    aten.cumsum.default: along_dim("cuvil.cumsum"),
    aten.cumprod.default: along_dim("cuvil.cumprod"),
    aten.logcumsumexp.default: along_dim("cuvil.logcumsumexp"),
    aten.cummax.default: running_extreme("max"),
    aten.cummin.default: running_extreme("min"),
    aten.layer_norm.default: layer_norm,
    aten.native_layer_norm.default: native_layer_norm,
    aten.rms_norm.default: rms_norm,
    aten.group_norm.default: group_norm,
    aten.native_group_norm.default: native_group_norm,
    aten.instance_norm.default: instance_norm,
    aten._native_batch_norm_legit_no_training.default: batch_norm,
    aten._native_batch_norm_legit.no_stats: batch_statistics_norm,
    aten.batch_norm.default: inference_batch_norm,
    # linear algebra, convolution, pooling, attention
    aten.linear.default: linear,
    aten.matmul.default: matmul,
    aten.mm.default: matmul,
    aten.bmm.default: matmul,
    aten.einsum.default: einsum,
    aten.addmm.default: addmm,
    aten.baddbmm.default: baddbmm,
    aten.conv1d.default: conv1d,
    aten.conv2d.default: conv2d,
    aten.conv3d.default: conv3d,
    aten.conv1d.padding: padded_by_name(conv1d, 1),
    aten.conv2d.padding: padded_by_name(conv2d, 2),
    aten.conv3d.padding: padded_by_name(conv3d, 3),
    aten.max_pool3d.default: max_pool3d,
    aten.max_pool3d_with_indices.default: max_pool3d_with_indices,
    aten.avg_pool3d.default: avg_pool3d,
    aten.adaptive_avg_pool3d.default: adaptive_avg_pool3d,
    aten._adaptive_avg_pool3d.default: adaptive_avg_pool3d,
    aten.convolution.default: convolution,
    aten.conv_transpose1d.default: conv_transpose,
    aten.conv_transpose2d.input: conv_transpose,
    aten.conv_transpose3d.input: conv_transpose,
    aten.max_pool2d.default: max_pool2d,
    aten.max_pool1d.default: max_pool1d,
    **RESAMPLING,
    aten.pixel_shuffle.default: pixel_shuffle,
    aten.pixel_unshuffle.default: pixel_unshuffle,
    aten.max_pool2d_with_indices.default: max_pool2d_with_indices,
    aten.avg_pool2d.default: avg_pool2d,
    aten.adaptive_avg_pool2d.default: adaptive_avg_pool2d,
    aten._adaptive_avg_pool2d.default: adaptive_avg_pool2d,
    aten.adaptive_avg_pool1d.default: adaptive_avg_pool1d,
    aten.adaptive_max_pool2d.default: adaptive_max_pool2d,
    aten.embedding.default: embedding,
    aten._weight_norm.default: weight_norm,
    aten.scaled_dot_product_attention.default: sdpa,
    # shapes, views, indexing
    aten.view.default: reshape,
    aten._unsafe_view.default: reshape,
    aten.reshape.default: reshape,
    aten.reshape_as.default: reshape,
    aten.flatten.using_ints: reshape,
    aten.expand.default: expand,
    aten.copy.default: copy,
    aten.slice_scatter.default: slice_scatter,
    aten.select_scatter.default: select_scatter,
    aten.permute.default: permute,
    aten.transpose.int: transpose,
    aten.t.default: t,
    aten.numpy_T.default: numpy_t,
    aten.slice.Tensor: slice_,
    aten.select.int: select,
    aten.split_with_sizes.default: split,
    aten.split.Tensor: split,
    aten.chunk.default: split,
    aten.cat.default: cat,
    aten.stack.default: stack,
    aten.pad.default: pad,
    aten.flip.default: flip,
    aten.diff.default: diff,
    aten.unfold.default: unfold,
    aten.im2col.default: im2col,
    aten.roll.default: roll,
    aten.repeat.default: repeat,
    aten.repeat_interleave.self_int: repeat_interleave,
    aten.constant_pad_nd.default: lambda L, x, pads, value=0: pad(L, x, pads, "constant", value),
    aten.unsqueeze.default: unsqueeze,
    aten.squeeze.default: squeeze,
    aten.squeeze.dim: squeeze,
    aten.squeeze.dims: squeeze,
    aten.index_select.default: index_select,
    aten.gather.default: gather,
    aten.index.Tensor: index,
    aten.index_put.default: index_put,
    aten.triu.default: triangle("cuvil.triu"),
    aten.tril.default: triangle("cuvil.tril"),
    # tensor factories
    aten.full.default: like_full(1),
    aten.full_like.default: like_full(1),
    aten.fill.Scalar: like_full(1),
    aten.fill.Tensor: copy,
    aten.new_full.default: like_full(2),
    aten.zeros.default: like_full(fill=0),
    aten.zeros_like.default: like_full(fill=0),
    aten.new_zeros.default: like_full(fill=0),
    aten.ones.default: like_full(fill=1),
    aten.ones_like.default: like_full(fill=1),
    aten.new_ones.default: like_full(fill=1),
    aten.scalar_tensor.default: like_full(0),
    aten.empty.memory_format: like_full(fill=0),       # an empty tensor's values are undefined: zeros are some
    aten.empty_permuted.default: like_full(fill=0),
    torch.ops.cuvil.grouped_mm.default: lambda L, rows, weight, offsets: L.op("cuvil.grouped_matmul", rows, weight, offsets),
    torch.ops.cuvil.check_index.default: lambda L, index, size, dim, of: L.op("cuvil.check_index", index, size=[size],
                                                                             dim=dim, of=of),
    aten._local_scalar_dense.default: local_scalar_dense,
    aten.sym_storage_offset.default: sym_storage_offset,
    aten.arange.default: arange_end,
    aten.eye.default: eye,
    aten.eye.m: eye_m,
    aten.arange.start: lambda L, start, end, *_: arange(L, start, end),
    aten.arange.start_step: arange,
    # value-semantics no-ops: the graph IR has no aliasing, so copies and views of the whole are the value itself
    aten.clone.default: identity,
    aten.contiguous.default: identity,
    aten.alias.default: identity,
    aten.lift_fresh_copy.default: identity,
    aten.detach.default: identity,
    # checks torch inserts; Cuvil checks shapes itself
    aten._assert_tensor_metadata.default: no_op,
    aten._assert_scalar.default: assert_scalar,
    aten._assert_async.msg: assert_async,
    aten._assert_async.default: lambda L, cond: assert_async(L, cond, "Expected Tensor with single nonzero value, "
                                                                   "but got zero"),
    aten.sym_constrain_range_for_size.default: no_op,
    # symbolic ints and tuples
    aten.sym_size.int: symbolic_int,
    aten.sym_numel.default: symbolic_int,
    operator.add: symbolic_int,
    operator.sub: symbolic_int,
    operator.mul: symbolic_int,
    operator.floordiv: symbolic_int,
    operator.neg: symbolic_int,         # -qlen (XLNet's relative positions)
    operator.mod: symbolic_int,
    operator.pow: symbolic_int,         # b * b written b**2 by torch's size arithmetic
    torch.sym_max: symbolic_int,        # max(0, n - s) on sizes; a Max torch cannot simplify stays unsupported
    torch.sym_min: symbolic_int,
    operator.getitem: getitem,
    operator.eq: size_condition,
    operator.ne: size_condition,
    operator.lt: size_condition,
    operator.le: size_condition,
    operator.gt: size_condition,
    operator.ge: size_condition,
    torch.sym_not: size_condition,
    operator.and_: size_condition,
    operator.or_: size_condition,
}


def decomposition_table() -> dict:
    """torch.export's default decompositions minus every overload Cuvil lowers directly, plus
    Cuvil's own (`decompositions.py`; a fresh copy each call: `run_decompositions` may change the
    table it gets)."""
    return {**_decompositions(), **cuvil_decompositions()}


@functools.cache
def _decompositions() -> dict:
    table = torch.export.default_decompositions()     # building it takes ~0.2 s: once per process
    for op in (*ATEN_TABLE, *NOT_DECOMPOSED):
        if isinstance(op, torch._ops.OpOverload):
            table.pop(op, None)
    return dict(table.items())
