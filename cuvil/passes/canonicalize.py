"""The `canonicalize` pass: constant folding, algebraic identities and view simplifications,
applied as op-indexed patterns to a fixpoint. Every pattern keeps results bit-identical (floats
included: `x + 0.0` stays, since it turns -0.0 into +0.0; `x * 0` folds only for integers, since
NaN * 0 is NaN), but for two: a global pool's mean, whose sum is compensated (`reductions.py`)
where the pool's was not (nearer the exact mean), and a product with a transposed matrix, which
the GEMM then reads transposed (the same products, summed in the order that GEMM chooses)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import CuvilPassError
from ..ir.core import Module, Operation, Value
from ..ir.ops.layout import RESHAPES
from ..ir.ops.common import pair
from ..ir.ops.nn import conv_padding, spatial_axes
from ..ir.types import DType, TensorType
from .base import ModulePass
from .registry import register_pass
from .rewrite import (ANY_OP, Rewriter, apply_patterns, constant_data, is_pure, producer, same_type, splat_value,
                      uniform_value)


@register_pass
@dataclass(frozen=True)
class CanonicalizePass(ModulePass):
    """Fold constants, apply algebraic identities and simplify view chains, to a fixpoint.

    Identities: x+(-0.0), x-0, x*1, x/1, x*0 (integers), neg(neg x), relu(relu x), cast of an exact
    cast. Views: a reshape (squeeze, unsqueeze) of one, permute of permute, and no-op
    reshape/squeeze/expand/permute/slice and casts to the same dtype. A zero pad of a convolution's image
    becomes the convolution's padding. A pool whose one window is the whole image becomes a mean or
    amax. A matmul by a transposed matrix (`x @ w.t()`) becomes a linear of the matrix."""
    name = "canonicalize"
    priority = 100
    requires = frozenset({"verified"})
    fold_constants: bool = True

    def run(self, module: Module) -> dict:
        # Structure first, so that folding sees the simplest chains (a permute of a permute of a
        # weight becomes the weight, not a folded copy of it).
        fired = apply_patterns(module, PATTERNS)
        if self.fold_constants:
            fired += apply_patterns(module, {**PATTERNS, ANY_OP: [fold_constant]})
        return {name.replace("_", "-"): n for name, n in sorted(fired.items())}


# ----------------------------------------------------------------------------- constant folding

SOURCE_OPS = frozenset({"cuvil.const", "cuvil.literal"})


def fold_constant(op: Operation, rw: Rewriter) -> bool:
    """An op whose operands are all literals or constants with data becomes a literal (rank 0),
    a full (all elements equal) or a new module constant named after its first constant operand."""
    if not op.operands or op.name in SOURCE_OPS or not is_pure(op):
        return False
    if not all(r.type.is_static for r in op.results):
        return False
    data = [constant_data(rw.module, v) for v in op.operands]
    if any(d is None for d in data):
        return False
    try:
        out = op.opdef.evaluate(op.semantic_attrs, *data)
    except NotImplementedError:
        return False
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    values = [_materialise(op, r.type, t, rw) for r, t in zip(op.results, outs)]
    rw.replace(op, values)
    return True


def _materialise(op: Operation, t: TensorType, data: torch.Tensor, rw: Rewriter) -> Value:
    if tuple(data.shape) != t.shape or data.dtype != t.dtype.torch:
        raise CuvilPassError(f"folding {op.name}: its reference semantics gave {data.dtype} {list(data.shape)} "
                             f"but the op declares {t}")
    if t.rank == 0:
        return rw.create(op, "cuvil.literal", attrs={"value": data.item(), "dtype": t.dtype}).result
    value = uniform_value(data)
    if value is not None:
        return rw.create(op, "cuvil.full", attrs={"shape": list(t.shape), "value": value, "dtype": t.dtype}).result
    name = _fresh_constant_name(rw.module, op)
    rw.module.constants[name] = data.contiguous()
    return rw.create(op, "cuvil.const", attrs={"name": name}, result_types=[t]).result


def _fresh_constant_name(module: Module, op: Operation) -> str:
    base = next((p.attrs["name"] for p in map(producer, op.operands) if p is not None and p.name == "cuvil.const"),
                "folded")
    stem = f"{base}.{op.name.split('.', 1)[1]}"
    name, n = stem, 1
    while name in module.constants:
        name, n = f"{stem}.{n}", n + 1
    return name


# ----------------------------------------------------------------------------- algebra

def _is_zero(v, result: DType, negative: bool) -> bool:
    """A zero that leaves x unchanged under + (negative=True: -0.0) or - (+0.0) in `result` dtype."""
    if v is None or v != 0:
        return False
    if not result.is_float:
        return True
    sign_negative = isinstance(v, float) and math.copysign(1.0, v) < 0
    return sign_negative == negative


def _operand_pairs(op: Operation):
    """(x, other) pairs to try: both orders for commutative ops, else (lhs, rhs) only."""
    a, b = op.operands
    return [(a, b), (b, a)] if op.has_tag("commutative") else [(a, b)]


def _replace_if_same(op: Operation, x: Value, rw: Rewriter) -> bool:
    if not same_type(x.type, op.result.type):
        return False
    rw.replace(op, [x])
    return True


def add_zero(op: Operation, rw: Rewriter) -> bool:
    dt = op.result.type.dtype
    return any(_is_zero(splat_value(rw.module, z), dt, negative=True) and _replace_if_same(op, x, rw)
               for x, z in _operand_pairs(op))


def sub_zero(op: Operation, rw: Rewriter) -> bool:
    x, z = op.operands
    return _is_zero(splat_value(rw.module, z), op.result.type.dtype, negative=False) and _replace_if_same(op, x, rw)


def mul_one(op: Operation, rw: Rewriter) -> bool:
    return any(splat_value(rw.module, one) == 1 and _replace_if_same(op, x, rw) for x, one in _operand_pairs(op))


def mul_zero_int(op: Operation, rw: Rewriter) -> bool:
    t = op.result.type
    if t.dtype.is_float or not any(splat_value(rw.module, z) == 0 for _, z in _operand_pairs(op)):
        return False
    zeros = rw.create(op, "cuvil.full", attrs={"shape": list(t.shape), "value": False if t.dtype is DType.bool else 0,
                                               "dtype": t.dtype})
    rw.replace(op, zeros.results)
    return True


def div_one(op: Operation, rw: Rewriter) -> bool:
    x, one = op.operands
    return splat_value(rw.module, one) == 1 and _replace_if_same(op, x, rw)


def _inner(op: Operation, name: str) -> Operation | None:
    """The producer of op's first operand if it is a `name` op."""
    p = producer(op.operands[0])
    return p if p is not None and p.name == name else None


def neg_neg(op: Operation, rw: Rewriter) -> bool:
    inner = _inner(op, "cuvil.neg")
    return inner is not None and _replace_if_same(op, inner.operands[0], rw)


def relu_relu(op: Operation, rw: Rewriter) -> bool:
    inner = _inner(op, "cuvil.relu")
    return inner is not None and _replace_if_same(op, inner.result, rw)


# ----------------------------------------------------------------------------- casts

# (from, to) pairs where the cast is exact for every value, so a cast after it sees the original value.
_EXACT_CASTS = {
    DType.bool: {DType.i8, DType.i32, DType.i64, DType.f16, DType.bf16, DType.f32},
    DType.i8: {DType.i32, DType.i64, DType.f16, DType.bf16, DType.f32},
    DType.i32: {DType.i64},
    DType.f16: {DType.f32},
    DType.bf16: {DType.f32},
}


def cast_same(op: Operation, rw: Rewriter) -> bool:
    x = op.operands[0]
    return op.attrs["dtype"] == x.type.dtype and _replace_if_same(op, x, rw)


def cast_cast(op: Operation, rw: Rewriter) -> bool:
    inner = _inner(op, "cuvil.cast")
    if inner is None:
        return False
    x = inner.operands[0]
    if inner.attrs["dtype"] not in _EXACT_CASTS.get(x.type.dtype, ()):
        return False
    # float -> int of inf, NaN or out-of-range values is undefined (platform-specific), so two
    # routes to it need not agree
    if x.type.dtype.is_float and not op.attrs["dtype"].is_float:
        return False
    new = rw.create(op, "cuvil.cast", [x], {"dtype": op.attrs["dtype"]})
    rw.replace(op, new.results)
    return True


# ----------------------------------------------------------------------------- views

def view_noop(op: Operation, rw: Rewriter) -> bool:
    """A reshape (squeeze, unsqueeze) to its operand's own shape is its operand."""
    return _replace_if_same(op, op.operands[0], rw)


def view_of_view(op: Operation, rw: Rewriter) -> bool:
    """A reshape (squeeze, unsqueeze) of one is one reshape of the first's operand, or that operand
    itself where the shapes agree (an unsqueeze of a squeeze)."""
    inner = producer(op.operands[0])
    if inner is None or inner.name not in RESHAPES:
        return False
    source = inner.operands[0]
    if not _replace_if_same(op, source, rw):
        shape = op.attrs["shape"] if op.name == "cuvil.reshape" else list(op.result.type.shape)
        rw.replace(op, rw.create(op, "cuvil.reshape", [source], {"shape": shape}).results)
    return True


def permute_identity(op: Operation, rw: Rewriter) -> bool:
    perm = list(op.attrs["perm"])
    return perm == list(range(len(perm))) and _replace_if_same(op, op.operands[0], rw)


def permute_permute(op: Operation, rw: Rewriter) -> bool:
    inner = _inner(op, "cuvil.permute")
    if inner is None:
        return False
    composed = [inner.attrs["perm"][i] for i in op.attrs["perm"]]
    new = rw.create(op, "cuvil.permute", inner.operands, {"perm": composed})
    rw.replace(op, new.results)
    return True


def expand_noop(op: Operation, rw: Rewriter) -> bool:
    return _replace_if_same(op, op.operands[0], rw)


def slice_whole(op: Operation, rw: Rewriter) -> bool:
    whole = op.attrs["step"] == 1 and list(op.attrs["start"]) == [0]
    return whole and _replace_if_same(op, op.operands[0], rw)


def pad_nothing(op: Operation, rw: Rewriter) -> bool:
    return not any(op.attrs["low"]) and not any(op.attrs["high"]) and _replace_if_same(op, op.operands[0], rw)


def conv_of_padded(op: Operation, rw: Rewriter) -> bool:
    """conv2d(pad(x) with zeros around the image only) -> conv2d(x) with the pad added to its
    padding, `padding_high` taking the amounts after the image where they differ (TensorFlow's
    "same" padding, as Hugging Face's MobileNets write it, pads 0 before and 1 after). The pad
    was a kernel copying the whole image."""
    pad = producer(op.operands[0])
    if pad is None or pad.name != "cuvil.pad" or pad.attrs["mode"] != "constant" or pad.attrs["value"] != 0.0:
        return False
    low, high = pad.attrs["low"], pad.attrs["high"]
    axes = spatial_axes(4, op.attrs["layout"])
    if min(*low, *high) < 0 or any(low[a] or high[a] for a in range(4) if a not in axes):
        return False
    before, after = conv_padding(op.attrs)
    padding = [p + low[a] for p, a in zip(before, axes)]
    padding_high = [p + high[a] for p, a in zip(after, axes)]
    attrs = {**op.attrs, "padding": padding, "padding_high": [] if padding_high == padding else padding_high}
    rw.replace(op, rw.create(op, op.name, [pad.operands[0], *op.operands[1:]], attrs).results)
    return True


GLOBAL_POOL_REDUCTIONS = {"cuvil.adaptive_avg_pool2d": "cuvil.mean", "cuvil.adaptive_max_pool2d": "cuvil.amax",
                          "cuvil.avg_pool2d": "cuvil.mean", "cuvil.max_pool2d": "cuvil.amax"}


def global_pool(op: Operation, rw: Rewriter) -> bool:
    """A pool whose one window is the whole image -> mean / amax over H and W, kept:
    adaptive_avg_pool2d / adaptive_max_pool2d to 1x1, and avg_pool2d / max_pool2d whose kernel is
    the image's H x W, unpadded (and undilated, and divided by the window's size). The same sum over
    the same rows divided by the same count, but a reduction: in NHWC it runs along the channels,
    one vector lane each, where the pool's window loop read one channel at a time, a row of
    channels apart (a CNN's global pool of 16x64 outputs took 91 us, its mean 8; avg_pool2d(7)
    over 16x7x7x512, 572 us against 73)."""
    x = op.operands[0]
    axes = spatial_axes(x.type.rank, op.attrs["layout"])
    if "output_size" in op.attrs:
        if pair(op.attrs["output_size"], "output_size") != (1, 1):
            return False
    elif (pair(op.attrs["kernel"], "kernel") != tuple(x.type.shape[a] for a in axes)
          or any(op.attrs["padding"]) or any(d != 1 for d in op.attrs.get("dilation", [1]))
          or op.attrs.get("divisor") not in (None, math.prod(x.type.shape[a] for a in axes))):
        return False
    dims = list(axes)
    reduced = rw.create(op, GLOBAL_POOL_REDUCTIONS[op.name], [x], {"dims": dims, "keepdim": True})
    rw.replace(op, reduced.results)
    return True


def matmul_of_transpose(op: Operation, rw: Rewriter) -> bool:
    """matmul(x, permute(w, [1, 0])) -> linear(x, w), for any x (its batch dims, or a vector): the
    GEMM reads w's rows as the product's columns (OpenBLAS's NT sgemm, Cuvil's small and panel
    GEMMs), where the permute was a kernel copying all of w on every call (x @ w.t() with x
    64x1024 and w 1024x1024 at run time: 2.5 ms, 0.7 of it the copy)."""
    t = producer(op.operands[1])
    if t is None or t.name != "cuvil.permute" or list(t.attrs["perm"]) != [1, 0]:
        return False
    rw.replace(op, rw.create(op, "cuvil.linear", [op.operands[0], t.operands[0]], {"out_features": None}).results)
    return True


def sdpa_mask_noop(op: Operation, rw: Rewriter) -> bool:
    """sdpa(q, k, v, mask) -> sdpa(q, k, v) where the mask changes no score: all true, or a float
    mask of zeros (adding a zero to a score changes at most its sign, and e^-0 = e^0). Hugging
    Face's ViT passes an all-true mask for unpadded inputs, which the kernel read and selected
    on for every score."""
    if len(op.operands) != 4:
        return False
    mask = op.operands[3]
    value = splat_value(rw.module, mask)
    if value is None or (value is not True if mask.type.dtype is DType.bool else value != 0):
        return False
    rw.replace(op, rw.create(op, op.name, op.operands[:3], dict(op.attrs)).results)
    return True


PATTERNS = {
    "cuvil.add": [add_zero],
    "cuvil.sub": [sub_zero],
    "cuvil.mul": [mul_one, mul_zero_int],
    "cuvil.div": [div_one],
    "cuvil.neg": [neg_neg],
    "cuvil.relu": [relu_relu],
    "cuvil.cast": [cast_same, cast_cast],
    **{name: [view_noop, view_of_view] for name in RESHAPES},
    "cuvil.permute": [permute_identity, permute_permute],
    "cuvil.expand": [expand_noop],
    "cuvil.slice": [slice_whole],
    "cuvil.pad": [pad_nothing],
    "cuvil.conv2d": [conv_of_padded],
    "cuvil.sdpa": [sdpa_mask_noop],
    "cuvil.matmul": [matmul_of_transpose],
    **{name: [global_pool] for name in GLOBAL_POOL_REDUCTIONS},
}
