"""Neural-network ops: linear, matmul, conv2d, pooling, normalisations, embedding, attention."""
from __future__ import annotations

import math

import sympy
import torch
import torch.nn.functional as F

from ..core import OpDef, optional, register_op, required
from ..types import DType, TensorType, dims_equal, norm_dim
from .common import (broadcast_shapes, pair, require_float, require_integer, require_same_dtype, shape_str,
                     types_str, window_out)


def _expect_shape(t: TensorType, shape: tuple, what: str) -> None:
    if t.rank != len(shape) or not all(dims_equal(a, b) for a, b in zip(t.shape, shape)):
        raise ValueError(f"{what} must have shape {shape_str(shape)}, got {t}")


def _require_rank(t: TensorType, ranks: tuple[int, ...], what: str) -> None:
    if t.rank not in ranks:
        raise ValueError(f"{what} must have rank {' or '.join(map(str, ranks))}, got {t}")


# ----------------------------------------------------------------------------- normalisation

class NormOp(OpDef):
    """Shared checks of layer_norm and rms_norm: x float, affine params shaped like the normalised dims."""
    tags = frozenset({"reduction"})
    amp = "never"

    @staticmethod
    def infer(types, attrs):
        x, *params = types
        require_float(x, "x")
        n = attrs["normalized_ndim"]
        if not 1 <= n <= x.rank:
            raise ValueError(f"normalized_ndim = {n} must be between 1 and the rank of {x}")
        for p in params:
            _expect_shape(p, x.shape[x.rank - n:], "weight and bias")
        require_same_dtype(types)
        return [x]


@register_op
class LayerNormOp(NormOp):
    """Layer normalisation over the last `normalized_ndim` dims."""
    name = "cuvil.layer_norm"
    operands = ("x", "weight?", "bias?")
    attrs = {"normalized_ndim": required("int"), "eps": optional("float", 1e-5)}

    @staticmethod
    def evaluate(attrs, x, weight=None, bias=None):
        shape = x.shape[x.dim() - attrs["normalized_ndim"]:]
        return F.layer_norm(x, shape, weight, bias, attrs["eps"])


@register_op
class RmsNormOp(NormOp):
    """RMS normalisation over the last `normalized_ndim` dims; `eps` none = the dtype's epsilon."""
    name = "cuvil.rms_norm"
    operands = ("x", "weight?")
    attrs = {"normalized_ndim": required("int"), "eps": optional("float?")}

    @staticmethod
    def evaluate(attrs, x, weight=None):
        shape = x.shape[x.dim() - attrs["normalized_ndim"]:]
        return F.rms_norm(x, shape, weight, attrs["eps"])


@register_op
class BatchNormOp(OpDef):
    """Batch normalisation with running statistics (inference form); channels are dim 1."""
    name = "cuvil.batch_norm"
    operands = ("x", "mean", "var", "weight?", "bias?")
    attrs = {"eps": optional("float", 1e-5)}
    amp = "never"

    @staticmethod
    def infer(types, attrs):
        x, *stats = types
        require_float(x, "x")
        if x.rank < 2:
            raise ValueError(f"x must have rank 2 or more (N, C, ...), got {x}")
        for s in stats:
            _expect_shape(s, (x.shape[1],), "mean, var, weight and bias")
        require_same_dtype(types)
        return [x]

    @staticmethod
    def evaluate(attrs, x, mean, var, weight=None, bias=None):
        return F.batch_norm(x, mean, var, weight, bias, training=False, eps=attrs["eps"])


# ----------------------------------------------------------------------------- matrix products

@register_op
class LinearOp(OpDef):
    """`x @ weight.T + bias` with weight `[out, in]`; with `out_features` set (by the `layout` pass)
    the weight is pre-packed in panels of P columns, `[ceil(out / P), in, P]` with P in PANEL_WIDTHS
    (`weight[p, k, j] = W[P * p + j, k]`, zero-padded; `pack_panels`)."""
    name = "cuvil.linear"
    operands = ("x", "weight", "bias?")
    attrs = {"out_features": optional("int?")}
    tags = frozenset({"opaque"})
    amp = "always"

    @staticmethod
    def infer(types, attrs):
        x, w, *bias = types
        require_same_dtype(types)
        out = attrs["out_features"]
        if x.rank < 1 or w.rank != (2 if out is None else 3):
            raise ValueError(f"linear needs x of rank >= 1 and a {'2' if out is None else '3'}-d weight, "
                             f"got {types_str(types)}")
        if out is not None and (out < 1 or w.shape[2] not in PANEL_WIDTHS or w.shape[0] != -(-out // w.shape[2])):
            raise ValueError(f"a weight packed for out_features = {out} must be [ceil(out / P), in, P] with P "
                             f"in {PANEL_WIDTHS}, got {w}")
        if not dims_equal(x.shape[-1], w.shape[1]):
            raise ValueError(f"in-features differ: x {x} against weight {w}")
        out = w.shape[0] if out is None else out
        for b in bias:
            _expect_shape(b, (out,), "bias")
        return [x.with_shape(x.shape[:-1] + (out,))]

    @staticmethod
    def evaluate(attrs, x, weight, bias=None):
        if attrs["out_features"] is not None:
            weight = unpack_panels(weight, attrs["out_features"])
        return F.linear(x, weight, bias)


PANEL_WIDTHS = (16, 32, 48, 64)     # columns per packed panel of a weight (codegen/panel_gemm.py)


def panel_width(out: int, widest: int = 64) -> int:
    """The panel width for `out` output columns: one 16-wide panel for up to 16 (a stem
    convolution, a classifier head), whose MR x 16 blocks waste no lanes; otherwise the widest
    panel of 32 or more, up to `widest`, that pads `out` no further than a narrower one (96
    columns: two of 48; 160: five of 32). Wider panels mean fewer loads per multiply-add: a 6 x 64
    block of C takes 10 loads for 24 FMAs, an 8 x 48 one 11, a 12 x 32 one 14 (one 64 x 1024 x
    1024 product 0.78x the time of 32-wide panels, BERT-small's FFN down 0.91x; 500 x 144 x 144
    0.76x with 48). A target with 16 registers of 8 floats (AVX2) takes 16: a 6 x 16 block fills 12
    of them, and a 32-wide panel leaves room for 2 x 32, whose B panel no longer stays in L1
    (15-18% slower measured on a Zen 3 core). `Target.panel_width` says which is the widest."""
    if out <= 16 or widest <= 16:
        return 16
    return min((w for w in reversed(PANEL_WIDTHS) if 32 <= w <= widest), key=lambda w: -(-out // w) * w)


def pack_panels(weight, widest: int = 64):
    """`[out, in]` -> `[ceil(out / P), in, P]` (P = `panel_width(out, widest)`), zero-padded."""
    out, inner = weight.shape
    width = panel_width(out, widest)
    panels = -(-out // width)
    if panels * width != out:
        weight = F.pad(weight, (0, 0, 0, panels * width - out))
    # one copy: zero-filling a padded buffer first took 3/4 of packing (BERT-base: 0.5 s)
    return weight.reshape(panels, width, inner).transpose(1, 2).contiguous()


def unpack_panels(packed, out: int):
    return packed.transpose(1, 2).reshape(-1, packed.shape[1])[:out]


def pack_conv_panels(hwio, groups: int = 1, widest: int = 64):
    """An NHWC convolution's `[kh, kw, in/groups, out]` weight -> `[groups * ceil(out_g / P), kh, kw,
    in/groups, P]` (out_g = out / groups): per group, in order, the panels of its
    `[kh * kw * in/groups, out_g]` GEMM operand (`pack_panels`)."""
    kh, kw, cin_g, out = hwio.shape
    out_g = out // groups
    width = panel_width(out_g, widest)
    panels = -(-out_g // width)
    w = hwio.permute(3, 2, 0, 1).reshape(groups, out_g, cin_g, kh, kw)      # OIHW, per group
    if panels * width != out_g:
        w = F.pad(w, (0, 0, 0, 0, 0, 0, 0, panels * width - out_g))
    # one copy (a reshape, a cat and the panels' transpose were three: ResNet-50's packing took 0.19 s)
    return w.reshape(groups * panels, width, cin_g, kh, kw).permute(0, 3, 4, 2, 1).contiguous()


def unpack_conv_panels(packed, out: int, groups: int = 1):
    """The inverse of `pack_conv_panels`, as an OIHW weight."""
    panels, kh, kw, cin_g, width = packed.shape
    per_group = packed.reshape(groups, panels // groups, kh * kw * cin_g, width)
    return torch.cat([unpack_panels(g, out // groups) for g in per_group]).reshape(out, kh, kw, cin_g) \
        .permute(0, 3, 1, 2)


@register_op
class MatmulOp(OpDef):
    """torch.matmul: 1-d operands are promoted and squeezed, batch dims broadcast."""
    name = "cuvil.matmul"
    operands = ("a", "b")
    tags = frozenset({"opaque"})
    amp = "always"

    @staticmethod
    def infer(types, attrs):
        a, b = types
        require_same_dtype(types)
        if a.rank == 0 or b.rank == 0:
            raise ValueError(f"matmul operands must have rank >= 1, got {types_str(types)}")
        a_shape = a.shape if a.rank > 1 else (1,) + a.shape
        b_shape = b.shape if b.rank > 1 else b.shape + (1,)
        if not dims_equal(a_shape[-1], b_shape[-2]):
            raise ValueError(f"contracted dims differ: {a} @ {b}")
        batch = broadcast_shapes(a.with_shape(a_shape[:-2]), b.with_shape(b_shape[:-2]))
        rows = (a_shape[-2],) if a.rank > 1 else ()
        cols = (b_shape[-1],) if b.rank > 1 else ()
        return [a.with_shape(batch + rows + cols)]

    @staticmethod
    def evaluate(attrs, a, b):
        return torch.matmul(a, b)


@register_op
class GroupedMatmulOp(OpDef):
    """A mixture of experts' grouped product: `rows` [S, K] sorted by expert, `offsets` [E] the
    running count of each expert's rows; row s of expert e (offsets[e-1] <= s < offsets[e]) is
    multiplied by weight[e] [K, N]. Rows past the last offset are 0 (transformers'
    `grouped_mm_fallback`)."""
    name = "cuvil.grouped_matmul"
    operands = ("rows", "weight", "offsets")
    tags = frozenset({"opaque"})

    @staticmethod
    def infer(types, attrs):
        rows, weight, offsets = types
        require_same_dtype([rows, weight])
        require_integer(offsets, "offsets")
        _require_rank(rows, (2,), "rows")
        _require_rank(weight, (3,), "weight")
        _expect_shape(offsets, (weight.shape[0],), "offsets")
        if not dims_equal(rows.shape[1], weight.shape[1]):
            raise ValueError(f"contracted dims differ: {rows} @ {weight}")
        return [rows.with_shape((rows.shape[0], weight.shape[2]))]

    @staticmethod
    def evaluate(attrs, rows, weight, offsets):
        out = torch.zeros(rows.shape[0], weight.shape[2], dtype=rows.dtype)
        start = 0
        for e, end in enumerate(offsets.tolist()):
            out[start:end] = rows[start:end] @ weight[e]
            start = end
        return out


# ----------------------------------------------------------------------------- convolution and pooling

# ----------------------------------------------------------------------------- image layouts

LAYOUTS = ("nchw", "nhwc")
TO_NHWC, TO_NCHW = (0, 2, 3, 1), (0, 3, 1, 2)          # permutations between the two
WEIGHT_TO_HWIO, WEIGHT_TO_OIHW = (2, 3, 1, 0), (3, 2, 0, 1)


def image_layout(attrs) -> str:
    if attrs["layout"] not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {attrs['layout']!r}")
    return attrs["layout"]


def spatial_axes(rank: int, layout: str) -> tuple[int, int]:
    """The axes of H and W: the last two (NCHW, or CHW at rank 3), or 1 and 2 (NHWC)."""
    return (1, 2) if layout == "nhwc" else (rank - 2, rank - 1)


def _in_nchw(attrs, fn, x, *rest):
    """Evaluate the NCHW reference `fn` on an image in the op's layout."""
    if attrs["layout"] == "nchw":
        return fn(x, *rest)
    return fn(x.permute(*TO_NCHW), *rest).permute(*TO_NHWC).contiguous()


# ----------------------------------------------------------------------------- convolution and pooling

@register_op
class Conv2dOp(OpDef):
    """2-d convolution. `layout = nchw`: x `[N, C, H, W]`, weight `[out, in/groups, kh, kw]`;
    `layout = nhwc` (chosen by the `layout` pass): x `[N, H, W, C]`, weight pre-packed as
    `[kh, kw, in/groups, out]`, result `[N, OH, OW, out]`. An NHWC convolution with `out_channels`
    set has its weight blocked in GEMM panels, per group `ceil(out / groups / P)` of them:
    `[groups * ceil(out / groups / P), kh, kw, in/groups, P]` with P in PANEL_WIDTHS
    (`pack_conv_panels`)."""
    name = "cuvil.conv2d"
    operands = ("x", "weight", "bias?")
    attrs = {"stride": optional("ints", [1, 1]), "padding": optional("ints", [0, 0]),
             "padding_high": optional("ints", []), "dilation": optional("ints", [1, 1]), "groups": optional("int", 1),
             "layout": optional("str", "nchw"), "out_channels": optional("int?")}
    tags = frozenset({"opaque"})
    amp = "always"

    @staticmethod
    def infer(types, attrs):
        x, w, *bias = types
        require_same_dtype(types)
        _require_rank(x, (4,), "x")
        nhwc = image_layout(attrs) == "nhwc"
        groups = attrs["groups"]
        out_ch = attrs["out_channels"]
        if out_ch is not None:
            if not nhwc or groups < 1 or out_ch < groups or out_ch % groups or w.rank != 5 \
                    or w.shape[4] not in PANEL_WIDTHS or w.shape[0] != groups * -(-(out_ch // groups) // w.shape[4]):
                raise ValueError(f"a convolution weight packed for out_channels = {out_ch} needs layout nhwc and "
                                 f"shape [groups * ceil(out / groups / P), kh, kw, in / groups, P] with P in "
                                 f"{PANEL_WIDTHS}, got {w}, groups = {groups}, layout {attrs['layout']}")
            kh, kw, in_per_group = w.shape[1:4]
        elif nhwc:
            _require_rank(w, (4,), "weight")
            kh, kw, in_per_group, out_ch = w.shape
        else:
            _require_rank(w, (4,), "weight")
            out_ch, in_per_group, kh, kw = w.shape
        if not all(isinstance(d, int) for d in (out_ch, in_per_group, kh, kw)):
            raise ValueError(f"the weight of a convolution must have a static shape, got {w}")
        channels = x.shape[3 if nhwc else 1]
        if groups < 1 or out_ch % groups or not dims_equal(channels, in_per_group * groups):
            raise ValueError(f"channels of x {x} do not match weight {w} with groups = {groups}")
        for b in bias:
            _expect_shape(b, (out_ch,), "bias")
        stride, dilation = (pair(attrs[k], k) for k in ("stride", "dilation"))
        padding, high = conv_padding(attrs)
        h, w_axis = spatial_axes(4, attrs["layout"])
        # the padding after the image counts as that much more image
        spatial = tuple(window_out(norm_dim(sympy.sympify(x.shape[axis]) + high[i] - padding[i]), (kh, kw)[i],
                                   stride[i], padding[i], dilation[i], False) for i, axis in enumerate((h, w_axis)))
        return [x.with_shape((x.shape[0],) + spatial + (out_ch,) if nhwc else (x.shape[0], out_ch) + spatial)]

    @staticmethod
    def evaluate(attrs, x, weight, bias=None):
        if attrs["out_channels"] is not None:
            weight = unpack_conv_panels(weight, attrs["out_channels"], attrs["groups"])
        elif attrs["layout"] == "nhwc":
            weight = weight.permute(*WEIGHT_TO_OIHW)
        (top, left), (bottom, right) = conv_padding(attrs)
        return _in_nchw(attrs, lambda t: F.conv2d(F.pad(t, (left, right, top, bottom)), weight, bias, attrs["stride"],
                                                  0, attrs["dilation"], attrs["groups"]), x)


def conv_padding(attrs) -> tuple[tuple[int, int], tuple[int, int]]:
    """A convolution's zeros before the image, (top, left), and after it, (bottom, right):
    `padding_high` when given (an asymmetric pad folded in: TensorFlow's "same" padding), else
    `padding` on both sides."""
    padding = pair(attrs["padding"], "padding")
    high = pair(attrs["padding_high"], "padding_high") if attrs["padding_high"] else padding
    if min(padding + high) < 0:
        raise ValueError(f"convolution padding must not be negative, got {list(padding)} and {list(high)}")
    return padding, high


def _pool_params(attrs) -> tuple[tuple[int, int], ...]:
    kernel = pair(attrs["kernel"], "kernel")
    stride = pair(attrs["stride"], "stride") if attrs["stride"] else kernel
    padding = pair(attrs["padding"], "padding")
    if any(p > k // 2 for p, k in zip(padding, kernel)):
        raise ValueError(f"padding {list(padding)} must be at most half of kernel {list(kernel)}")
    return kernel, stride, padding


def _pool_shape(x: TensorType, attrs, kernel, stride, padding, dilation, ceil_mode) -> list[TensorType]:
    _require_rank(x, (4,) if image_layout(attrs) == "nhwc" else (3, 4), "x")
    shape = list(x.shape)
    for i, axis in enumerate(spatial_axes(x.rank, attrs["layout"])):
        shape[axis] = window_out(x.shape[axis], kernel[i], stride[i], padding[i], dilation[i], ceil_mode)
    return [x.with_shape(tuple(shape))]


@register_op
class MaxPool2dOp(OpDef):
    """2-d max pooling over H and W (the last two dims, or dims 1 and 2 with `layout = nhwc`);
    empty `stride` means `stride = kernel`."""
    name = "cuvil.max_pool2d"
    operands = ("x",)
    attrs = {"kernel": required("ints"), "stride": optional("ints", []), "padding": optional("ints", [0, 0]),
             "dilation": optional("ints", [1, 1]), "ceil_mode": optional("bool", False),
             "layout": optional("str", "nchw")}
    tags = frozenset({"opaque"})
    amp = "follow"

    @staticmethod
    def infer(types, attrs):
        kernel, stride, padding = _pool_params(attrs)
        return _pool_shape(types[0], attrs, kernel, stride, padding, pair(attrs["dilation"], "dilation"),
                           attrs["ceil_mode"])

    @staticmethod
    def evaluate(attrs, x):
        return _in_nchw(attrs, lambda t: F.max_pool2d(t, attrs["kernel"], attrs["stride"] or None, attrs["padding"],
                                                      attrs["dilation"], attrs["ceil_mode"]), x)


@register_op
class AvgPool2dOp(OpDef):
    """2-d average pooling over H and W (see max_pool2d); `divisor` none = the window size."""
    name = "cuvil.avg_pool2d"
    operands = ("x",)
    attrs = {"kernel": required("ints"), "stride": optional("ints", []), "padding": optional("ints", [0, 0]),
             "ceil_mode": optional("bool", False), "count_include_pad": optional("bool", True),
             "divisor": optional("int?"), "layout": optional("str", "nchw")}
    tags = frozenset({"opaque"})
    amp = "follow"

    @staticmethod
    def infer(types, attrs):
        require_float(types[0], "x")
        kernel, stride, padding = _pool_params(attrs)
        return _pool_shape(types[0], attrs, kernel, stride, padding, (1, 1), attrs["ceil_mode"])

    @staticmethod
    def evaluate(attrs, x):
        return _in_nchw(attrs, lambda t: F.avg_pool2d(t, attrs["kernel"], attrs["stride"] or None, attrs["padding"],
                                                      attrs["ceil_mode"], attrs["count_include_pad"],
                                                      attrs["divisor"]), x)


@register_op
class AdaptiveAvgPool2dOp(OpDef):
    """Average pooling to a fixed `output_size` over H and W (see max_pool2d): output row i pools
    input rows floor(i*H/out) .. ceil((i+1)*H/out) - 1, likewise for columns."""
    name = "cuvil.adaptive_avg_pool2d"
    operands = ("x",)
    attrs = {"output_size": required("ints"), "layout": optional("str", "nchw")}
    tags = frozenset({"opaque"})
    amp = "follow"
    torch_fn = staticmethod(F.adaptive_avg_pool2d)

    @staticmethod
    def infer(types, attrs):
        (x,) = types
        require_float(x, "x")
        _require_rank(x, (4,) if image_layout(attrs) == "nhwc" else (3, 4), "x")
        shape = list(x.shape)
        for axis, size in zip(spatial_axes(x.rank, attrs["layout"]), pair(attrs["output_size"], "output_size")):
            shape[axis] = size
        return [x.with_shape(tuple(shape))]

    @classmethod
    def evaluate(cls, attrs, x):
        return _in_nchw(attrs, lambda t: cls.torch_fn(t, attrs["output_size"]), x)


@register_op
class AdaptiveMaxPool2dOp(AdaptiveAvgPool2dOp):
    """Max pooling to a fixed `output_size` over the windows of adaptive_avg_pool2d."""
    name = "cuvil.adaptive_max_pool2d"
    torch_fn = staticmethod(F.adaptive_max_pool2d)


# ----------------------------------------------------------------------------- lookup and attention

@register_op
class EmbeddingOp(OpDef):
    """Rows of `weight [num, dim]` picked by integer `indices`: result `indices.shape + [dim]`."""
    name = "cuvil.embedding"
    operands = ("weight", "indices")
    tags = frozenset({"injective"})
    amp = "follow"

    @staticmethod
    def infer(types, attrs):
        weight, indices = types
        _require_rank(weight, (2,), "weight")
        require_integer(indices, "indices")
        return [weight.with_shape(indices.shape + (weight.shape[1],))]

    @staticmethod
    def evaluate(attrs, weight, indices):
        return F.embedding(indices, weight)


@register_op
class SdpaOp(OpDef):
    """scaled_dot_product_attention on `[..., L, E]` queries; a bool mask keeps, a float mask is added.
    A row with every score masked (or -inf) gives zeros (`masked_rows = "zero"`, torch's sdpa) or
    NaN (`"nan"`: softmax's, for attention written out and fused by `fuse-attention`)."""
    name = "cuvil.sdpa"
    operands = ("q", "k", "v", "mask?")
    attrs = {"is_causal": optional("bool", False), "scale": optional("float?"), "masked_rows": optional("str", "zero")}
    tags = frozenset({"opaque"})
    amp = "always"

    @staticmethod
    def infer(types, attrs):
        q, k, v, *mask = types
        require_float(q, "q")
        require_same_dtype([q, k, v])
        if not q.rank == k.rank == v.rank >= 2:
            raise ValueError(f"q, k, v must have one rank >= 2, got {types_str(types)}")
        if attrs["masked_rows"] not in ("zero", "nan"):
            raise ValueError(f"masked_rows must be 'zero' or 'nan', got {attrs['masked_rows']!r}")
        batch_ok = all(dims_equal(a, b) and dims_equal(a, c) for a, b, c in zip(q.shape[:-2], k.shape, v.shape))
        if not (batch_ok and dims_equal(q.shape[-1], k.shape[-1]) and dims_equal(k.shape[-2], v.shape[-2])):
            raise ValueError(f"q, k, v shapes do not fit [..., L, E], [..., S, E], [..., S, Ev]: {types_str(types)}")
        if mask:
            if mask[0].dtype not in (DType.bool, q.dtype):
                raise ValueError(f"mask must be i1 or {q.dtype}, got {mask[0]}")
            if attrs["is_causal"]:
                raise ValueError("is_causal and an explicit mask cannot both be given")
            scores = q.with_shape(q.shape[:-1] + (k.shape[-2],))
            if not all(map(dims_equal, broadcast_shapes(scores, mask[0]), scores.shape)):
                raise ValueError(f"mask {mask[0]} does not broadcast to the scores {scores}")
        return [q.with_shape(q.shape[:-1] + (v.shape[-1],))]

    @staticmethod
    def evaluate(attrs, q, k, v, mask=None):
        if attrs["masked_rows"] == "zero":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=attrs["is_causal"],
                                                  scale=attrs["scale"])
        scale = attrs["scale"] if attrs["scale"] is not None else 1 / math.sqrt(q.shape[-1])
        scores = q @ k.transpose(-2, -1) * scale
        if attrs["is_causal"]:
            L, S = scores.shape[-2:]
            mask = torch.ones(L, S, dtype=torch.bool).tril()
        if mask is not None:
            scores = scores.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else scores + mask
        return torch.softmax(scores, -1) @ v

