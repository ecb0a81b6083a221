"""F.interpolate's ATen overloads -> Cuvil graph IR: each resized axis, from the last, as a
weighted sum of gathers along it.

- Static sizes: the taps and weights are torch's own, the same overload run at compile time on
  one-hot probes (so every mode, align_corners, scale and antialias rule is eager's).
- A symbolic size (an image whose height and width are dynamic): the taps and weights are computed
  per call from an arange of the output positions, in f32 with the arithmetic of torch's CPU
  kernels (`area_pixel_compute_source_index` and the cubic coefficients of UpSampleKernel.cpp), so
  that nearest's floors pick the pixels eager picks. Antialiased resizing of a symbolic size is
  refused by name.
- Nearest upscaling by an integer factor is a view instead (any size, symbolic too).
"""
from __future__ import annotations

import sympy
import torch

from ..ir import DType
from ..ir.types import dims_equal, norm_dim
from .importer import Lowering

aten = torch.ops.aten

# the interpolation each overload computes, and whether it takes align_corners
_KIND = {
    aten.upsample_nearest1d.vec: "nearest", aten.upsample_nearest2d.vec: "nearest",
    aten._upsample_nearest_exact1d.vec: "nearest-exact", aten._upsample_nearest_exact2d.vec: "nearest-exact",
    aten.upsample_linear1d.vec: "linear", aten.upsample_bilinear2d.vec: "linear",
    aten.upsample_bicubic2d.vec: "cubic",
    aten._upsample_bilinear2d_aa.vec: "antialiased", aten._upsample_bicubic2d_aa.vec: "antialiased",
}
CUBIC_A = -0.75     # torch's (and OpenCV's) bicubic convolution parameter


def resample(overload):
    """The table row of one of the overloads in `_KIND`."""
    kind = _KIND[overload]
    align = not kind.startswith("nearest")

    def row(L: Lowering, x, output_size, *args):
        align_corners, scales = args if align else (None, args[0])
        out_shape = L.out_shape()
        spatial = len(out_shape) - 2
        if 0 in out_shape[2:]:
            L.unsupported(f"{overload} from {list(x.type.shape[2:])} to an empty size {list(out_shape[2:])}, which "
                          f"eager refuses too")
        for j in reversed(range(spatial)):
            axis = 2 + j
            n_in, n_out = x.type.shape[axis], out_shape[axis]
            scale = None if scales is None else scales[j]
            if dims_equal(n_in, n_out):
                continue
            factor = _integer_factor(n_in, n_out)
            if not align and factor is not None and (scale is None or scale == factor):
                x = repeat_each(L, x, axis, factor)
            elif isinstance(n_in, int) and isinstance(n_out, int):
                ones = [i for i in range(spatial) if x.type.shape[2 + i] == 1]
                picks, weights = _probed_taps(overload, align, spatial, j, n_in, n_out, align_corners, scales, ones)
                along = (-1, *(1,) * (x.type.rank - 1 - axis))
                x = _weighted_gathers(L, x, axis, [
                    (L.constant("resample.taps", p), None if bool((w == 1).all()) else
                     L.constant("resample.weights", w.to(x.type.dtype.torch).reshape(along)))
                    for p, w in zip(picks, weights)])
            elif kind == "antialiased":
                L.unsupported(f"{overload} of a symbolic size ({n_in} -> {n_out}): antialiased resizing "
                              f"has weights only for constant sizes")
            else:
                taps = _computed_taps(L, kind, n_in, n_out, bool(align_corners), scale)
                along = [n_out, *(1,) * (x.type.rank - 1 - axis)]
                x = _weighted_gathers(L, x, axis, [
                    (i, None if w is None else L.op("cuvil.reshape", L.cast(w, x.type.dtype), shape=along))
                    for i, w in taps])
        return x
    return row


def _integer_factor(n_in, n_out) -> int | None:
    ratio = sympy.sympify(n_out) / sympy.sympify(n_in)
    return int(ratio) if ratio.is_Integer and ratio > 1 else None


def repeat_each(L: Lowering, x, axis: int, factor: int):
    """Every element along `axis` repeated `factor` times in place (nearest upscaling) as views."""
    shape = list(x.type.shape)
    y = L.op("cuvil.unsqueeze", x, dim=axis + 1)
    y = L.op("cuvil.expand", y, shape=shape[:axis + 1] + [factor] + shape[axis + 1:])
    return L.op("cuvil.reshape", y, shape=shape[:axis] + [norm_dim(sympy.sympify(shape[axis]) * factor)]
                + shape[axis + 1:])


def _probed_taps(overload, align: bool, spatial: int, j: int, n_in: int, n_out: int, align_corners, scales,
                 ones: list[int]):
    """(source index, weight) rows, [n_out] each, of resizing spatial axis j: the overload run on
    n_in one-hot rows, the other axes left as they are, of size 2, or 1 for those in `ones` (of
    size 1 in the tensor resized: torch's antialiased kernels resize an axis beside one of size 1
    with every output taking the first one's weights, and eager's results are those). Unused taps
    read element 0 with weight 0."""
    other = [n_in if i == j else 1 if i in ones else 2 for i in range(spatial)]
    probe = torch.eye(n_in).reshape(n_in, 1, *(n_in if i == j else 1 for i in range(spatial)))
    probe = probe.expand(n_in, 1, *other).contiguous()
    size = None if scales is not None else [n_out if i == j else other[i] for i in range(spatial)]
    scale = None if scales is None else [scales[j] if i == j else 1.0 for i in range(spatial)]
    with torch.no_grad():
        out = overload(probe, size, align_corners, scale) if align else overload(probe, size, scale)
    matrix = out[(slice(None), 0, *(slice(None) if i == j else 0 for i in range(spatial)))]
    taps = max(1, int((matrix != 0).sum(0).max()))
    picks, weights = torch.zeros(taps, n_out, dtype=torch.int64), torch.zeros(taps, n_out)
    for o in range(n_out):
        rows = matrix[:, o].nonzero().flatten()
        picks[:len(rows), o], weights[:len(rows), o] = rows, matrix[rows, o]
    return picks, weights


def _computed_taps(L: Lowering, kind: str, n_in, n_out, align_corners: bool, scale_factor: float | None):
    """[(source index [n_out] i64, weight [n_out] f32 or None)] of resizing an axis from n_in to
    n_out positions (either symbolic), computed per call."""
    i64 = DType.i64

    def f(name: str, *xs, dtype: DType = DType.f32):
        """f32 arithmetic (or `dtype`'s) on values and numbers, in the order written: Cuvil's code is
        plain IEEE, no contraction into FMAs, so this is the rounding of torch's own kernels."""
        return L.op(f"cuvil.{name}", *(L.tensor(a, dtype) for a in xs))
    pos = L.cast(L.op("cuvil.arange", start=0, end=[n_out], step=1, dtype=i64), DType.f32)
    last = L.literal(norm_dim(sympy.sympify(n_in) - 1), i64)
    if kind.startswith("nearest") or not align_corners:
        # compute_scales_value<float>: 1/scale_factor (rounded from f64), else in/out in f32
        scale = (float(1.0 / scale_factor) if scale_factor else
                 f("div", L.literal(n_in, DType.f32), L.literal(n_out, DType.f32)))
    else:   # area_pixel_compute_scale with align_corners: (in - 1) / (out - 1), 0 for one output
        ratio = f("div", L.literal(norm_dim(sympy.sympify(n_in) - 1), DType.f32),
                  L.literal(norm_dim(sympy.sympify(n_out) - 1), DType.f32))
        more = L.op("cuvil.gt", L.literal(n_out, i64), L.literal(1, i64))
        scale = L.op("cuvil.where", more, ratio, L.literal(0.0, DType.f32))
    if kind == "nearest" or align_corners:
        index = f("mul", scale, pos)
    else:   # area_pixel_compute_source_index without align_corners: linear and nearest-exact clamp at 0
        index = _fused_multiply_add(f, scale, f("add", pos, 0.5), -0.5)
        if kind != "cubic":
            index = f("maximum", index, 0.0)
    if kind.startswith("nearest"):
        if kind == "nearest-exact":
            index = f("add", index, 0.5)
        return [(f("minimum", L.cast(L.op("cuvil.floor", index), i64), last, dtype=i64), None)]
    # guard_index_and_lambda: the lower tap at most the last position, its weight's part in [0, 1]
    low = f("minimum", L.cast(L.op("cuvil.floor", index), i64), last, dtype=i64)
    t = L.op("cuvil.clamp", f("sub", index, L.cast(low, DType.f32)), min=0.0, max=1.0)
    if kind == "linear":
        high = f("minimum", f("add", low, 1, dtype=i64), last, dtype=i64)
        return [(low, f("sub", 1.0, t)), (high, t)]
    # cubic: four taps around `low`, each read clamped into the axis, weighed by the cubic
    # convolution's coefficients of the fraction t
    def near(x):    # cubic_convolution1: ((A + 2) x - (A + 3)) x x + 1, for |x| <= 1
        return f("add", f("mul", f("mul", f("sub", f("mul", CUBIC_A + 2, x), CUBIC_A + 3), x), x), 1.0)

    def far(x):     # cubic_convolution2: ((A x - 5A) x + 8A) x - 4A, for 1 < |x| < 2
        return f("sub", f("mul", f("add", f("mul", f("sub", f("mul", CUBIC_A, x), 5 * CUBIC_A), x), 8 * CUBIC_A), x),
                 4 * CUBIC_A)
    rest = f("sub", 1.0, t)
    weights = [far(f("add", t, 1.0)), near(t), near(rest), far(f("add", rest, 1.0))]
    picks = [f("maximum", f("minimum", f("add", low, k - 1, dtype=i64), last, dtype=i64), 0, dtype=i64)
             for k in range(4)]
    return list(zip(picks, weights))


def _fused_multiply_add(f, a, b, c: float):
    """a*b + c rounded once, as torch's index arithmetic is compiled (GCC contracts it into an FMA
    on x86-64 with FMA and on AArch64; rounding twice moves some positions by an ulp, which
    shifts a linear weight and can flip a nearest-exact floor). Cuvil has no f64 and its own code
    is never contracted, so the product is split exactly (Dekker's TwoProduct: halves of 12 bits)
    and the sum kept with its error (TwoSum); `c` is a constant."""
    def halves(x):
        big = f("mul", x, 4097.0)
        high = f("sub", big, f("sub", big, x))
        return high, f("sub", x, high)
    product = f("mul", a, b)
    (ah, al), (bh, bl) = halves(a), halves(b)
    product_error = f("add", f("add", f("add", f("sub", f("mul", ah, bh), product), f("mul", ah, bl)),
                                f("mul", al, bh)), f("mul", al, bl))
    total = f("add", product, c)
    back = f("sub", total, product)
    sum_error = f("add", f("sub", product, f("sub", total, back)), f("sub", c, back))
    return f("add", total, f("add", sum_error, product_error))


def _weighted_gathers(L: Lowering, x, axis: int, taps):
    """sum over taps of x's elements at the tap's indices ([n_out]) along `axis` times its weight
    (None: 1; [n_out, 1, ...] along that axis)."""
    out = None
    for index, weight in taps:
        term = L.op("cuvil.index_select", x, index, dim=axis)
        if weight is not None:
            term = L.op("cuvil.mul", term, weight)
        out = term if out is None else L.op("cuvil.add", out, term)
    return out


RESAMPLING = {op: resample(op) for op in _KIND}
