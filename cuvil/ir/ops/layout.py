"""Layout ops: views (reshape, permute, expand, slice, flip, unfold, split, squeeze, unsqueeze, select),
cat, slice_scatter, index_put, pad, index_select, gather, triu/tril and copy."""
from __future__ import annotations

import sympy
import torch

from ..core import OpDef, optional, register_op, required
from ..types import Dim, DType, TensorType, dims_equal, equal_over_ranges, floordiv, norm_dim
from .common import (broadcast_shapes, ceildiv, check_axes, check_axis, dims, is_one, product, promote,
                     require_integer, shape_str, types_str)

VIEW = frozenset({"injective", "view"})
# Views that list their operand's elements in its order, at another shape
RESHAPES = frozenset({"cuvil.reshape", "cuvil.squeeze", "cuvil.unsqueeze"})

# An integer slice bound at or above this is "to the end" even when the dim is symbolic (torch
# writes `x[1:]` as end = 2**63 - 1); symbolic dims are assumed to stay below it.
OPEN_END = 2 ** 31


@register_op
class ReshapeOp(OpDef):
    """Reshape to `shape`; one entry may be -1 (inferred, also symbolically)."""
    name = "cuvil.reshape"
    operands = ("x",)
    attrs = {"shape": required("dims")}
    tags = VIEW
    amp = "follow"

    @staticmethod
    def infer(types, attrs):
        (x,) = types
        shape = dims(attrs["shape"])
        holes = [i for i, d in enumerate(shape) if d == -1]
        if len(holes) > 1 or any(isinstance(d, int) and d < -1 for d in shape):
            raise ValueError(f"shape {shape_str(shape)} may hold one -1 and otherwise sizes >= 0")
        total = x.numel()
        if holes:
            known = product([d for d in shape if d != -1])
            if known == 0:
                raise ValueError(f"cannot infer the -1 of {shape_str(shape)} with a zero-size dim")
            missing = sympy.sympify(total) / known
            if missing.is_integer is not True:
                missing = sympy.cancel(missing)
            if missing.is_integer is not True:
                raise ValueError(f"cannot reshape {x} to {shape_str(shape)}: {total} is not a multiple of {known}")
            shape[holes[0]] = norm_dim(missing)
        elif not equal_over_ranges(product(shape), total):
            raise ValueError(f"cannot reshape {x} ({total} elements) to {shape_str(shape)}")
        return [x.with_shape(shape)]

    @staticmethod
    def evaluate(attrs, x):
        return x.reshape(attrs["shape"])


@register_op
class PermuteOp(OpDef):
    """Reorder dims: result dim i is input dim `perm[i]` (transpose is a permute)."""
    name = "cuvil.permute"
    operands = ("x",)
    attrs = {"perm": required("ints")}
    tags = VIEW
    amp = "follow"

    @staticmethod
    def infer(types, attrs):
        (x,) = types
        perm = attrs["perm"]
        if sorted(perm) != list(range(x.rank)):
            raise ValueError(f"perm = {list(perm)} is not a permutation of the {x.rank} dims of {x}")
        return [x.with_shape(tuple(x.shape[p] for p in perm))]

    @staticmethod
    def evaluate(attrs, x):
        return x.permute(attrs["perm"])


@register_op
class ExpandOp(OpDef):
    """Broadcast to `shape` (new leading dims allowed; -1 keeps a dim)."""
    name = "cuvil.expand"
    operands = ("x",)
    attrs = {"shape": required("dims")}
    tags = VIEW
    amp = "follow"

    @staticmethod
    def infer(types, attrs):
        (x,) = types
        shape = dims(attrs["shape"])
        lead = len(shape) - x.rank
        if lead < 0:
            raise ValueError(f"cannot expand {x} to fewer dims {shape_str(shape)}")
        out = []
        for i, d in enumerate(shape):
            src = x.shape[i - lead] if i >= lead else None
            if d == -1 and src is not None:
                d = src
            elif (src is not None and not is_one(src) and not dims_equal(src, d)) or (isinstance(d, int) and d < 0):
                raise ValueError(f"cannot expand {x} to {shape_str(shape)}")
            out.append(d)
        return [x.with_shape(out)]

    @staticmethod
    def evaluate(attrs, x):
        return x.expand(attrs["shape"])


def _clamp_bound(b: Dim, size: Dim) -> Dim:
    """A slice bound made non-negative and clamped to [0, size] like torch. Where the order of a
    symbolic bound and size cannot be decided, the bound is taken to lie in range."""
    if isinstance(b, int) and b < 0:
        b = norm_dim(sympy.sympify(size) + b)
    if isinstance(b, int) and isinstance(size, int):
        return min(max(b, 0), size)
    if isinstance(b, int) and b >= OPEN_END:
        return size
    if (sympy.sympify(size) - b).is_nonpositive:
        return size
    return b


@register_op
class SliceOp(OpDef):
    """`x[start:end:step]` along `dim`; bounds are one-element dims lists and clamp like torch."""
    name = "cuvil.slice"
    operands = ("x",)
    attrs = {"dim": required("int"), "start": optional("dims", [0]), "end": required("dims"),
             "step": optional("int", 1)}
    tags = VIEW
    amp = "follow"

    @staticmethod
    def infer(types, attrs):
        (x,) = types
        dim = check_axis(attrs["dim"], x.rank)
        step = attrs["step"]
        if step < 1 or len(attrs["start"]) != 1 or len(attrs["end"]) != 1:
            raise ValueError(f"slice needs step >= 1 and one-element start and end, got "
                             f"start = {attrs['start']}, end = {attrs['end']}, step = {step}")
        size = x.shape[dim]
        start, end = (_clamp_bound(norm_dim(attrs[k][0]), size) for k in ("start", "end"))
        span = norm_dim(sympy.sympify(end) - start)
        length = max(-(-span // step), 0) if isinstance(span, int) else ceildiv(span, step)
        return [x.with_shape(x.shape[:dim] + (length,) + x.shape[dim + 1:])]

    @staticmethod
    def evaluate(attrs, x):
        index = (slice(None),) * attrs["dim"] + (slice(attrs["start"][0], attrs["end"][0], attrs["step"]),)
        return x[index]


@register_op
class CatOp(OpDef):
    """Concatenate along `dim`; dtypes promote like torch.cat."""
    name = "cuvil.cat"
    operands = ("xs*",)
    attrs = {"dim": required("int")}
    tags = frozenset({"injective"})
    amp = "follow"

    @staticmethod
    def infer(types, attrs):
        if not types:
            raise ValueError("cat needs at least one operand")
        first = types[0]
        dim = check_axis(attrs["dim"], first.rank)
        for t in types[1:]:
            if t.rank != first.rank or not all(dims_equal(a, b) for i, (a, b) in enumerate(zip(t.shape, first.shape))
                                               if i != dim):
                raise ValueError(f"cat along dim {dim} needs equal other dims, got {types_str(types)}")
        total = norm_dim(sum((sympy.sympify(t.shape[dim]) for t in types), sympy.Integer(0)))
        return [TensorType(promote(*types), first.shape[:dim] + (total,) + first.shape[dim + 1:])]

    @staticmethod
    def evaluate(attrs, *xs):
        return torch.cat(xs, attrs["dim"])


@register_op
class SliceScatterOp(OpDef):
    """x with `x[start:end:step]` along `dim` replaced by src (torch.slice_scatter: what
    `x[:, 1:] = y` becomes in a functional graph); bounds as in `cuvil.slice`."""
    name = "cuvil.slice_scatter"
    operands = ("x", "src")
    attrs = {"dim": required("int"), "start": optional("dims", [0]), "end": required("dims"),
             "step": optional("int", 1)}
    tags = frozenset({"injective"})
    amp = "follow"

    @staticmethod
    def infer(types, attrs):
        x, src = types
        (piece,) = SliceOp.infer([x], attrs)
        if src.rank != x.rank or not all(dims_equal(a, b) for a, b in zip(src.shape, piece.shape)):
            raise ValueError(f"slice_scatter: src {src} does not fit the slice {piece} of {x}")
        if src.dtype != x.dtype:
            raise ValueError(f"slice_scatter: src is {src.dtype}, x is {x.dtype} (cast it first)")
        return [x]

    @staticmethod
    def evaluate(attrs, x, src):
        return torch.slice_scatter(x, src, attrs["dim"], attrs["start"][0], attrs["end"][0], attrs["step"])


@register_op
class IndexPutOp(OpDef):
    """x with rows replaced through one index tensor along dim 0 (torch's `x[index] = values`,
    index_put): row index[i] of the result is values[i], the last i that names it where several
    do (torch's CPU loop writes them in order), or with `accumulate` x's row plus every values[i]
    that names it. Negative indices count from the end; one outside the rows changes nothing here,
    and fails a compiled call (as eager raises: the kernel checks each row, and an index argument
    is checked at the call too, cuvil/index_inputs.py). values is
    [len(index), *x.shape[1:]], of x's dtype."""
    name = "cuvil.index_put"
    operands = ("x", "index", "values")
    attrs = {"accumulate": optional("bool", False)}
    tags = frozenset({"opaque"})

    @staticmethod
    def infer(types, attrs):
        x, index, values = types
        require_integer(index, "index")
        if x.rank < 1 or index.rank != 1:
            raise ValueError(f"index_put needs x of rank >= 1 and a 1-d index, got {types_str(types)}")
        want = (index.shape[0],) + x.shape[1:]
        if values.rank != len(want) or not all(dims_equal(a, b) for a, b in zip(values.shape, want)):
            raise ValueError(f"index_put: values {values} must have shape {shape_str(want)} (the index's length, "
                             f"then x's rows)")
        if values.dtype != x.dtype:
            raise ValueError(f"index_put: values are {values.dtype}, x is {x.dtype} (cast them first)")
        return [x]

    @staticmethod
    def evaluate(attrs, x, index, values):
        rows = x.shape[0]
        inside = (index >= -rows) & (index < rows)
        return torch.index_put(x, (index[inside],), values[inside], accumulate=attrs["accumulate"])


PAD_MODES = ("constant", "reflect", "replicate", "circular")


def _check_pad_amounts(mode: str, d: int, size: Dim, lo: int, hi: int) -> None:
    if not isinstance(size, int):
        raise ValueError(f"{mode} padding of dim {d} needs a static size, got {size}")
    if mode == "circular":
        left = size - max(-lo, 0) - max(-hi, 0)
        if left < 1 or max(lo, hi) > left:
            raise ValueError(f"circular padding of dim {d} (size {size}) by {lo} and {hi} needs what the "
                             f"negative amounts leave ({left}) to be at least 1 and the positive amounts")
    elif lo < 0 or hi < 0 or max(lo, hi) >= size:
        raise ValueError(f"reflect padding of dim {d} (size {size}) by {lo} and {hi} needs amounts from 0 to "
                         f"the size - 1")


@register_op
class PadOp(OpDef):
    """Pad every dim by `low[d]` elements before and `high[d]` after (one entry per dim). `constant`
    fills with `value`, and a negative amount crops; `reflect` mirrors without repeating the edge
    (amounts below the dim), `replicate` clamps the index into the dim (repeating the edge, or
    cropping where negative), `circular` crops by the negative amounts
    and then wraps around what is left (by at most its size). Like torch.nn.functional.pad, whose
    pad list runs from the last dim backwards."""
    name = "cuvil.pad"
    operands = ("x",)
    attrs = {"low": required("ints"), "high": required("ints"), "mode": optional("str", "constant"),
             "value": optional("float", 0.0)}
    tags = frozenset({"injective"})
    amp = "follow"

    @staticmethod
    def infer(types, attrs):
        (x,) = types
        low, high, mode = attrs["low"], attrs["high"], attrs["mode"]
        if mode not in PAD_MODES:
            raise ValueError(f"pad mode must be one of {', '.join(PAD_MODES)}, got '{mode}'")
        if len(low) != x.rank or len(high) != x.rank:
            raise ValueError(f"pad needs low and high amounts for each of the {x.rank} dims of {x}, "
                             f"got low = {low}, high = {high}")
        shape = []
        for d, (size, lo, hi) in enumerate(zip(x.shape, low, high)):
            if mode in ("reflect", "circular") and (lo or hi):
                _check_pad_amounts(mode, d, size, lo, hi)
            out = norm_dim(sympy.sympify(size) + lo + hi)
            if isinstance(out, int) and out < 0:
                raise ValueError(f"padding dim {d} (size {size}) by {lo} and {hi} leaves a negative size")
            shape.append(out)
        return [x.with_shape(shape)]

    @staticmethod
    def evaluate(attrs, x):
        mode = attrs["mode"]
        if mode == "constant":
            pads = [p for lo, hi in zip(reversed(attrs["low"]), reversed(attrs["high"])) for p in (lo, hi)]
            return torch.nn.functional.pad(x, pads, value=attrs["value"])
        # torch pads only the last one to three dims in these modes: gather each padded dim instead
        for d, (lo, hi) in enumerate(zip(attrs["low"], attrs["high"])):
            if lo or hi:
                size = x.shape[d]
                i = torch.arange(size + lo + hi) - lo
                if mode == "replicate":
                    i = i.clamp(0, size - 1)
                elif mode == "reflect":
                    i = torch.minimum(i.abs(), 2 * (size - 1) - i)
                else:
                    cut = max(-lo, 0)
                    i = (i + lo - max(lo, 0)).remainder(size - cut - max(-hi, 0)) + cut
                x = x.index_select(d, i)
        return x


@register_op
class FlipOp(OpDef):
    """Reverse the order of the elements along each of `dims`."""
    name = "cuvil.flip"
    operands = ("x",)
    attrs = {"dims": required("ints")}
    tags = VIEW
    amp = "follow"

    @staticmethod
    def infer(types, attrs):
        (x,) = types
        check_axes(attrs["dims"], x.rank)
        return [x]

    @staticmethod
    def evaluate(attrs, x):
        return torch.flip(x, attrs["dims"])


@register_op
class UnfoldOp(OpDef):
    """`x.unfold(dim, size, step)`: every window of `size` elements along `dim`, `step` apart, as
    a new last dim; `dim` becomes the window count (windows overlap where step < size)."""
    name = "cuvil.unfold"
    operands = ("x",)
    attrs = {"dim": required("int"), "size": required("int"), "step": required("int")}
    tags = VIEW
    amp = "follow"

    @staticmethod
    def infer(types, attrs):
        (x,) = types
        dim = check_axis(attrs["dim"], max(x.rank, 1))
        size, step = attrs["size"], attrs["step"]
        length = x.shape[dim] if x.rank else 1
        if step < 1 or size < 0:
            raise ValueError(f"unfold needs size >= 0 and step >= 1, got size = {size}, step = {step}")
        if isinstance(length, int) and length < size:
            raise ValueError(f"unfold: dim {dim} has {length} elements, fewer than the window size {size}")
        if x.rank == 0:         # torch: a 0-d tensor unfolds to its one window
            return [x.with_shape((size,))]
        windows = norm_dim(floordiv(norm_dim(sympy.sympify(length) - size), step) + 1)
        return [x.with_shape(x.shape[:dim] + (windows,) + x.shape[dim + 1:] + (size,))]

    @staticmethod
    def evaluate(attrs, x):
        return x.unfold(attrs["dim"], attrs["size"], attrs["step"])


@register_op
class SplitOp(OpDef):
    """Split along `dim` into pieces of `sizes` (which add up to the dim); one result per piece."""
    name = "cuvil.split"
    operands = ("x",)
    attrs = {"dim": required("int"), "sizes": required("dims")}
    tags = VIEW
    amp = "follow"

    @staticmethod
    def infer(types, attrs):
        (x,) = types
        dim = check_axis(attrs["dim"], x.rank)
        sizes = dims(attrs["sizes"])
        if not sizes or not dims_equal(norm_dim(sum(map(sympy.sympify, sizes))), x.shape[dim]):
            raise ValueError(f"sizes {shape_str(sizes)} do not add up to dim {dim} of {x}")
        return [x.with_shape(x.shape[:dim] + (s,) + x.shape[dim + 1:]) for s in sizes]

    @staticmethod
    def evaluate(attrs, x):
        return tuple(torch.split(x, attrs["sizes"], attrs["dim"]))


@register_op
class SqueezeOp(OpDef):
    """Drop the listed dims, each of static size 1."""
    name = "cuvil.squeeze"
    operands = ("x",)
    attrs = {"dims": required("ints")}
    tags = VIEW
    amp = "follow"

    @staticmethod
    def infer(types, attrs):
        (x,) = types
        axes = check_axes(attrs["dims"], x.rank)
        if not all(is_one(x.shape[a]) for a in axes):
            raise ValueError(f"squeezed dims {list(axes)} of {x} must have size 1")
        return [x.with_shape(tuple(d for i, d in enumerate(x.shape) if i not in axes))]

    @staticmethod
    def evaluate(attrs, x):
        return x.squeeze(tuple(attrs["dims"]))


@register_op
class UnsqueezeOp(OpDef):
    """Insert a dim of size 1 at position `dim` (0..rank)."""
    name = "cuvil.unsqueeze"
    operands = ("x",)
    attrs = {"dim": required("int")}
    tags = VIEW
    amp = "follow"

    @staticmethod
    def infer(types, attrs):
        (x,) = types
        dim = check_axis(attrs["dim"], x.rank, allow_end=True)
        return [x.with_shape(x.shape[:dim] + (1,) + x.shape[dim:])]

    @staticmethod
    def evaluate(attrs, x):
        return x.unsqueeze(attrs["dim"])


@register_op
class SelectOp(OpDef):
    """`x[..., index, ...]` at `dim`, dropping that dim (a negative index counts from the end)."""
    name = "cuvil.select"
    operands = ("x",)
    attrs = {"dim": required("int"), "index": required("int")}
    tags = VIEW
    amp = "follow"

    @staticmethod
    def infer(types, attrs):
        (x,) = types
        dim = check_axis(attrs["dim"], x.rank)
        size, index = x.shape[dim], attrs["index"]
        if isinstance(size, int) and not -size <= index < size:
            raise ValueError(f"index {index} is out of range for dim {dim} of {x}")
        return [x.with_shape(x.shape[:dim] + x.shape[dim + 1:])]

    @staticmethod
    def evaluate(attrs, x):
        return x.select(attrs["dim"], attrs["index"])


@register_op
class IndexSelectOp(OpDef):
    """Pick entries along `dim` by a 1-d integer `index` tensor."""
    name = "cuvil.index_select"
    operands = ("x", "index")
    attrs = {"dim": required("int")}
    tags = frozenset({"injective"})
    amp = "follow"

    @staticmethod
    def infer(types, attrs):
        x, index = types
        dim = check_axis(attrs["dim"], x.rank)
        require_integer(index, "index")
        if index.rank != 1:
            raise ValueError(f"index must be 1-d, got {index}")
        return [x.with_shape(x.shape[:dim] + index.shape + x.shape[dim + 1:])]

    @staticmethod
    def evaluate(attrs, x, index):
        return torch.index_select(x, attrs["dim"], index)


@register_op
class IndexOp(OpDef):
    """`x[i0, i1, ...]` with integer index tensors on the leading dims (torch advanced indexing):
    the result is the indices' broadcast shape followed by the remaining dims of x."""
    name = "cuvil.index"
    operands = ("x", "indices*")
    tags = frozenset({"injective"})
    amp = "follow"

    @staticmethod
    def infer(types, attrs):
        x, *indices = types
        if not 1 <= len(indices) <= x.rank:
            raise ValueError(f"cuvil.index needs 1 to {x.rank} index tensors for {x}, got {len(indices)}")
        for i in indices:
            require_integer(i, "indices")
        return [x.with_shape(broadcast_shapes(*indices) + x.shape[len(indices):])]

    @staticmethod
    def evaluate(attrs, x, *indices):
        return x[indices]


@register_op
class GatherOp(OpDef):
    """torch.gather: `out[i][j] = x[index[i][j]][j]` for dim 0; the result has index's shape."""
    name = "cuvil.gather"
    operands = ("x", "index")
    attrs = {"dim": required("int")}
    tags = frozenset({"injective"})
    amp = "follow"

    @staticmethod
    def infer(types, attrs):
        x, index = types
        check_axis(attrs["dim"], x.rank)
        if index.dtype is not DType.i64 or index.rank != x.rank:
            raise ValueError(f"index must be an i64 tensor of the rank of x, got {types_str(types)}")
        return [x.with_shape(index.shape)]

    @staticmethod
    def evaluate(attrs, x, index):
        return torch.gather(x, attrs["dim"], index)


class TriangleOp(OpDef):
    operands = ("x",)
    attrs = {"diagonal": optional("int", 0)}
    tags = frozenset({"injective"})
    amp = "follow"

    @staticmethod
    def infer(types, attrs):
        (x,) = types
        if x.rank < 2:
            raise ValueError(f"x must have rank >= 2, got {x}")
        return [x]


@register_op
class TriuOp(TriangleOp):
    """Zero the elements below diagonal `diagonal` of the last two dims."""
    name = "cuvil.triu"

    @staticmethod
    def evaluate(attrs, x):
        return torch.triu(x, attrs["diagonal"])


@register_op
class TrilOp(TriangleOp):
    """Zero the elements above diagonal `diagonal` of the last two dims."""
    name = "cuvil.tril"

    @staticmethod
    def evaluate(attrs, x):
        return torch.tril(x, attrs["diagonal"])


@register_op
class CopyOp(OpDef):
    """Materialise a value into a fresh contiguous buffer (clone)."""
    name = "cuvil.copy"
    operands = ("x",)
    tags = frozenset({"injective"})
    amp = "follow"

    @staticmethod
    def infer(types, attrs):
        return [types[0]]

    @staticmethod
    def evaluate(attrs, x):
        return x.clone(memory_format=torch.contiguous_format)
