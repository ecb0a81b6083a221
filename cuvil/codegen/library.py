"""Lowerings of the opaque graph ops: library calls (GEMM-based matmul, linear, conv2d via im2col,
attention; the runtime's topk; running folds) and window ops (pooling, direct convolution).

- Window ops are computed per output element (`WINDOW_OPS[name](lowering, op, idx) -> Expr`): a
  small `Reduce` over the window with masked loads for the padding. They sit in the ordinary loop
  nest, so elementwise prologues and epilogues fuse with them.
- GEMM-based ops (`LIBRARY[name](lowering, op)`) write their raw product into a buffer with a
  kernel-IR `Gemm` (OpenBLAS sgemm, or Cuvil's own loops when it has at most a few rows: see
  `llvm_emit.SMALL_GEMM_MAX_ROWS`) inside a parallel loop over tiles (batch entries, blocks of
  rows and columns of the output, images and groups), and then run the group's epilogue (bias,
  activation) over the block each tile produced, while it is still in cache. Column tiles let a
  batch-1 linear (a GEMV) split across threads. `argtopk` works the same way, with a kernel-IR
  `TopK` (the runtime's topk, `native/src/select.h`) per row, and so do the running folds
  (`scan`: cumsum, cumprod, logcumsumexp, cummax, cummin), a sequential loop along each row.

Convolution picks its algorithm per shape (`conv_algorithm`): a plain GEMM for 1x1 stride-1
unpadded ungrouped convolutions, an implicit GEMM on the panel microkernel for the NHWC ones whose
weight the `layout` pass blocked in panels (all but depthwise ones), unrolled sums for depthwise
ones, the panel GEMM along the output rows for NCHW ones with few output channels (`columns`: an
RGB stem the `layout` pass left in NCHW), a direct kernel when the reduction per output element is
small (in_channels/groups * kh * kw <= 16), im2col + GEMM otherwise. What one parallel tile copies
(a padded input, im2col's columns) goes in the call's own local buffer where it fits
(`_per_item`). A max or average pool whose windows the tiles of an implicit GEMM or of a
convolution along its rows hold whole runs in the epilogue, over the tile's product in a local
buffer (`pool_in_tiles_problem`).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import sympy

from ..errors import CuvilError, CuvilUnsupportedOpError
from ..index_inputs import index_outside
from ..ir.core import Operation
from ..ir.ops.common import pair
from ..ir.ops.nn import PANEL_WIDTHS, TO_NHWC, conv_padding, panel_width, spatial_axes
from ..ir.types import DType, dims_equal, norm_dim
from .index_math import (TRANSPOSE_TILE, bounds, broadcast_index, decompose, floor_div, index_max, index_min,
                         tile_extent)
from .kernel_ir import (TOPK_DTYPES, Buffer, BufRef, Cast, Const, Gemm, Index, Load, Store, TopK, compute_dtype,
                        loop_var, scalar_index)
from .panel_gemm import CHAIN_FMAS
from .reductions import neumaier_add
from .scalar_ops import call, cast, const

ROW_TILE = 256          # output rows per parallel GEMM tile (linear, folded matmul)
COL_TILE = 256          # output columns per tile, for outputs at least twice as wide
PANEL_COL_TILE = 128    # the same for linears with packed weights (rounded down to whole panels)
CONV_TILE_POSITIONS = 256   # output positions (whole rows) per im2col tile
DIRECT_CONV_MAX_REDUCTION = 16
COLUMNS_MAX_OUT = 16        # conv2d_columns: output channels at most,
COLUMNS_MAX_REDUCTION = 32   # in_channels * kh * kw at most,
COLUMNS_RUN = 16             # and output columns a multiple of these (a vector), packed as runs
DEPTHWISE_MAX_TAPS = 128     # a depthwise output is a sum of kh*kw products written out in full
DEPTHWISE_COPY_BLOCK = 4     # the same over an NHWC copy (7x7: 0.87x the time of 2, 5x5: 0.78x, 3x3: 0.98x)
DEPTHWISE_BLOCK = 2          # outputs computed together, sharing loads (4 ran no faster on a Zen 3)
DEPTHWISE_BORDER_TAPS = 13   # see _in_place_pays
NHWC_MIN_CHANNEL_RUN = 8    # fewer channels per group: NHWC im2col gathers along image rows instead
# a kernel's local buffers, in all, at most (on the stack of each thread that calls it: the
# runtime's threads and Python's get 8 MB on Linux)
LOCAL_MAX_BYTES = 128 << 10


# ----------------------------------------------------------------------------- window helpers

def _window_attrs(op: Operation):
    a = op.attrs
    kernel = pair(a["kernel"], "kernel")
    stride = pair(a["stride"], "stride") if a["stride"] else kernel
    dilation = pair(a["dilation"], "dilation") if "dilation" in a else (1, 1)
    return kernel, stride, pair(a["padding"], "padding"), dilation


def _inside(lw, pos, size):
    """A mask that `0 <= pos < size`, or None when the index ranges prove it."""
    b = bounds(pos, lw.known)
    if b is not None and sympy.sympify(b[0]).is_nonnegative is True and \
            sympy.sympify(size - 1 - b[1]).is_nonnegative is True:
        return None
    return _inside_mask(pos, size)


def _inside_mask(pos, size):
    """`0 <= pos < size`, as a mask."""
    return call("and", call("ge", Index(pos), const(0, DType.i64)), call("lt", Index(pos), Index(size)))


def _and(*masks):
    masks = [m for m in masks if m is not None]
    if not masks:
        return None
    out = masks[0]
    for m in masks[1:]:
        out = call("and", out, m)
    return out


def _masked_value(lw, v, idx, mask, other):
    """`v[idx]` where `mask` holds, `other` elsewhere; loads under the mask never leave the buffer."""
    if mask is None:
        return cast(lw.value(v, idx), other.dtype)
    saved = lw.mask
    lw.mask = mask if saved is None else call("and", saved, mask)
    x = cast(lw.value(v, idx), other.dtype)
    combined, lw.mask = lw.mask, saved
    if isinstance(x, Load) and x.mask == combined:   # a plain masked load: give it `other` directly
        return Load(x.buf, x.index, x.mask, other)
    return call("select", mask, x, other)


def _spatial(op) -> tuple[int, int]:
    return spatial_axes(op.operands[0].type.rank, op.attrs["layout"])


def _at(idx, axes, values) -> list:
    """`idx` with the entries at `axes` replaced by `values`."""
    out = list(idx)
    for a, v in zip(axes, values):
        out[a] = v
    return out


def _window_positions(lw, op, idx, rvars, kernel, stride, padding, dilation):
    """The input index of window element `rvars` of output `idx`, and its in-bounds mask."""
    x = op.operands[0]
    axes = _spatial(op)
    H, W = (x.type.shape[a] for a in axes)
    oh, ow = (idx[a] for a in axes)
    kh, kw = rvars
    ih = oh * stride[0] - padding[0] + kh * dilation[0]
    iw = ow * stride[1] - padding[1] + kw * dilation[1]
    return _at(idx, axes, (ih, iw)), _and(_inside(lw, ih, H), _inside(lw, iw, W))


# ----------------------------------------------------------------------------- pooling

# a window larger than this loops over its part inside the image instead of masking every element
# (EfficientNet pools a 7x7 map with a 1280x1280 window)
CLIPPED_WINDOW = 64


def _pool_window(lw, op, idx, kernel, stride, padding, dilation, outside):
    """(ranges, value) for `lw.reduce` over the window of output `idx`: the whole window, with the
    elements in the padding read as `outside`; or, for a large window without dilation, only the
    rows and columns inside the image."""
    x = op.operands[0]
    if kernel[0] * kernel[1] <= CLIPPED_WINDOW or dilation != (1, 1):
        def masked(rv):
            at, mask = _window_positions(lw, op, idx, rv, kernel, stride, padding, dilation)
            return _masked_value(lw, x, at, mask, outside)
        return [("kh", 0, kernel[0]), ("kw", 0, kernel[1])], masked
    axes = _spatial(op)
    ranges = []
    for name, a, k, s, p in zip(("kh", "kw"), axes, kernel, stride, padding):
        first = sympy.sympify(idx[a]) * s - p               # the image row of window row 0
        start = index_max(0, -first)
        end = index_min(k, x.type.shape[a] - first)
        ranges.append((name, start, norm_dim(index_max(0, end - start))))
    origin = [sympy.sympify(idx[a]) * s - p for a, s, p in zip(axes, stride, padding)]
    return ranges, lambda rv: cast(lw.value(x, _at(idx, axes, [o + r for o, r in zip(origin, rv)])), outside.dtype)


def max_pool2d(lw, op, idx):
    kernel, stride, padding, dilation = _window_attrs(op)
    dtype = compute_dtype(op.operands[0].type.dtype)
    low = Const(-math.inf, dtype) if dtype.is_float else const(-(1 << 31), dtype)
    ranges, value = _pool_window(lw, op, idx, kernel, stride, padding, dilation, low)
    return lw.reduce("max", ranges, value, dtype, "pool")


def avg_pool2d(lw, op, idx):
    kernel, stride, padding, _ = _window_attrs(op)
    x = op.operands[0]
    dtype = compute_dtype(x.type.dtype)
    axes = _spatial(op)
    ranges, value = _pool_window(lw, op, idx, kernel, stride, padding, (1, 1), const(0.0, dtype))
    total = lw.reduce("sum", ranges, value, dtype, "pool")
    if op.attrs["divisor"] is not None:
        return call("div", total, const(op.attrs["divisor"], dtype))
    counts = []
    for o, k, s, p, size in zip((idx[a] for a in axes), kernel, stride, padding, (x.type.shape[a] for a in axes)):
        start = sympy.sympify(o) * s - p
        end = index_min(start + k, size + p)
        if not op.attrs["count_include_pad"]:
            start, end = index_max(start, 0), index_min(end, size)
        counts.append(end - start)
    return call("div", total, cast(Index(counts[0] * counts[1]), dtype))


def _adaptive_windows(op, idx) -> list[tuple[str, object, object]]:
    """(loop name, first row or column, extent) of the window output `idx` pools, per spatial axis."""
    x = op.operands[0]
    ranges = []
    for name, a in zip(("kh", "kw"), _spatial(op)):
        o, size, out = idx[a], x.type.shape[a], op.results[0].type.shape[a]
        start = sympy.floor(sympy.sympify(o) * size / out)
        end = sympy.ceiling((sympy.sympify(o) + 1) * size / out)
        ranges.append((name, start, end - start))
    return ranges


def adaptive_avg_pool2d(lw, op, idx):
    x = op.operands[0]
    dtype = compute_dtype(x.type.dtype)
    ranges = _adaptive_windows(op, idx)
    total = lw.reduce("sum", ranges, lambda rv: lw.value(x, _at(idx, _spatial(op), rv)), dtype, "pool")
    return call("div", total, cast(Index(ranges[0][2] * ranges[1][2]), dtype))


def adaptive_max_pool2d(lw, op, idx):
    x = op.operands[0]
    return lw.reduce("max", _adaptive_windows(op, idx), lambda rv: lw.value(x, _at(idx, _spatial(op), rv)),
                     compute_dtype(x.type.dtype), "pool")


# ----------------------------------------------------------------------------- convolution

def _conv_attrs(op: Operation):
    """(stride, padding before the image, dilation, groups): the padding after it shows only in the
    output's size, which every lowering reads from the result type, and in reads past the image's
    end, which find zeros as any padding does."""
    a = op.attrs
    return (pair(a["stride"], "stride"), pair(a["padding"], "padding"), pair(a["dilation"], "dilation"),
            a["groups"])


def _conv_weight_dims(op: Operation) -> tuple[int, int, int, int]:
    """(out channels, in channels per group, kh, kw), whichever way the weight is laid out."""
    if op.attrs["out_channels"] is not None:
        _, kh, kw, cin_g, _ = op.operands[1].type.shape
        return op.attrs["out_channels"], cin_g, kh, kw
    if op.attrs["layout"] == "nhwc":
        kh, kw, cin_g, out_ch = op.operands[1].type.shape
        return out_ch, cin_g, kh, kw
    return op.operands[1].type.shape


def _image(layout: str, n, c, h, w) -> list:
    return [n, h, w, c] if layout == "nhwc" else [n, c, h, w]


def conv_algorithm(op: Operation) -> str:
    """direct, gemm (1x1), implicit (weights in panels) or im2col: see the module docstring."""
    stride, _, dilation, groups = _conv_attrs(op)
    out_ch, cin_g, kh, kw = _conv_weight_dims(op)
    if (kh, kw) == (1, 1) and stride == (1, 1) and conv_padding(op.attrs) == ((0, 0), (0, 0)) and groups == 1:
        return "gemm"
    if op.attrs["out_channels"] is not None:
        return "implicit"
    if cin_g == 1 and 1 < kh * kw <= DEPTHWISE_MAX_TAPS:
        return "depthwise"
    if columns_pay(op):
        return "columns"
    if cin_g == 1 or cin_g * kh * kw <= DIRECT_CONV_MAX_REDUCTION:
        return "direct"
    return "im2col"


def columns_pay(op: Operation) -> bool:
    """Whether an NCHW convolution runs along its output rows (`conv2d_columns`): few output
    channels (an NHWC implicit GEMM's row of C is then one vector, and every FMA needs a broadcast
    of its own: load-bound), a short reduction, unit stride and dilation along the width, rows of
    whole vectors, and its tile's input planes and panels within LOCAL_MAX_BYTES."""
    stride, _, dilation, groups = _conv_attrs(op)
    out_ch, cin_g, kh, kw = _conv_weight_dims(op)
    ow = op.result.type.shape[3]
    if not (op.attrs["layout"] == "nchw" and groups == 1 and stride[1] == 1 and dilation[1] == 1
            and out_ch <= COLUMNS_MAX_OUT and cin_g * kh * kw <= COLUMNS_MAX_REDUCTION
            and isinstance(ow, int) and ow % COLUMNS_RUN == 0 and op.operands[0].type.dtype == DType.f32):
        return False
    return _columns_fit(op, None)


def _columns_fit(op: Operation, pool: Operation | None) -> bool:
    return sum(math.prod(shape) for shape in _columns_locals(op, max(PANEL_WIDTHS), pool).values()) * 4 \
        <= LOCAL_MAX_BYTES


POOLS_IN_TILES = ("cuvil.max_pool2d", "cuvil.avg_pool2d")
POOLING_CONVS = ("columns", "implicit")     # conv_algorithm's that can pool in the epilogue


def pool_in_tiles_problem(conv: Operation, pool: Operation) -> str | None:
    """Why `pool`, reading `conv`'s product (or elementwise ops of it), cannot run in the epilogue
    of a convolution computed over tiles of its output rows (`conv2d_columns`, `conv2d_implicit`);
    None when it can: its windows neither overlap nor reach into padding, and the tiles hold them
    whole (rounded down to whole windows: `_pooled_tile_rows`), with the tile's product in a local
    buffer. The product then never goes to memory: a small CNN's stem writes a quarter of it (its
    2x2 max pool's output)."""
    if conv.name != "cuvil.conv2d" or conv_algorithm(conv) not in POOLING_CONVS:
        return ("only a convolution computed over tiles of its output rows (an implicit GEMM, or along its rows) "
                "pools in its epilogue")
    kind = pool.name.split(".")[-1]
    if pool.name not in POOLS_IN_TILES or pool.attrs["layout"] != conv.attrs["layout"]:
        return f"{kind}'s windows are not whole in tiles of the convolution's output rows"
    kernel, stride, padding, dilation = _window_attrs(pool)
    if kernel != stride:
        problem = f"{kind}'s windows {'overlap' if kernel > stride else 'skip rows'} (kernel {kernel}, stride {stride})"
    elif padding != (0, 0) or pool.attrs["ceil_mode"]:
        problem = f"{kind}'s windows reach past the image (padding {padding}, ceil_mode {pool.attrs['ceil_mode']})"
    elif dilation != (1, 1):
        problem = f"{kind}'s windows are dilated ({dilation})"
    elif not isinstance(_output_size(conv)[1], int):
        problem = "the output's rows have no static width, so neither has a tile's product"
    elif not _pooled_tile_fits(conv, pool):
        problem = f"a tile's product (with the columns' planes and panels) would pass {LOCAL_MAX_BYTES >> 10} KB"
    else:
        return None
    return f"{problem}: the convolution's tiles cannot hold them whole"


def _output_size(op: Operation) -> tuple:
    """(rows, columns) of a convolution's output."""
    return tuple(op.result.type.shape[a] for a in _spatial(op))


def _pooled_tile_rows(op: Operation, pool: Operation | None) -> int:
    """Output rows per tile of `conv2d_columns` or `conv2d_implicit`: whole windows of a pool in
    the epilogue."""
    rows = _tile_rows(*_output_size(op))
    window = 1 if pool is None else _window_attrs(pool)[0][0]
    return max(window, rows - rows % window)


def _pooled_product(op: Operation, pool: Operation) -> tuple[int, int]:
    """The shape of a tile's product with `pool` in the epilogue: (channels, positions) along the
    rows (`conv2d_columns`), (positions, a group's channels) for an implicit GEMM."""
    OC, _, _, _ = _conv_weight_dims(op)
    positions = _pooled_tile_rows(op, pool) * _output_size(op)[1]
    if op.attrs["layout"] == "nchw":
        return OC, positions
    return positions, OC // op.attrs["groups"]


def _pooled_tile_fits(op: Operation, pool: Operation) -> bool:
    if conv_algorithm(op) == "columns":
        return _columns_fit(op, pool)
    return math.prod(_pooled_product(op, pool)) * 4 <= LOCAL_MAX_BYTES


def _columns_locals(op: Operation, width: int, pool: Operation | None) -> dict[str, tuple[int, ...]]:
    """The shapes of `conv2d_columns`'s local buffers: a tile's zero-padded input planes, its
    panels of col at the given panel width, and with a pool in the epilogue its product."""
    (sh, _), _, (dh, _), _ = _conv_attrs(op)
    _, C, KH, KW = _conv_weight_dims(op)
    OW = op.result.type.shape[3]
    tile_rows = _pooled_tile_rows(op, pool)
    in_rows, Wp = (tile_rows - 1) * sh + (KH - 1) * dh + 1, OW - 1 + KW
    shapes = {"planes": (C, in_rows * Wp), "col": (-(-(tile_rows * OW) // width), C * KH * KW, width)}
    if pool is not None:
        shapes["product"] = _pooled_product(op, pool)
    return shapes


def conv2d_columns(lw, op):
    """An NCHW convolution as out[OC, positions] = W[OC, K] @ col[K, positions] on the panel
    microkernel, the output positions along its vectors. Per parallel tile (image, block of output
    rows): the input channels' rows the tile reads are copied zero-padded, a plane per channel;
    col's panels are packed from them, tap by tap, each panel row in runs of output positions that
    are runs of a plane row; the GEMM's rows are the output channels, its A the weight as it lies.
    With few output channels an NHWC implicit GEMM's row of C is one vector, and each of its FMAs
    needs a broadcast of its own: it runs at the load rate. Here a 6 x 64 block of C takes 6
    broadcasts and 4 vector loads for 24 FMAs. The planes and the panels are the call's own
    (`Lowering.local`): tile after tile reuses them in L1 (a region per tile went to L3 and back:
    the packing took as long as the GEMM). A pool in the group (`pool_in_tiles_problem`) runs over the
    tile's product, which then is the call's own too: only the pooled output is stored."""
    _require_f32(op)
    (sh, _), (ph, pw), (dh, _), _ = _conv_attrs(op)
    x, w = op.operands[:2]
    N, C = x.type.shape[:2]
    OC, _, KH, KW = _conv_weight_dims(op)
    OH, OW = op.result.type.shape[2:]
    pool = _pool_in_epilogue(lw, op)
    tile_rows = _pooled_tile_rows(op, pool)
    span_h, Wp = (KH - 1) * dh + 1, OW - 1 + KW
    width = panel_width(tile_rows * OW, lw.widest_panel)
    run = OW if width % OW == 0 else COLUMNS_RUN      # positions in one panel and one plane row
    shapes = _columns_locals(op, width, pool)
    planes, col = lw.local(DType.f32, shapes["planes"]), lw.local(DType.f32, shapes["col"])
    if pool is None:
        T = _raw_buffer(lw, op)
        _materialize(lw, op, T, 1)
        in_registers = _register_epilogue(lw, op, T)
    else:
        T = lw.local(DType.f32, shapes["product"])
        in_registers, held = _pooled_epilogue(lw, op)
    epilogue = _gemm_epilogue(in_registers, 0)
    if epilogue.get("bias") is not None:        # a bias per output channel: per row of C
        epilogue["bias_rows"] = True

    def pack(c, kh, kw, rr, v, j):
        at = rr * OW + v * run
        lw.emit(Store(col, [floor_div(at, width, lw.known), (c * KH + kh) * KW + kw, at % width + j],
                      Load(planes, [c, (rr * sh + kh * dh) * Wp + v * run + j + kw])))

    def body(q, n, g, first, count):
        lw.loop("c", C, lambda c: _copy_padded(lw, x, planes, c, n, c, 1, first * sh - ph, (count - 1) * sh + span_h,
                                                pw, Wp, "nchw"))
        # tap by tap: the stores of one run after another fill a panel row (the other way round,
        # each store went a panel row further: 1.1-1.2x the packing's time in a C++ model of it)
        _loops(lw, ["c", "kh", "kw", "rr", "v", "j"], [C, KH, KW, count, OW // run, run], pack)
        # the last panel past the tile's positions: computed, not stored; zeros, not stale values
        used = count * OW
        pad = norm_dim(sympy.Mod(-sympy.sympify(used), width))
        if pad != 0:
            lw.loop("k", C * KH * KW, lambda k: lw.loop("j", pad, lambda j: lw.emit(Store(
                col, [floor_div(used, width, lw.known), k, width - pad + j], const(0.0, DType.f32)))))
        if pool is None:
            lw.emit(Gemm(BufRef(T, n * OC * OH * OW + first * OW), BufRef(lw.inputs[id(w)], 0), BufRef(col, 0),
                         OC, used, C * KH * KW, C * KH * KW, 0, OH * OW, b_panels=width, **epilogue))
            return
        lw.emit(Gemm(BufRef(T, 0), BufRef(lw.inputs[id(w)], 0), BufRef(col, 0),
                     OC, used, C * KH * KW, C * KH * KW, 0, tile_rows * OW, b_panels=width, **epilogue))
        _pool_tile(lw, op, pool, T, held, lambda idx: [idx[1], (sympy.sympify(idx[2]) - first) * OW + idx[3]],
                   n, (0, OC), first)
    _conv_tiles(lw, op, T, N, 1, OH, OW, body, tile_rows,
                epilogue=pool is None and (in_registers is None or not in_registers.whole))


def _pool_in_epilogue(lw, op) -> Operation | None:
    """The pool the group of convolution `op` runs over its product (`pool_in_tiles_problem`)."""
    return next((u for u in lw.ops[lw.ops.index(op) + 1:] if u.name in POOLS_IN_TILES), None)


def _pool_tile(lw, op, pool, T, held, at, n, channels, first) -> None:
    """The epilogue of a tile of output rows of convolution `op` (from row `first` of image n,
    `channels` as (start, extent)) whose group pools its product, which is in the tile's local
    buffer T at `at` of the product's index: the values T holds (`held`, else the product, the
    bias added here) are read there, and the group's outputs stored over the tile's pooled rows."""
    if held:
        for v in held:
            lw.materialized[id(v)] = lambda idx: Load(T, at(idx))
    else:
        _materialize(lw, op, T, 3 if op.attrs["layout"] == "nhwc" else 1, at)
    (wh, ww), _, _, _ = _window_attrs(pool)
    OH, OW = _output_size(op)
    first = floor_div(first, wh, lw.known)         # whole windows: the tile's rows are a multiple of wh
    rows = (first, tile_extent(_pooled_tile_rows(op, pool) // wh, floor_div(OH, wh, lw.known), first))
    columns = (0, OW // ww)
    _epilogue(lw, [(n, 1), rows, columns, channels] if op.attrs["layout"] == "nhwc" else
              [(n, 1), channels, rows, columns])


def _pooled_epilogue(lw, op) -> tuple[RegisterEpilogue | None, list]:
    """For a convolution with a pool in its group: what the microkernel applies in registers (the
    bias, and a relu that is the product's one reader) and the values the tile's product then
    holds; none where the bias is not a vector the kernel reads (the loops add it)."""
    fits, buf = _bias_vector(lw, op)
    if not fits:
        return None, []
    readers = {id(u): u for u in op.result.uses}
    relu = next(iter(readers.values())) if len(readers) == 1 else None
    relu = relu if relu is not None and relu.name == "cuvil.relu" else None
    return RegisterEpilogue(buf, relu is not None), [op.result] + ([relu.result] if relu is not None else [])


def conv2d_direct(lw, op, idx):
    stride, padding, dilation, groups = _conv_attrs(op)
    layout = op.attrs["layout"]
    x, w = op.operands[:2]
    out_ch, cin_g, KH, KW = _conv_weight_dims(op)
    dtype = compute_dtype(x.type.dtype)
    n, oc, oh, ow = (idx[0], idx[3], idx[1], idx[2]) if layout == "nhwc" else idx
    H, W = (x.type.shape[a] for a in _spatial(op))
    group = floor_div(oc, out_ch // groups, lw.known)
    ranges = ([("c", 0, cin_g)] if cin_g > 1 else []) + [("kh", 0, KH), ("kw", 0, KW)]

    def value(rv):
        c = rv[0] if cin_g > 1 else 0
        kh, kw = rv[-2:]
        ih = oh * stride[0] - padding[0] + kh * dilation[0]
        iw = ow * stride[1] - padding[1] + kw * dilation[1]
        mask = _and(_inside(lw, ih, H), _inside(lw, iw, W))
        xv = _masked_value(lw, x, _image(layout, n, group * cin_g + c, ih, iw), mask, const(0.0, dtype))
        w_idx = [kh, kw, c, oc] if layout == "nhwc" else [oc, c, kh, kw]
        return call("mul", cast(lw.value(w, w_idx), dtype), xv)
    acc = lw.reduce("sum", ranges, value, dtype, "conv")
    if len(op.operands) > 2:
        return call("add", acc, cast(lw.value(op.operands[2], [oc]), dtype))
    return acc


# ----------------------------------------------------------------------------- GEMM-based ops

def _raw_buffer(lw, op, dtype: DType = DType.f32):
    """The buffer that receives the op's raw product: its own output, the group's single output
    (the epilogue then runs in place), or scratch."""
    r = op.result
    if id(r) in lw.outputs:
        return lw.outputs[id(r)][1]
    outs = list(lw.outputs.values())
    if len(outs) == 1 and outs[0][1].dtype == dtype and outs[0][0].type.rank == r.type.rank \
            and id(outs[0][0]) not in lw.store_perm:
        return outs[0][1]
    return lw.scratch(dtype, r.type.shape)


def _require_f32(op, operands=None):
    for v in operands or op.operands:
        if v.type.dtype != DType.f32:
            raise CuvilUnsupportedOpError(op.name, detail=f"the native GEMM path is f32 only, got {v.type}")


def _materialize(lw, op, T, bias_dim: int | None, at=lambda idx: idx):
    """How the group reads `op`'s result: from T, at `at` of its index (a tile's own buffer), with
    the bias along `bias_dim` added."""
    bias = op.operands[2] if len(op.operands) > 2 else None

    def value(idx):
        e = Load(T, at(idx))
        if bias is not None:
            e = call("add", e, cast(lw.value(bias, [idx[bias_dim]]), DType.f32))
        return e
    lw.materialized[id(op.result)] = value


@dataclass(frozen=True)
class RegisterEpilogue:
    """What the panel microkernel finishes in registers: the group's whole epilogue, or (`whole`
    False) only the product's bias, the rest running as loops after it."""
    bias: Buffer | None
    relu: bool
    whole: bool = True


def _gemm_epilogue(in_registers: RegisterEpilogue | None, first_column) -> dict:
    """Gemm's epilogue fields for a call whose first output column is `first_column`."""
    if in_registers is None:
        return {}
    bias = None if in_registers.bias is None else BufRef(in_registers.bias, first_column)
    return {"bias": bias, "relu": in_registers.relu}


def _bias_vector(lw, op) -> tuple[bool, Buffer | None]:
    """Whether the microkernel can add `op`'s bias in registers (none, or a contiguous f32 vector
    the kernel reads), and that vector's buffer."""
    bias = op.operands[2] if len(op.operands) > 2 else None
    buf = None if bias is None else lw.inputs.get(id(bias))
    fits = bias is None or (buf is not None and buf.dtype == DType.f32 and buf.rank == 1 and buf.strides is None)
    return fits, buf


def _register_epilogue(lw, op, T) -> RegisterEpilogue | None:
    """What of the epilogue of `op`'s product the panel microkernel applies in registers: all of it
    where the group's ops after `op` are none or one relu and its one output is written into T;
    else its bias alone, the rest (fused ops of any kind) running as loops over each tile's block
    of the output, which then read the product with its bias from T. A bias must be a contiguous
    f32 vector the kernel reads (else None: all in the loops). Kernels whose epilogues differ past
    the bias so call one GEMM routine, which LLVM compiles once for them all (`SharedHelpers`)."""
    fits, buf = _bias_vector(lw, op)
    if not fits:
        return None
    if buf is not None:         # the product in T has its bias
        lw.materialized[id(op.result)] = lambda idx: Load(T, idx)
    outs = list(lw.outputs.values())
    rest = lw.ops[lw.ops.index(op) + 1:]      # what runs on the product (ops before it feed its inputs)
    whole = len(outs) == 1 and outs[0][1] is T and len(rest) <= 1 and (
        outs[0][0] is op.result if not rest else
        rest[0].name == "cuvil.relu" and rest[0].operands[0] is op.result and outs[0][0] is rest[0].result)
    if whole:
        return RegisterEpilogue(buf, bool(rest))
    return RegisterEpilogue(buf, False, whole=False) if buf is not None else None


def _epilogue(lw, region):
    """Store the group's outputs over `region`: one (start, extent) per output dim."""
    def nest(level, idx):
        if level == len(region):
            lw.store_outputs(idx)
            return
        start, extent = region[level]
        if extent == 1:
            nest(level + 1, idx + [start])
        else:
            lw.loop(f"e{level}", extent, lambda v: nest(level + 1, idx + [sympy.sympify(start) + v]))
    nest(0, [])


def _row_tile_height(rows, col_tiles, line: int | None = None) -> tuple[object, int]:
    """(tiles, rows per tile) along a GEMM's rows: at most ROW_TILE rows a tile. With a static
    row count the tiles are of even height (a multiple of 8), and an even number of them in all
    when there are several: the engine splits the tiles into equal counts per thread, so a short
    last tile, or one tile more for one of two threads, would leave a thread idle (ConvNeXt's
    3136 rows in 12 tiles of 256 and one of 64, three column tiles each: one thread had 19% more
    rows to do). With `line`, tiles of whole lines of that many rows (`_transposed_epilogue`)."""
    if line is not None:
        height = max(1, ROW_TILE // line) * line
        return norm_dim(sympy.ceiling(sympy.sympify(rows) / height)), height
    if not isinstance(rows, int) or rows <= ROW_TILE:
        return norm_dim(sympy.ceiling(sympy.sympify(rows) / ROW_TILE)), ROW_TILE
    tiles = (rows + ROW_TILE - 1) // ROW_TILE
    tiles += tiles * col_tiles % 2
    height = ((rows + tiles - 1) // tiles + 7) // 8 * 8
    return (rows + height - 1) // height, height


def _column_tiles(n, width: int = COL_TILE) -> tuple[int, object]:
    """(tiles, width) along the output columns: a wide GEMM is cut into tiles of `width` columns
    so that even one row of output (batch 1: a GEMV) splits across threads."""
    if isinstance(n, int) and n >= 2 * width:
        return math.ceil(n / width), width
    return 1, n


def _row_tiles(lw, T, rows, n, A, B, k, ldb, trans_b, row_shape, has_cols=True, b_panels=0,
               in_registers: RegisterEpilogue | None = None):
    """C[rows, n] = A[rows, k] @ op(B) in parallel tiles of rows and columns; each tile then runs
    the epilogue over its block (`row_shape`: the output dims the flat row index spans), unless
    the microkernel applies it `in_registers`. With `b_panels` (their width), B is packed in panels
    (`panel_gemm.py`), a column tile is whole panels (PANEL_COL_TILE rounded down: 96 for 48)."""
    # the panel GEMM packs nothing per call, so narrower tiles cost little and give threads work
    col_tiles, width = _column_tiles(n, PANEL_COL_TILE // b_panels * b_panels if b_panels else COL_TILE)
    row_tiles, height = _row_tile_height(rows, col_tiles, row_shape[-1] if lw.store_perm else None)
    if b_panels and row_tiles == 1 and col_tiles == 1 and isinstance(n, int) and n >= 2 * b_panels:
        # one tile would leave all threads but one idle (the block's QKV projection, 128 x 192):
        # two, split at a panel
        width = (-(-n // b_panels) + 1) // 2 * b_panels
        col_tiles = -(-n // width)

    def tile(p):
        t, c = decompose(lw.known, p, [row_tiles, col_tiles])
        count = tile_extent(height, rows, height * t) if row_tiles != 1 else rows
        cols = tile_extent(width, n, width * c) if col_tiles != 1 else n
        first, first_col = height * t, width * c
        b_offset = first_col * k if b_panels else first_col * ldb if trans_b else first_col
        lw.emit(Gemm(BufRef(T, first * n + first_col), BufRef(A, first * k), BufRef(B, b_offset), count, cols, k,
                     k, ldb, n, trans_b=trans_b, b_panels=b_panels, **_gemm_epilogue(in_registers, first_col)))
        if in_registers is not None and in_registers.whole:
            return
        if lw.store_perm:
            _transposed_epilogue(lw, height // row_shape[-1] * t, height // row_shape[-1], first_col, cols,
                                 row_shape)
            return

        def row(r, col_start=0, col_count=cols):
            idx = decompose(lw.known, first + r, row_shape)
            if has_cols:
                lw.loop("e1", col_count, lambda j: lw.store_outputs(idx + [first_col + col_start + j]))
            else:
                lw.store_outputs(idx)
        if has_cols and lw.gathered_axis(len(row_shape) + 1) is not None:
            # an operand read through a transposing permute (a residual in NCHW after an NHWC
            # linear) is contiguous along the rows: blocks of TRANSPOSE_TILE columns, each over
            # every row, read a few lines of it at a time, and the tile's block of C stays in L2
            W = TRANSPOSE_TILE
            lw.loop("e1t", norm_dim(sympy.ceiling(sympy.sympify(cols) / W)), lambda t: lw.loop(
                "e0", count, lambda r: row(r, W * t, tile_extent(W, cols, W * t))))
            return
        lw.loop("e0", count, row)
    lw.loop("p", norm_dim(row_tiles * col_tiles), tile, parallel=True)


def _transposed_epilogue(lw, first_line, lines, first_col, cols, row_shape) -> None:
    """The epilogue of a row tile of whole lines (`lines` runs of the rows' last dim L, from
    `first_line`) whose outputs are stored permuted with L last (`lower.epilogue_frames`: an NHWC
    linear's result stored NCHW). Per line, blocks of 8 columns x 8 rows, which the emitter
    transposes in registers (`transpose_tile.py`): 8 rows of the product from the tile's scratch,
    8 runs of 8 elements of each output."""
    L, W = row_shape[-1], TRANSPOSE_TILE

    def line(tc, q):
        outer = decompose(lw.known, first_line + q, row_shape[:-1])
        lw.loop("tl", -(-L // W), lambda tl: lw.loop(
            "ia", tile_extent(W, cols, W * tc), lambda i: lw.loop(
                "ib", tile_extent(W, L, W * tl),
                lambda j: lw.store_outputs(outer + [W * tl + j, first_col + W * tc + i]))))
    count = tile_extent(lines, norm_dim(sympy.Mul(*row_shape[:-1])), first_line)
    lw.loop("tc", norm_dim(sympy.ceiling(sympy.sympify(cols) / W)), lambda tc: lw.loop(
        "e0", count, lambda q: line(tc, q)))


def linear(lw, op):
    _require_f32(op)
    x, w = op.operands[:2]
    T = _raw_buffer(lw, op)
    _materialize(lw, op, T, -1)
    row_shape = list(x.type.shape[:-1])
    rows = norm_dim(sympy.Mul(*row_shape))
    X, Wt = lw.inputs[id(x)], lw.inputs[id(w)]
    out_f = op.attrs["out_features"]
    if out_f is not None:       # pre-packed in panels by the layout pass
        in_f = w.type.shape[1]
        _row_tiles(lw, T, rows, out_f, X, Wt, in_f, 0, False, row_shape, b_panels=w.type.shape[2],
                   in_registers=_register_epilogue(lw, op, T))
        return
    out_f, in_f = w.type.shape
    _row_tiles(lw, T, rows, out_f, X, Wt, in_f, in_f, True, row_shape)


def matmul(lw, op):
    _require_f32(op)
    a, b = op.operands
    T = _raw_buffer(lw, op)
    _materialize(lw, op, T, None)
    a_shape = a.type.shape if a.type.rank > 1 else (1,) + a.type.shape
    b_shape = b.type.shape if b.type.rank > 1 else b.type.shape + (1,)
    M, K = a_shape[-2:]
    N = b_shape[-1]
    A, B = lw.inputs.get(id(a)), lw.inputs.get(id(b))
    out_shape = op.result.type.shape
    if len(b_shape) == 2:   # one right-hand matrix: fold a's batch dims into its rows
        row_shape = list(out_shape[:-1]) if b.type.rank > 1 else list(out_shape)
        rows = norm_dim(sympy.Mul(*a_shape[:-1]))
        _row_tiles(lw, T, rows, N, A, B, K, N, False, row_shape, has_cols=b.type.rank > 1)
        return
    batch = out_shape[:len(out_shape) - (a.type.rank > 1) - (b.type.rank > 1)]
    total = norm_dim(sympy.Mul(*batch)) if batch else 1

    def offset(shape, q_idx, matrix):
        """Element offset of a batch entry in an operand whose batch dims broadcast."""
        own = shape[:-2]
        lead = len(batch) - len(own)
        off, stride = sympy.Integer(0), sympy.sympify(matrix)
        for k in reversed(range(len(own))):
            if not (isinstance(own[k], int) and own[k] == 1):
                off = off + q_idx[lead + k] * stride
            stride = stride * own[k]
        return off

    packed = _runtime_panels(lw, total, K, N) if _packs_at_run_time(M, N) else None
    # an operand behind views (attention's heads of a joint QKV projection) is read through them:
    # the right-hand side by its packing, the left one copied an entry at a time (`gathered_operands`),
    # unless it is an input's memory in order (a reshape of one), which the GEMM reads in place
    A = lw.row_major_input(a)
    a_rows = None if A is not None else lw.scratch(DType.f32, [total, M * K])

    def own_index(x, q_idx):
        """x's indices of batch entry q_idx, where x's own batch dims broadcast."""
        own = x.type.shape[:-2]
        return [0 if isinstance(d, int) and d == 1 else q_idx[len(batch) - len(own) + i] for i, d in enumerate(own)]

    def entry(q):
        q_idx = decompose(lw.known, q, batch)
        if a_rows is None:
            a_at = BufRef(A, offset(a_shape, q_idx, M * K))
        else:
            at = own_index(a, q_idx)
            lw.loop("r", M, lambda r: lw.loop("e", K, lambda e: lw.emit(
                Store(a_rows, [q, r * K + e], lw.value(a, at + [r, e])))))
            a_at = BufRef(a_rows, q * M * K)
        if packed is None:
            lw.emit(Gemm(BufRef(T, q * M * N), a_at, BufRef(B, offset(b_shape, q_idx, K * N)), M, N, K, K, N, N))
        else:
            at = own_index(b, q_idx)
            lw.emit(Gemm(BufRef(T, q * M * N), a_at, _pack(lw, packed, q, lambda kk, j: lw.value(b, at + [kk, j]), K, N),
                         M, N, K, K, 0, N, b_panels=packed.shape[-1]))
        region = [(i, 1) for i in q_idx]
        if a.type.rank > 1:
            region.append((0, M))
        if b.type.rank > 1:
            region.append((0, N))
        _epilogue(lw, region)
    lw.loop("p", total, entry, parallel=True)


# A product of two computed matrices packs its right-hand side in panels at run time and runs the
# panel GEMM: a copy of K x N floats, against OpenBLAS packing both operands per call (measured
# 0.73-0.75x OpenBLAS's time on 64x128x64, 64x64x128 and 128x128x16, panels packed beforehand).
# The panels are as wide as the target's for weights (`ir.ops.nn.panel_width`): with AVX-512, 32
# columns ran attention 7-20% faster than 16 from 64 to 1024 tokens (128: within 3%), and 64 ran
# the benchmark's transformer block (its linears too) in 0.92x the kernel time of 32.
PACK_MIN_ROWS = 16      # fewer rows than this: the copy is a large share of the work
PACK_MIN_COLUMNS = 16   # fewer columns: less than one panel


def _packs_at_run_time(M, N) -> bool:
    return isinstance(M, int) and isinstance(N, int) and M >= PACK_MIN_ROWS and N >= PACK_MIN_COLUMNS


def _runtime_panels(lw, entries, K, N) -> Buffer:
    """Scratch for one packed right-hand side per batch entry, `[entries, panels, K, width]`, the
    width `panel_width(N)` of the target's."""
    width = panel_width(N, lw.widest_panel)
    return lw.scratch(DType.f32, [entries, -(-N // width), K, width])


def _pack(lw, P, q, element, K, N) -> BufRef:
    """Pack entry `q`'s right-hand side, `element(kk, j)` for kk < K and j < N, into `P[q]` in
    panels of P's width (`ir.ops.nn.pack_panels`'s order; the last panel zero-padded). Returns
    where the GEMM reads it."""
    W = P.shape[-1]
    full, rest = divmod(N, W)
    T = TRANSPOSE_TILE

    def tiles(pp):      # a whole panel in T x T tiles: the emitter transposes those of a K^T in registers
        lw.loop("kt", K // T, lambda kt: lw.loop("jt", W // T, lambda jt: lw.loop(
            "kk", T, lambda kk: lw.loop("jj", T, lambda jj: lw.emit(Store(
                P, [q, pp, T * kt + kk, T * jt + jj], element(T * kt + kk, W * pp + T * jt + jj)))))))

    def panel(pp, width, pad):
        def row(kk):
            lw.loop("jj", width, lambda jj: lw.emit(Store(P, [q, pp, kk, jj], element(kk, W * pp + jj))))
            if pad:
                lw.loop("jj", W - width, lambda jj: lw.emit(Store(P, [q, pp, kk, width + jj], const(0.0, DType.f32))))
        lw.loop("kk", K, row)
    lw.loop("pp", full, lambda pp: tiles(pp) if isinstance(K, int) and K % T == 0 else panel(pp, W, False))
    if rest:
        panel(full, rest, True)
    return BufRef(P, q * P.shape[1] * K * W)


def conv2d_gemm(lw, op):
    """1x1 stride-1 convolution. NCHW: per image, out[OC, HW] = W[OC, C] @ x[C, HW], in row tiles.
    NHWC: one GEMM over all images, out[N*H*W, OC] = x[N*H*W, C] @ W[C, OC], in row tiles."""
    _require_f32(op)
    x, w = op.operands[:2]
    T = _raw_buffer(lw, op)
    X, Wt = lw.inputs[id(x)], lw.inputs[id(w)]
    OC = _conv_weight_dims(op)[0]
    if op.attrs["layout"] == "nhwc":
        _materialize(lw, op, T, 3)
        N, H, W, C = x.type.shape
        width = op.operands[1].type.shape[-1] if op.attrs["out_channels"] is not None else 0
        _row_tiles(lw, T, norm_dim(N * H * W), OC, X, Wt, C, OC, False, [N, H, W], b_panels=width,
                   in_registers=_register_epilogue(lw, op, T) if width else None)
        return
    _materialize(lw, op, T, 1)
    N, C, H, W = x.type.shape
    _conv_tiles(lw, op, T, N, 1, H, W, lambda q, n, g, first, count: lw.emit(Gemm(
        BufRef(T, (n * OC) * H * W + first * W), BufRef(Wt, 0),
        BufRef(X, n * C * H * W + first * W), OC, count * W, C, C, H * W, H * W)))


def conv2d_im2col(lw, op):
    """Per image, group and tile of output rows: gather the input windows into columns (scratch),
    then one GEMM with the group's weights. NCHW: col[c*kh*kw, positions], out = W @ col. NHWC with
    enough channels per group: col[positions, (kh, kw, c)], whose rows are runs of contiguous
    channels, out = col @ W. NHWC with few (an RGB stem, whose input is usually an NCHW tensor read
    through a fused permute): col[(kh, kw, c), positions] gathered along the image rows, as in
    NCHW, and out = col^T @ W."""
    _require_f32(op)
    stride, padding, dilation, groups = _conv_attrs(op)
    nhwc = op.attrs["layout"] == "nhwc"
    x, w = op.operands[:2]
    T = _raw_buffer(lw, op)
    _materialize(lw, op, T, 3 if nhwc else 1)
    N = x.type.shape[0]
    H, W = (x.type.shape[a] for a in _spatial(op))
    OC, cin_g, KH, KW = _conv_weight_dims(op)
    OH, OW = (op.result.type.shape[a] for a in _spatial(op))
    oc_g, K = OC // groups, cin_g * KH * KW
    tile_rows = _tile_rows(OH, OW)
    tiles = norm_dim(sympy.ceiling(sympy.sympify(OH) / tile_rows))
    positions = tile_rows * OW
    rows_of_channels = nhwc and cin_g >= NHWC_MIN_CHANNEL_RUN
    col, slot = _per_item(lw, norm_dim(N * groups * tiles), norm_dim(positions * K))
    Wt = lw.inputs[id(w)]

    def body(q, n, g, first, count):
        def gather(rr, ow, c, kh, kw):
            ih = (first + rr) * stride[0] - padding[0] + kh * dilation[0]
            iw = ow * stride[1] - padding[1] + kw * dilation[1]
            mask = _and(_inside(lw, ih, H), _inside(lw, iw, W))
            v = _masked_value(lw, x, _image(op.attrs["layout"], n, g * cin_g + c, ih, iw), mask,
                              const(0.0, DType.f32))
            k = ((kh * KW + kw) * cin_g + c) if nhwc else ((c * KH + kh) * KW + kw)
            at = (rr * OW + ow) * K + k if rows_of_channels else k * positions + rr * OW + ow
            lw.emit(Store(col, [slot(q), at], v))
        if rows_of_channels:
            _loops(lw, ["rr", "ow", "kh", "kw", "c"], [count, OW, KH, KW, cin_g],
                   lambda rr, ow, kh, kw, c: gather(rr, ow, c, kh, kw))
        else:
            _loops(lw, ["c", "kh", "kw", "rr", "ow"], [cin_g, KH, KW, count, OW],
                   lambda c, kh, kw, rr, ow: gather(rr, ow, c, kh, kw))
        cols = BufRef(col, slot(q) * K * positions)
        if not nhwc:
            lw.emit(Gemm(BufRef(T, (n * OC + g * oc_g) * OH * OW + first * OW), BufRef(Wt, g * oc_g * K), cols,
                         oc_g, count * OW, K, K, positions, OH * OW))
            return
        out = BufRef(T, ((n * OH + first) * OW) * OC + g * oc_g)
        if rows_of_channels:
            lw.emit(Gemm(out, cols, BufRef(Wt, g * oc_g), count * OW, oc_g, K, K, OC, OC))
        else:
            lw.emit(Gemm(out, cols, BufRef(Wt, g * oc_g), count * OW, oc_g, K, positions, OC, OC, trans_a=True))
    _conv_tiles(lw, op, T, N, groups, OH, OW, body, tile_rows)


def conv2d_implicit(lw, op):
    """NHWC convolution, weight in panels per group (`pack_conv_panels`), as an implicit GEMM. Per
    image, group and tile of output rows, the input rows the tile reads (the group's channels) are
    copied once into a zero-padded scratch (im2col copies each input element kh*kw times instead);
    the panel GEMM then reads its A rows, one per output position, as windows of that copy: each
    kernel row of a window is kw * C contiguous floats, a padded input row (times the dilation)
    apart from the next; dilated along the width, it is kw runs of C floats, dilation * C apart."""
    _require_f32(op)
    (sh, sw), (ph, pw), (dh, dw), groups = _conv_attrs(op)
    x, w = op.operands[:2]
    pool = _pool_in_epilogue(lw, op)
    if pool is None:
        T = _raw_buffer(lw, op)
        _materialize(lw, op, T, 3)
    else:       # the tile's product, the call's own; first, so that the padded copy goes to scratch if need be
        T = lw.local(DType.f32, _pooled_product(op, pool))
    N = x.type.shape[0]
    OC, C, KH, KW = _conv_weight_dims(op)
    _, OH, OW, _ = op.result.type.shape
    width = w.type.shape[-1]
    oc_g = OC // groups
    panels_g = -(-oc_g // width)
    tile_rows = _pooled_tile_rows(op, pool)
    tiles = norm_dim(sympy.ceiling(sympy.sympify(OH) / tile_rows))
    span_h, span_w = (KH - 1) * dh + 1, (KW - 1) * dw + 1       # the window's extent in the input
    in_rows, Wp = (tile_rows - 1) * sh + span_h, norm_dim((sympy.sympify(OW) - 1) * sw + span_w)
    padded, slot = _per_item(lw, norm_dim(N * groups * tiles), norm_dim(in_rows * Wp * C))
    Wt = lw.inputs[id(w)]
    in_registers, held = (_register_epilogue(lw, op, T), []) if pool is None else _pooled_epilogue(lw, op)
    # one run per kernel row, or one per tap of a row dilated along the width
    runs = dict(k_run=KW * C) if dw == 1 else dict(k_run=C, k_row_runs=KW, k_run_step=dw * C)

    def body(q, n, g, first, count):
        _copy_padded(lw, x, padded, slot(q), n, g * C, C, first * sh - ph, (count - 1) * sh + span_h, pw, Wp)
        C_tile = BufRef(T, ((n * OH + first) * OW) * OC + g * oc_g) if pool is None else BufRef(T, 0)
        lw.emit(Gemm(C_tile, BufRef(padded, slot(q) * in_rows * Wp * C),
                     BufRef(Wt, g * panels_g * KH * KW * C * width), count * OW, oc_g, KH * KW * C, sw * C, 0,
                     OC if pool is None else oc_g, b_panels=width, a_rows=OW, a_rows_stride=sh * Wp * C,
                     k_run_stride=dh * Wp * C, **runs, **_gemm_epilogue(in_registers, g * oc_g)))
        if pool is not None:
            _pool_tile(lw, op, pool, T, held, lambda idx: [(sympy.sympify(idx[1]) - first) * OW + idx[2],
                                                           sympy.sympify(idx[3]) - g * oc_g],
                       n, (g * oc_g, oc_g), first)
    _conv_tiles(lw, op, T, N, groups, OH, OW, body, tile_rows,
                epilogue=pool is None and (in_registers is None or not in_registers.whole))


def conv2d_depthwise(lw, op):
    """A convolution with one input channel per group (depthwise), NCHW or NHWC. Each output is a
    sum of kh*kw products written out in full: a chain of fused multiply-adds per kernel row (short
    enough for their latency), the rows added pairwise. The loop over channels (NHWC) or output
    columns (NCHW) is the innermost and vectorises; the direct kernel's per-output reduction over
    the window left it scalar (a 7x7 depthwise ran 11x eager's time).

    An NHWC input in memory is read where it lies (`_depthwise_in_place`). Otherwise, per parallel
    tile (NCHW: image, channel and block of output rows; NHWC: image and block of rows, every
    channel), the input rows the tile reads are first copied into a zero-padded scratch: an NCHW
    image read through the layout pass's conversion (the copy is the transpose), or an input the
    group computes (the copy computes it once, not once per tap)."""
    _require_f32(op)
    (sh, sw), (ph, pw), (dh, dw), groups = _conv_attrs(op)
    nhwc = op.attrs["layout"] == "nhwc"
    x, w = op.operands[:2]
    T = _raw_buffer(lw, op)
    _materialize(lw, op, T, 3 if nhwc else 1)
    if nhwc and lw.reads_row_major(x) and _in_place_pays(op):
        _depthwise_in_place(lw, op, T)
        return
    N = x.type.shape[0]
    OC, _, KH, KW = _conv_weight_dims(op)
    OH, OW = (op.result.type.shape[a] for a in _spatial(op))
    per_channel = OC // groups                      # outputs per input channel
    tile_rows = _depthwise_tile_rows(OH, OW, (KH - 1) * dh)
    tiles = norm_dim(sympy.ceiling(sympy.sympify(OH) / tile_rows))
    span_h, span_w = (KH - 1) * dh + 1, (KW - 1) * dw + 1
    in_rows, Wp = (tile_rows - 1) * sh + span_h, norm_dim((sympy.sympify(OW) - 1) * sw + span_w)
    C = groups if nhwc else 1                       # channels in one tile's copy
    tile_groups = 1 if nhwc else groups
    padded, slot = _per_item(lw, norm_dim(N * tile_groups * tiles), norm_dim(in_rows * Wp * C))

    def output(q, oc, rr, ow, outputs=1):
        c = floor_div(oc, per_channel, lw.known) if per_channel > 1 else oc
        return _window_sum(KH, KW, lambda kh, kw: (
            cast(lw.value(w, [kh, kw, 0, oc] if nhwc else [oc, 0, kh, kw]), DType.f32),
            Load(padded, [slot(q), ((rr * sh + kh * dh) * Wp + ow * sw + kw * dw) * C + (c if nhwc else 0)])),
            outputs=outputs)

    def store(at, values):
        values = [lw.let(v, "dw") for v in values]     # all loads first: T might alias them for LLVM
        for idx, v in zip(at, values):
            lw.emit(Store(T, idx, v))

    def body(q, n, g, first, count):
        _copy_padded(lw, x, padded, slot(q), n, g, C, first * sh - ph, (count - 1) * sh + span_h, pw, Wp,
                     op.attrs["layout"])
        if nhwc:    # DEPTHWISE_COPY_BLOCK output columns at a time share each weight vector's load
            lw.loop("rr", count, lambda rr: _in_blocks(lw, "ow", OW, DEPTHWISE_COPY_BLOCK, lambda ows: lw.loop(
                "oc", OC, lambda oc: store([[n, first + rr, ow, oc] for ow in ows],
                                           [output(q, oc, rr, ow, len(ows)) for ow in ows]))))
            return
        for j in range(per_channel):    # DEPTHWISE_BLOCK output rows at a time share their input rows
            oc = g * per_channel + j
            _in_blocks(lw, "rr", count, DEPTHWISE_BLOCK, lambda rows, oc=oc: lw.loop(
                "ow", OW, lambda ow: store([[n, oc, first + rr, ow] for rr in rows],
                                           [output(q, oc, rr, ow) for rr in rows])))
    _conv_tiles(lw, op, T, N, tile_groups, OH, OW, body, tile_rows)


def _depthwise_tile_rows(OH, OW, halo: int) -> int:
    """Output rows per tile of a depthwise convolution that copies its input: at least twice the
    `halo` (the input rows a tile copies beyond its own, which the tile above copies too), in an
    even number of tiles (two threads get equal shares). ConvNeXt's 7x7 at 56x56: 14 rows, not 4
    (its NCHW input copied 1.4 times, not 2.5): 0.83-0.87x the kernel's time."""
    rows = max(_tile_rows(OH, OW), 2 * halo)
    if not isinstance(OH, int) or rows >= OH:
        return rows
    tiles = OH // rows
    tiles -= tiles % 2 if tiles > 1 else 0
    return -(-OH // tiles)


def _window_sum(KH: int, KW: int, product, row_kept=None, outputs: int = 1) -> object:
    """The sum over a KH x KW window of `product(kh, kw)` = (weight, input): chains of fused
    multiply-adds per kernel row, at most CHAIN_FMAS long (a Conformer's 31 taps in one chain
    waited on each FMA's latency in turn: 110 us, against 88 in chains of 8), then the chains'
    and the rows' sums added pairwise; a row whose `row_kept(kh)` mask is false adds 0. One of a
    block of `outputs` sums that share their loads is CHAIN_FMAS // outputs chains of consecutive
    taps instead: fewer partial sums alive at once (with a chain per kernel row, a block of 4
    spilled registers and took 2.5x the time)."""
    def chain(taps):
        acc = None
        for kh, kw in taps:
            weight, x_at = product(kh, kw)
            acc = call("mul", weight, x_at) if acc is None else call("fma", weight, x_at, acc)
        return acc
    if outputs > 1 and row_kept is None:
        taps = [(kh, kw) for kh in range(KH) for kw in range(KW)]
        size = -(-len(taps) // max(1, CHAIN_FMAS // outputs))
        return _tree_sum([chain(taps[first:first + size]) for first in range(0, len(taps), size)])
    rows = []
    for kh in range(KH):
        acc = _tree_sum([chain([(kh, kw) for kw in range(first, min(KW, first + CHAIN_FMAS))])
                         for first in range(0, KW, CHAIN_FMAS)])
        rows.append(acc if row_kept is None else call("select", row_kept(kh), acc, const(0.0, DType.f32)))
    return _tree_sum(rows)


def _depthwise_in_place(lw, op, T):
    """An NHWC depthwise convolution reading its input where it lies in memory: no copy. Output
    positions whose whole window lies inside the image (the interior rows and, in them, the
    interior columns) read it unmasked, DEPTHWISE_BLOCK columns at a time sharing each weight
    vector's load; the border positions read each tap at an index clamped into the image and
    select 0 where it falls outside (the condition is uniform over the channels: one blend per
    tap, no masked loads, which NEON lacks). The group's elementwise epilogue (bias, activation)
    is applied to each output before it is stored, when it reads the product at its own index
    (`_epilogue_in_registers`); otherwise it runs over each tile after it, as for the GEMMs.
    The copy this replaces cost as much as the products (144 channels at 56x56, 3x3)."""
    (sh, sw), (ph, pw), (dh, dw), _ = _conv_attrs(op)
    x, w = op.operands[:2]
    N, H, W, _ = x.type.shape
    OC, _, KH, KW = _conv_weight_dims(op)
    OH, OW = op.result.type.shape[1:3]
    per_channel = OC // op.attrs["groups"]
    (r_lo, r_hi), (c_lo, c_hi) = _interior(op, lw.known)
    fused = _epilogue_in_registers(lw, op)

    def output(n, oc, rows, cols, row_in=None, col_in=None):
        """The window's sum at the output whose input rows and columns are `rows` and `cols`; at a
        border position these are clamped into the image and `row_in`/`col_in` say which lie in it."""
        c = floor_div(oc, per_channel, lw.known) if per_channel > 1 else oc

        def product(kh, kw):
            weight = cast(lw.value(w, [kh, kw, 0, oc]), DType.f32)
            x_at = cast(lw.value(x, [n, rows[kh], cols[kw], c]), DType.f32)
            if col_in is not None:
                x_at = call("select", col_in[kw], x_at, const(0.0, DType.f32))
            return weight, x_at
        # a row outside the image: its sum (of whatever its clamped reads hold) is dropped whole
        return _window_sum(KH, KW, product, None if row_in is None else (lambda kh: row_in[kh]))

    def store(n, oh, ows, oc, sums):
        values = [lw.let(s, "dw") for s in sums]
        for ow, v in zip(ows, values):
            if fused:
                _store_through_epilogue(lw, op, [n, oh, ow, oc], v)
            else:
                lw.emit(Store(T, [n, oh, ow, oc], v))

    def clamped(positions, size, name):
        """Per tap: whether its input row (column) lies inside the image, and its index clamped
        there, each bound once outside the channel loop (written out in every tap, the index
        expressions made up most of the kernel's compile time)."""
        inside = [lw.let(_inside_mask(i, size), f"{name}_in") for i in positions]
        at = [scalar_index(lw.let(Index(index_min(size - 1, index_max(0, i))), name).name) for i in positions]
        return inside, at

    # Per output row: DEPTHWISE_BLOCK interior columns at a time from c_lo (none in a border row),
    # then one loop over the rest, border code: columns [0, c_lo) and [tail, OW) in an interior
    # row, every column in a border row. One copy of each sum keeps LLVM's time down (a 7x7 window
    # is 49 products).
    whole = norm_dim(floor_div(sympy.sympify(c_hi) - c_lo, DEPTHWISE_BLOCK, lw.known))
    tail = norm_dim(c_lo + whole * DEPTHWISE_BLOCK)

    def row(n, oh):
        rows = [oh * sh - ph + kh * dh for kh in range(KH)]
        interior = index_min(1, index_max(0, oh - r_lo + 1), index_max(0, sympy.sympify(r_hi) - oh))   # 1 or 0

        def block(b):
            ows = [c_lo + b * DEPTHWISE_BLOCK + u for u in range(DEPTHWISE_BLOCK)]
            lw.loop("oc", OC, lambda oc: store(n, oh, ows, oc, [
                output(n, oc, rows, [ow * sw - pw + kw * dw for kw in range(KW)]) for ow in ows]))
        lw.loop("ow", norm_dim(interior * whole), block)
        skipped = interior * (tail - c_lo)      # interior columns done above
        row_in, row_at = clamped(rows, H, "ih")

        def border(j):
            ow = scalar_index(lw.let(Index(norm_dim(j + skipped * index_min(1, index_max(0, j - c_lo + 1)))), "ow").name)
            col_in, col_at = clamped([ow * sw - pw + kw * dw for kw in range(KW)], W, "iw")
            lw.loop("oc", OC, lambda oc: store(n, oh, [ow], oc, [output(n, oc, row_at, col_at, row_in, col_in)]))
        lw.loop("ow", norm_dim(OW - skipped), border)

    _conv_tiles(lw, op, T, N, 1, OH, OW, lambda q, n, g, first, count: lw.loop(
        "oh", count, lambda oh: row(n, oh), start=first), _tile_rows(OH, OW), epilogue=not fused)


def _interior(op, known: dict | None = None) -> tuple[tuple, tuple]:
    """[lo, hi) of the output rows, and of the columns, whose NHWC depthwise window lies inside
    the image."""
    (sh, sw), (ph, pw), (dh, dw), _ = _conv_attrs(op)
    _, H, W, _ = op.operands[0].type.shape
    _, _, KH, KW = _conv_weight_dims(op)
    OH, OW = op.result.type.shape[1:3]

    def span(out, size, pad, stride, window):
        lo = -(-pad // stride)      # (past `out` in an image smaller than the padding: no interior)
        return lo, index_max(lo, index_min(out, floor_div(sympy.sympify(size) + pad - window, stride, known or {}) + 1))
    return span(OH, H, ph, sh, (KH - 1) * dh + 1), span(OW, W, pw, sw, (KW - 1) * dw + 1)


def _in_place_pays(op) -> bool:
    """Whether reading an NHWC depthwise input in place beats copying it padded: the border code,
    one output at a time with a select per tap, may compute at most DEPTHWISE_BORDER_TAPS taps per
    output on average. A 7x7 window computes 10 over a 56x56 image (0.65x the copying kernel's
    time), 19 over 28x28 (the same time, for more code to compile) and 33 over 14x14 (1.5x); a 5x5
    window 12 over 14x14 (0.88x) and 20 over 7x7 (the same time); a 3x3 window at most 4.4 (7x7),
    always faster in place. With a size known only at run time: windows of at most 5x5."""
    _, _, KH, KW = _conv_weight_dims(op)
    OH, OW = op.result.type.shape[1:3]
    (r_lo, r_hi), (c_lo, c_hi) = _interior(op)
    sizes = [OH, OW, r_lo, r_hi, c_lo, c_hi]
    if not all(sympy.sympify(v).is_Integer for v in sizes):
        return KH * KW <= 25
    border = 1 - int(r_hi - r_lo) * int(c_hi - c_lo) / (OH * OW) if OH * OW else 0
    return border * KH * KW <= DEPTHWISE_BORDER_TAPS


def _epilogue_in_registers(lw, op) -> bool:
    """Whether the group's ops after `op` are elementwise and every output has op's shape, so that
    each output element is computed from op's value at its own index alone."""
    rest = lw.ops[lw.ops.index(op) + 1:]
    shape = op.result.type.shape
    return all(o.has_tag("elementwise") for o in rest) and all(
        v.type.rank == len(shape) and all(map(dims_equal, v.type.shape, shape)) for v, _ in lw.outputs.values())


def _store_through_epilogue(lw, op, idx, value) -> None:
    """Store the group's outputs at `idx`, with op's raw product there being `value`."""
    materialized = lw.materialized[id(op.result)]
    at = tuple(map(norm_dim, idx))
    bias = op.operands[2] if len(op.operands) > 2 else None

    def product(i):
        if tuple(map(norm_dim, i)) != at:
            raise CuvilError(f"internal error: {op.name}'s epilogue reads its product at {i}, not at {idx}")
        return value if bias is None else call("add", value, cast(lw.value(bias, [i[3]]), DType.f32))
    lw.materialized[id(op.result)] = product
    try:
        with lw.own_values():
            lw.store_outputs(idx)
    finally:
        lw.materialized[id(op.result)] = materialized


def _in_blocks(lw, name: str, total, block: int, body) -> None:
    """A loop over range(total) in blocks: body([i, i + 1, ..., i + block - 1]) per whole block,
    then body([i]) for each index left over."""
    whole = norm_dim(floor_div(sympy.sympify(total), block, lw.known))
    lw.loop(name, whole, lambda b: body([b * block + u for u in range(block)]))
    left = norm_dim(sympy.sympify(total) - whole * block)
    if left != 0:
        lw.loop(name, left, lambda i: body([i]), start=norm_dim(whole * block))


def _tree_sum(terms: list):
    """terms[0] + terms[1] + ..., added pairwise: a chain would wait on each add in turn."""
    while len(terms) > 1:
        terms = [call("add", a, b) for a, b in zip(terms[::2], terms[1::2])] + terms[len(terms) // 2 * 2:]
    return terms[0]


def _per_item(lw, items, size):
    """A buffer of `size` floats per iteration of the parallel loop, and the function of the
    iteration that gives the one to use: the call's own local buffer, which every iteration of the
    call reuses while it is in cache, where `size` is known and the kernel's locals stay within
    LOCAL_MAX_BYTES; else a region of scratch each (all of them in the arena)."""
    if isinstance(size, int) and lw.local_bytes + size * 4 <= LOCAL_MAX_BYTES:
        return lw.local(DType.f32, (1, size)), lambda q: 0
    return lw.scratch(DType.f32, [items, size]), lambda q: q


def _copy_padded(lw, x, padded, q, n, c0, C, top_row, rows, pw, Wp, layout="nhwc"):
    """Tile q of the zero-padded copy (`padded[q]`, rows x Wp x C floats, flat) of channels
    [c0, c0 + C) of the image rows from `top_row` and the columns from -pw: zeros first (one flat
    loop, a memset), then the part inside the image, a plain copy with no per-element masks:
    channels innermost, or image columns when there are few channels (an NCHW depthwise
    convolution's one channel) or when x is an NCHW tensor read through the layout pass's
    conversion (the first convolution of a model): in 8 x 8 tiles from 8 channels, below that
    each column's channels written out."""
    H, W = (x.type.shape[a] for a in spatial_axes(x.type.rank, layout))
    nchw_memory = not x.is_arg and x.owner.name == "cuvil.permute" and tuple(x.owner.attrs["perm"]) == TO_NHWC
    above = index_min(rows, index_max(0, -top_row))
    below = index_max(above, index_min(rows, H - top_row))           # the first row under the image
    inside = index_min(W, Wp - pw)                                   # columns copied per row
    spans = {"r": (above, below), "j": (pw, pw + inside), "c": (0, C)}
    # zeros where the copy does not write: the rows above and below the image, then the columns
    # left and right of it (a whole-tile memset first cost as much as the copy)
    row = Wp * C
    zero = lambda t: lw.emit(Store(padded, [q, t], const(0.0, DType.f32)))   # noqa: E731
    lw.loop("t", norm_dim(above * row), zero)
    lw.loop("t", norm_dim((rows - below) * row), zero, start=norm_dim(below * row))
    lw.loop("r", norm_dim(below - above), lambda r: (
        lw.loop("t", norm_dim(pw * C), zero, start=norm_dim(r * row)),
        lw.loop("t", norm_dim((Wp - pw - inside) * C), zero, start=norm_dim(r * row + (pw + inside) * C))),
        start=above)

    def copy(r, j, c):
        lw.emit(Store(padded, [q, (r * Wp + j) * C + c], lw.value(x, _image(layout, n, c0 + c, top_row + r, j - pw))))

    def span(name, body):
        lo, hi = spans[name]
        lw.loop(name, norm_dim(index_max(0, sympy.sympify(hi) - lo)), body, start=lo)

    if nchw_memory and C >= TRANSPOSE_TILE:
        # a transpose per row (channels x columns -> columns x channels) in blocks of channels:
        # each column writes one line of the copy, and the block's input lines stay in L1 (a
        # whole-channel loop per column, or a column loop per channel, misses on one side); the
        # columns in tiles of T, so that the emitter transposes T x T tiles in registers
        T = TRANSPOSE_TILE
        first, whole = pw, norm_dim(floor_div(sympy.sympify(inside), T, lw.known))
        left = norm_dim(sympy.sympify(inside) - whole * T)

        def channels(r, ct, j):
            lw.loop("c", tile_extent(T, C, T * ct), lambda c: copy(r, j, T * ct + c))

        def columns(r, ct):
            lw.loop("jt", whole, lambda jt: lw.loop("j", T, lambda j: channels(r, ct, first + T * jt + j)))
            if left != 0:
                lw.loop("j", left, lambda j: channels(r, ct, j), start=norm_dim(first + whole * T))
        span("r", lambda r: lw.loop("ct", -(-C // T), lambda ct: columns(r, ct)))
        return
    if nchw_memory and isinstance(C, int):
        # an NCHW image of few channels (an RGB stem): per column, its C values in turn, written
        # out (no loop over c). Columns innermost stored with a stride of C (scatters on AVX-512);
        # a loop over c inside the columns' loop LLVM unrolled whole, then SLP-vectorised at length
        # (+0.3 s of compile). The CNN b16 stem: 152 -> 130 us on a Zen 4, 179 -> 169 us compiled
        # for a Zen 3 (AVX2) on the same machine, with no more compile time
        span("r", lambda r: span("j", lambda j: [copy(r, j, c) for c in range(C)]))
        return
    order = "rcj" if C < NHWC_MIN_CHANNEL_RUN or nchw_memory else "rjc"

    def nest(level, at):
        if level == 3:
            copy(at["r"], at["j"], at["c"])
            return
        span(order[level], lambda v: nest(level + 1, {**at, order[level]: v}))
    nest(0, {})


def _loops(lw, names, extents, body):
    """A loop nest, outermost first; `body` gets one loop variable per name."""
    def nest(level, bound):
        if level == len(names):
            body(*bound)
            return
        lw.loop(names[level], extents[level], lambda v: nest(level + 1, (*bound, v)))
    nest(0, ())


def _tile_rows(OH, OW) -> int:
    if not isinstance(OW, int):
        return 1
    return max(1, CONV_TILE_POSITIONS // OW)


def _conv_tiles(lw, op, T, N, groups, OH, OW, body, tile_rows=None, epilogue: bool = True):
    """Parallel loop over (image, group, tile of output rows); `body(q, n, g, first_row, rows)`
    emits the tile's computation, then the epilogue covers its block of the output (unless the
    body's GEMM applied it in registers: `epilogue=False`)."""
    tile_rows = tile_rows or _tile_rows(OH, OW)
    tiles = norm_dim(sympy.ceiling(sympy.sympify(OH) / tile_rows))
    oc_g = _conv_weight_dims(op)[0] // groups

    def tile(q):
        n, g, t = decompose(lw.known, q, [N, groups, tiles])
        first = tile_rows * t
        count = tile_extent(tile_rows, OH, first) if tiles != 1 else OH
        body(q, n, g, first, count)
        if not epilogue:
            return
        channels, rows, cols = (g * oc_g, oc_g), (first, count), (0, OW)
        _epilogue(lw, [(n, 1), rows, cols, channels] if op.attrs["layout"] == "nhwc" else
                  [(n, 1), channels, rows, cols])
    lw.loop("p", norm_dim(N * groups * tiles), tile, parallel=True)


ATTENTION_ROWS = 64     # query rows per attention tile
# parallel work items an attention wants at least (batch entries times groups of query tiles, each
# group packing K^T and V once): the runtime's threads are not known when it compiles, but by
# default it runs one a usable core, so this machine's count (2 to 8). With 4 heads at 128 tokens,
# 8 items packed each head twice: BERT-small's attention 0.20 -> 0.18 ms at 2 items (1 thread).
ATTENTION_PARALLEL = min(8, max(2, len(os.sched_getaffinity(0))))


def sdpa(lw, op):
    """scaled_dot_product_attention per (batch entry, group of tiles of query rows): K^T and V
    packed once per group, then for each tile: scores = scale * Q K^T by GEMM into scratch, masked
    softmax of each row in place but for the division by the row's sum, out = P V by GEMM, and
    each row of out divided by its sum (Ev products a row, where P's rows would take S)."""
    _require_f32(op, op.operands[:3])
    q, k, v = op.operands[:3]
    mask = op.operands[3] if len(op.operands) > 3 else None
    T = _raw_buffer(lw, op)
    lw.materialized[id(op.result)] = lambda idx: Load(T, idx)
    *batch, L, E = q.type.shape
    S, Ev = k.type.shape[-2], v.type.shape[-1]
    # torch's default scale 1/sqrt(E); for a dynamic E, computed at run time and applied to the logits
    scale = op.attrs["scale"] if op.attrs["scale"] is not None else 1 / math.sqrt(E) if isinstance(E, int) else None
    logit_scale = const(scale, DType.f32) if scale is not None else call("rsqrt", Cast(Index(E), DType.f32))
    tiles = norm_dim(sympy.ceiling(sympy.sympify(L) / ATTENTION_ROWS))
    n_batch = norm_dim(sympy.Mul(*batch))
    # K^T and V packed in panels per group of tiles (the panel GEMM: no alpha, the scale goes into
    # the logits), read through the views in front of them; else read by the GEMM from memory.
    # Queries behind views are copied a tile at a time, as the first GEMM's A.
    packed = _packs_keys_and_values(op)
    groups = _tile_groups(batch, tiles) if packed else tiles
    per_group = norm_dim(sympy.ceiling(sympy.sympify(tiles) / groups))
    items = norm_dim(n_batch * groups)
    scores = lw.scratch(DType.f32, [items, ATTENTION_ROWS, S])
    k_panels = _runtime_panels(lw, items, E, S) if packed else None
    v_panels = _runtime_panels(lw, items, S, Ev) if packed else None
    q_rows = None if id(q) in lw.inputs else lw.scratch(DType.f32, [items, ATTENTION_ROWS * E])
    norms = lw.scratch(DType.f32, [items, ATTENTION_ROWS])     # 1 / each row's sum of weights

    def group(p):
        b, g = decompose(lw.known, p, [n_batch, groups])
        batch_idx = decompose(lw.known, b, batch)
        kt = vp = None
        if packed:
            kt = _pack(lw, k_panels, p, lambda e, j: lw.value(k, batch_idx + [j, e]), E, S)
            vp = _pack(lw, v_panels, p, lambda s, j: lw.value(v, batch_idx + [s, j]), S, Ev)
        lw.loop("t", tile_extent(per_group, tiles, g * per_group),
                lambda t: tile(p, b, batch_idx, g * per_group + t, kt, vp))

    def tile(p, b, batch_idx, t, kt, vp):
        first = ATTENTION_ROWS * t
        rows = tile_extent(ATTENTION_ROWS, L, first) if tiles != 1 else L
        scores_at = BufRef(scores, p * ATTENTION_ROWS * S)
        # causal: no row of the tile sees a key past its last row; those scores are not computed
        keys = norm_dim(index_min(S, first + rows)) if op.attrs["is_causal"] else S
        if q_rows is None:
            q_at = BufRef(lw.inputs[id(q)], (b * L + first) * E)
        else:
            lw.loop("r", rows, lambda r: lw.loop("e", E, lambda e: lw.emit(
                Store(q_rows, [p, r * E + e], lw.value(q, batch_idx + [first + r, e])))))
            q_at = BufRef(q_rows, p * ATTENTION_ROWS * E)
        if kt is None:
            lw.emit(Gemm(scores_at, q_at, BufRef(lw.inputs[id(k)], b * S * E), rows, keys, E, E, E, S, trans_b=True,
                         alpha=1.0 if scale is None else scale))
        else:
            lw.emit(Gemm(scores_at, q_at, kt, rows, keys, E, E, 0, S, b_panels=k_panels.shape[-1]))

        def row(r):
            i = first + r

            def logit(j):
                s = Load(scores, [p, r, j])
                if kt is not None or scale is None:
                    s = call("mul", s, logit_scale)
                keep = None
                if op.attrs["is_causal"]:
                    keep = call("le", Index(j), Index(i))
                if mask is not None:
                    m = lw.value(mask, broadcast_index(batch_idx + [i, j], list(batch) + [L, S], mask.type.shape))
                    if mask.type.dtype == DType.bool:
                        keep = m if keep is None else call("and", keep, m)
                    else:
                        s = call("add", s, cast(m, DType.f32))
                return s if keep is None else call("select", keep, s, Const(-math.inf, DType.f32))
            read = logit
            if op.attrs["is_causal"] or mask is not None:
                # mask the row in place first: a masked select inside the max reduction becomes a
                # conditional update that LLVM does not vectorise
                lw.loop("j", keys, lambda j: lw.emit(Store(scores, [p, r, j], logit(j))))
                read = lambda j: Load(scores, [p, r, j])   # noqa: E731
            top = lw.reduce("max", [("j", 0, keys)], lambda jv: read(jv[0]), DType.f32)
            # A fully masked row (max = -inf) attends to nothing: torch's sdpa gives zeros, softmax
            # NaN (masked_rows = "nan": exp(-inf - -inf) is NaN, and so is all that follows)
            zero = const(0.0, DType.f32)
            nan_rows = op.attrs["masked_rows"] == "nan"
            if not nan_rows:
                top = lw.let(call("select", call("eq", top, Const(-math.inf, DType.f32)), zero, top), "top")

            def unnormalised(jv):   # exp(logit - max), kept in the scores row for the scaling pass
                e = lw.let(call("exp_ftz", call("sub", read(jv[0]), top)), "e")
                lw.emit(Store(scores, [p, r, jv[0]], e))
                return e
            total = lw.reduce("sum", [("j", 0, keys)], unnormalised, DType.f32)
            inv = call("div", const(1.0, DType.f32), total)
            # the weights stay unnormalised: the product's rows are scaled instead (Ev, not S, of them)
            lw.emit(Store(norms, [p, r], inv if nan_rows else call("select", call("eq", total, zero), zero, inv)))
        lw.loop("r", rows, row)
        out_at = BufRef(T, (b * L + first) * Ev)
        if vp is None:
            lw.emit(Gemm(out_at, scores_at, BufRef(lw.inputs[id(v)], b * S * Ev), rows, Ev, keys, S, Ev, Ev))
        else:
            W = v_panels.shape[-1]
            if keys == S:
                lw.emit(Gemm(out_at, scores_at, vp, rows, Ev, S, S, 0, Ev, b_panels=W))
            else:   # a panel's rows are S apart: one product per panel, over its first `keys` rows
                for pp in range(-(-Ev // W)):
                    lw.emit(Gemm(BufRef(T, out_at.offset + W * pp), scores_at, BufRef(vp.buf, vp.offset + pp * S * W),
                                 rows, min(W, Ev - W * pp), keys, S, 0, Ev, b_panels=W))
        lw.loop("r", rows, lambda r: lw.loop("e", Ev, lambda e: lw.emit(Store(
            T, batch_idx + [first + r, e], call("mul", Load(T, batch_idx + [first + r, e]), Load(norms, [p, r]))))))
        _epilogue(lw, [(i, 1) for i in batch_idx] + [(first, rows), (0, Ev)])
    lw.loop("p", items, group, parallel=True)


def _tile_groups(batch: list, tiles: int) -> int:
    """Groups of one batch entry's query tiles that pack K^T and V apiece: one (each packs once per
    batch entry) where the batch entries (heads included) give ATTENTION_PARALLEL work items, else
    more, to keep the threads busy. Until 2026-12-02 every tile packed its own (12 packings per head
    at 750 tokens: attention ran at half of eager's speed there)."""
    known = math.prod(d for d in batch if isinstance(d, int))
    return max(1, min(tiles, -(-ATTENTION_PARALLEL // known)))


def conv2d(lw, op):
    return {"gemm": conv2d_gemm, "implicit": conv2d_implicit, "im2col": conv2d_im2col,
            "depthwise": conv2d_depthwise, "columns": conv2d_columns}[conv_algorithm(op)](lw, op)


TOPK_COLUMNS = 16  # the rows a topk along another dim than the last copies out together


def _down_columns(X: Buffer, d: int, least: int) -> bool:
    """Whether a fold or selection along dim `d` of input X goes a tile of its last dim's columns
    at a time: `d` is not X's last dim, X is row-major, and its rows have at least `least` elements
    (or a count known only at run time)."""
    last = X.shape[-1]
    return d != X.rank - 1 and X.strides is None and not (isinstance(last, int) and last < least)


def argtopk(lw, op):
    """Each row along `dim`, in parallel, goes to the runtime's topk (`TopK`), which writes the
    indices of its first k elements; the group's epilogue then runs over them."""
    x, r = op.operands[0], op.result
    if x.type.dtype not in TOPK_DTYPES:
        raise CuvilUnsupportedOpError(op.name, detail=f"the runtime's topk reads "
                                      f"{', '.join(d.value for d in TOPK_DTYPES)}, got {x.type} (cast it first)")
    X = lw.inputs[id(x)]
    T = lw.outputs[id(r)][1] if id(r) in lw.outputs else lw.scratch(DType.i64, r.type.shape)
    lw.materialized[id(r)] = lambda idx: Load(T, idx)
    d = op.attrs["dim"]
    n, kept = x.type.shape[d], r.type.shape[d]
    k = op.attrs["k"] if op.attrs["order"] == "kthvalue" else kept     # (kthvalue's: the k-th alone)
    others = [s for a, s in enumerate(x.type.shape) if a != d]
    # Along a dim other than the last of a row-major input, TOPK_COLUMNS neighbouring rows are
    # first copied out as contiguous rows (a transpose: each line of the input read once), which
    # the runtime then walks in order (in place, each element was a row of the input apart)
    last = x.type.shape[-1]
    columns = _down_columns(X, d, TOPK_COLUMNS)
    tiles = norm_dim(sympy.ceiling(sympy.sympify(last) / TOPK_COLUMNS))
    parallel = others[:-1] + [tiles] if columns else others
    items = norm_dim(sympy.Mul(*parallel))
    rows = lw.scratch(X.dtype, [items, TOPK_COLUMNS, n]) if columns else None

    def topk(dst_at, src: BufRef, stride):
        lw.emit(TopK(BufRef(T, T.offset(dst_at)[0]), src, n, stride, k, T.element_strides()[d],
                     largest=op.attrs["largest"], order=op.attrs["order"]))

    def row(p):
        idx = decompose(lw.known, p, parallel)
        if not columns:
            first = idx[:d] + [0] + idx[d:]
            topk(first, BufRef(X, X.offset(first)[0]), X.element_strides()[d])
            _epilogue(lw, [(i, 1) for i in idx[:d]] + [(0, kept)] + [(i, 1) for i in idx[d:]])
            return
        *kept_idx, t = idx
        start = TOPK_COLUMNS * t
        width = tile_extent(TOPK_COLUMNS, last, start)

        def at(i, c):
            return kept_idx[:d] + [i] + kept_idx[d:] + [start + c]
        lw.loop("i", n, lambda i: lw.loop("col", width, lambda c: lw.emit(Store(rows, [p, c, i], Load(X, at(i, c))))))
        lw.loop("col", width, lambda c: topk(at(0, c), BufRef(rows, rows.offset([p, c, 0])[0]), 1))
        _epilogue(lw, [(i, 1) for i in kept_idx[:d]] + [(0, kept)] + [(i, 1) for i in kept_idx[d:]] + [(start, width)])
    lw.loop("p", items, row, parallel=True)


def grouped_matmul(lw, op):
    """A mixture of experts' grouped product: each expert in a parallel iteration, a Gemm over its
    rows, whose first row and count it reads from `offsets` (sizes known at run time, named by
    scalars: `scalar_index` symbols of `Let`s, clamped to the rows); the last expert also zeroes the
    rows past its own (none, unless some row has no expert). Then the group's epilogue over them."""
    rows, weight, offsets = op.operands
    _require_f32(op, [rows, weight])
    R, W, O = (lw.inputs[id(v)] for v in op.operands)
    T = _raw_buffer(lw, op)
    lw.materialized[id(op.result)] = lambda idx: Load(T, idx)
    S, K = rows.type.shape
    E, _, N = weight.type.shape

    def expert(e):
        i64 = DType.i64
        first = call("gt", Index(e), Const(0, i64))
        start = scalar_index(lw.let(cast(Load(O, [e - 1], mask=first, other=Const(0, O.dtype)), i64), "start").name)
        end = scalar_index(lw.let(cast(Load(O, [e]), i64), "end").name)
        # offsets out of order or past the rows are clamped, as the eager loop's slices are
        start = sympy.Min(sympy.Max(start, 0), S)
        end = sympy.Min(sympy.Max(end, start), S)
        lw.emit(Gemm(BufRef(T, start * N), BufRef(R, start * K), BufRef(W, e * K * N), end - start, N, K, K, N, N))
        tail = (S - end) * (sympy.floor(e / (E - 1)) if isinstance(E, int) and E > 1 else 1)
        lw.loop("r", tail, lambda r: lw.loop("j", N, lambda j: lw.emit(Store(T, [end + r, j], Const(0.0, DType.f32)))),
                start=0)
        _epilogue(lw, [(start, end - start + tail), (0, N)])
    lw.loop("e", E, expert, parallel=True)


def index_put(lw, op):
    """`x[index] = values` (or `+=`): x copied to the result, then the indices in order, each
    writing (or adding) its row of values at the row it names. In order, so the last of repeated
    indices wins as in torch's CPU loop, and the cost is one pass over x and one over values (a
    comparison of every index with every row would cost their product). The row is a scalar read
    at run time (`Let`), negative ones counted from the end; a row outside x makes the row loop's
    extent 0 (its address clamped into x all the same), and fails the call as torch raises."""
    x, index, values = op.operands
    T = _raw_buffer(lw, op, x.type.dtype)
    lw.materialized[id(op.result)] = lambda idx: Load(T, idx)
    I = lw.inputs[id(index)]
    R, *rest = x.type.shape
    names = [f"c{d}" for d in range(len(rest))]
    _loops(lw, ["r", *names], [R, *rest], lambda *idx: lw.emit(Store(T, list(idx), cast(lw.value(x, list(idx)), T.dtype))))
    i64 = DType.i64

    def put(i):
        given = lw.let(cast(Load(I, [i]), i64), "row")
        row = lw.let(call("select", call("lt", given, Const(0, i64)), call("add", given, Index(R)), given), "row")
        holds = lw.let(call("and", call("ge", row, Const(0, i64)), call("lt", row, Index(R))), "in")
        lw.check(holds, index_outside(op, 0, R, -R))
        inside = lw.let(cast(holds, i64), "inside")
        at = sympy.Min(sympy.Max(scalar_index(row.name), 0), sympy.sympify(R) - 1)

        def element(*cols):
            v = lw.value(values, [i, *cols])
            if op.attrs["accumulate"]:
                v = call("add", cast(Load(T, [at, *cols]), v.dtype), v)
            lw.emit(Store(T, [at, *cols], cast(v, T.dtype)))
        lw.loop("k", scalar_index(inside.name), lambda _: _loops(lw, names, rest, element))
    lw.loop("i", index.type.shape[0], put)
    _epilogue(lw, [(0, d) for d in x.type.shape])


def _log_add_exp(a, b):
    """log(exp(a) + exp(b)) without overflow: the larger plus log1p(exp(smaller - larger)); an
    infinite larger or a -inf smaller is the answer itself (their difference would be NaN)."""
    hi, lo = call("max", a, b), call("min", a, b)
    exact = call("or", call("eq", lo, Const(-math.inf, a.dtype)), call("eq", hi, Const(math.inf, a.dtype)))
    return call("select", exact, hi, call("add", hi, call("log1p", call("exp", call("sub", lo, hi)))))


def _takes_place(which: str, x, best):
    """torch.cummax/cummin's rule: x replaces the best so far when it is at least as large (small),
    or NaN (so a NaN stays, and an equal value moves the index on)."""
    return call("or", call("ge" if which == "max" else "le", x, best), call("ne", x, x))


# the running folds: (the fold of the previous result and x, or the extreme it tracks)
SCAN_COLUMNS = 64        # the rows a scan along another dim than the last folds together
SCAN_MIN_COLUMNS = 8     # fewer: one row at a time (their strided reads share cache lines)
# the rows a scan along the last dim folds together: a 512-bit vector of its running values (16 of
# f32, 8 of i64: with 16 of i64 the step stayed a loop of two vectors, its values kept in memory)
SCAN_ROW_BYTES = 64
SCANS = {"cuvil.cumsum": lambda a, x: call("add", a, x), "cuvil.cumprod": lambda a, x: call("mul", a, x),
         "cuvil.logcumsumexp": _log_add_exp,
         "cuvil.cummax": "max", "cuvil.cummin": "min", "cuvil.cumargmax": "max", "cuvil.cumargmin": "min"}


def scan(lw, op):
    """A running fold along `dim`, each row in order in one parallel iteration: element i is the
    fold of element i-1's result, read back from the buffer it was stored to (LLVM keeps it in a
    register), and x[i]. A cummax/cummin index carries the extreme in a scratch row beside it.
    Then the group's epilogue runs over the row."""
    x, r = op.operands[0], op.result
    X = lw.inputs[id(x)]
    T = lw.outputs[id(r)][1] if id(r) in lw.outputs else lw.scratch(r.type.dtype, r.type.shape)
    fold, indices = SCANS[op.name], op.name.startswith("cuvil.cumarg")
    dtype = compute_dtype(x.type.dtype if indices else r.type.dtype)
    # a float cumsum runs compensated: the running sum and its rounding errors, each on a chain of
    # its own (ATen sums in f64 on CPU; a plain f32 sum of 10^4 terms was 40x less accurate)
    compensated = op.name == "cuvil.cumsum" and dtype.is_float
    if x.type.rank == 0:
        lw.materialized[id(r)] = lambda idx: Load(T, idx)
        lw.emit(Store(T, [], cast(Load(X, []), T.dtype)))
        if indices:
            lw.emit(Store(T, [], Const(0, DType.i64)))
        _epilogue(lw, [])
        return
    d = op.attrs["dim"]
    n = x.type.shape[d]
    others = [s for a, s in enumerate(x.type.shape) if a != d]
    # Along a dim other than the last of a row-major input, the folds of SCAN_COLUMNS neighbouring
    # rows go together: each step a loop over them, which reads and writes contiguous runs (one
    # row at a time read a float per cache line, a row of the input apart: cumsum over dim 0).
    # Along the last dim, a vector of rows goes together the same way, through copies transposed in
    # registers: each step is then one vector over the rows (one row at a time waited on each
    # step's latency, a compensated float sum's four additions). Integer steps take a cycle: the
    # copies would cost more than they save (int64 cumsum of [64, 1216] 2.9x the time)
    columns = _down_columns(X, d, SCAN_MIN_COLUMNS)
    row_tile = SCAN_ROW_BYTES // dtype.itemsize
    rows = not columns and dtype.is_float and _across_rows(X, d, n, others, row_tile)
    tile = SCAN_COLUMNS if columns else row_tile
    parallel = others[:-1] + [norm_dim(sympy.ceiling(sympy.sympify(others[-1]) / tile))] if columns or rows \
        else others
    items = norm_dim(sympy.Mul(*parallel))
    # the fold's buffers: its input, running values (and errors) and results, in x's shape, or,
    # across rows, as [item, step, row of the tile], the running values then in one row per item,
    # rewritten at each step (LLVM keeps them in registers: a row per step kept them in memory,
    # each step waiting on the store before)
    across = [items, n, row_tile] if rows else None
    source = lw.scratch(X.dtype, across) if rows else X
    running = [items, 1, row_tile] if rows else x.type.shape
    carry = T if T.dtype == dtype and not indices and not compensated and not rows else lw.scratch(dtype, running)
    error = lw.scratch(dtype, running) if compensated else None
    result = lw.scratch(T.dtype, across) if rows else T
    lw.materialized[id(r)] = lambda idx: Load(T if indices or compensated or rows else carry, idx)

    def row(p):
        idx = decompose(lw.known, p, parallel)
        step_over = lambda body: body       # noqa: E731
        region_last = []
        if columns or rows:
            first_column, col = tile * idx[-1], loop_var("col")
            width = tile_extent(tile, others[-1], first_column)
            lw.known[col] = (sympy.Integer(0), sympy.Integer(tile - 1))
            kept = idx[:-1]
            idx, region_last = kept + [first_column + col], [(first_column, width)]
            step_over = lambda body: lambda i: lw.loop("col", width, lambda _: body(i))     # noqa: E731
        if rows:
            _transposed_copy(lw, source, lambda i, c: [p, i, c], X, lambda i, c: kept + [first_column + c, i],
                             n, width, rows_outer=False)

        def at(i):
            return [p, i, col] if rows else idx[:d] + [i] + idx[d:]

        def running_at(i):      # where step i's running values are
            return [p, 0, col] if rows else at(i)

        def keep(i, value, final: bool):
            """Step i's running value, and across rows its result where `final` (else the fold
            stores one)."""
            if rows and final:
                value = lw.let(value, "acc")
                lw.emit(Store(result, at(i), cast(value, result.dtype)))
            lw.emit(Store(carry, running_at(i), value))

        def first(i):
            keep(i, cast(Load(source, at(i)), dtype), not (compensated or indices))
            if compensated:
                lw.emit(Store(error, running_at(i), Const(0.0, dtype)))
                lw.emit(Store(result, at(i), cast(Load(carry, running_at(i)), result.dtype)))
            if indices:
                lw.emit(Store(result, at(i), Const(0, DType.i64)))

        def step(i):
            v, before = lw.let(cast(Load(source, at(i)), dtype), "x"), Load(carry, running_at(i - 1))
            if compensated:
                _compensated_sum_step(lw, carry, error, result, at, running_at, i, v)
            elif isinstance(fold, str):
                take = lw.let(_takes_place(fold, v, before), "take")
                keep(i, call("select", take, v, before), not indices)
                if indices:
                    lw.emit(Store(result, at(i), call("select", take, Index(i), Load(result, at(i - 1)))))
            else:
                keep(i, fold(before, v), True)
        lw.loop("i", index_min(n, 1), step_over(first))
        lw.loop("i", norm_dim(index_max(sympy.sympify(n) - 1, 0)), step_over(step), start=1)
        if rows:
            _transposed_copy(lw, T, lambda i, c: kept + [first_column + c, i], result, lambda i, c: [p, i, c],
                             n, width, rows_outer=True)
            _epilogue(lw, [(i, 1) for i in kept] + region_last + [(0, n)])
            return
        kept = idx[:-1] if columns else idx
        _epilogue(lw, [(i, 1) for i in kept[:d]] + [(0, n)] + [(i, 1) for i in kept[d:]] + region_last)
    lw.loop("p", items, row, parallel=True)


def _across_rows(X: Buffer, d: int, n, others: list, tile: int) -> bool:
    """Whether a fold along the last dim of a row-major X goes `tile` rows at a time: there are
    that many rows, each of a tile's elements at least (or counts known only at run time). Fewer
    rows leave the vector's lanes idle and the transposed copies' tiles partial: 3 rows of 1000
    ran 1.8x the time of one row at a time."""
    return d == X.rank - 1 and X.rank > 1 and X.strides is None and \
        not (isinstance(others[-1], int) and others[-1] < tile) and \
        not (isinstance(n, int) and n < TRANSPOSE_TILE)


def _transposed_copy(lw, dst: Buffer, dst_at, src: Buffer, src_at, n, width, rows_outer: bool) -> None:
    """dst[dst_at(i, c)] = src[src_at(i, c)] for i < n, c < width, in tiles of TRANSPOSE_TILE x
    TRANSPOSE_TILE that the emitter transposes in registers (`transpose_tile`): the tile's outer
    loop runs along the contiguous dim of the source, its inner one along that of the destination
    (c with `rows_outer`, i otherwise)."""
    t = TRANSPOSE_TILE

    def tiles(ti, tc):
        i_loop = ("ia", tile_extent(t, n, t * ti))
        c_loop = ("ic", tile_extent(t, width, t * tc))
        outer, inner = (c_loop, i_loop) if rows_outer else (i_loop, c_loop)

        def store(u, v):
            i, c = (v, u) if rows_outer else (u, v)
            lw.emit(Store(dst, dst_at(t * ti + i, t * tc + c), cast(Load(src, src_at(t * ti + i, t * tc + c)),
                                                                     dst.dtype)))
        lw.loop(outer[0], outer[1], lambda u: lw.loop(inner[0], inner[1], lambda v: store(u, v)))
    lw.loop("ti", norm_dim(sympy.ceiling(sympy.sympify(n) / t)), lambda ti: lw.loop(
        "tc", norm_dim(sympy.ceiling(sympy.sympify(width) / t)), lambda tc: tiles(ti, tc)))


def _compensated_sum_step(lw, S, E, T, at, running_at, i, x) -> None:
    """Neumaier's running sum: S[i] = S[i-1] + x rounded, E[i] = E[i-1] + that rounding's error
    (S and E at `running_at`), T[i] = S[i] + E[i] (`reductions.neumaier_add`)."""
    s, e, ok = neumaier_add(lw, Load(S, running_at(i - 1)), Load(E, running_at(i - 1)), x)
    e = lw.let(e, "e")
    lw.emit(Store(S, running_at(i), s))
    lw.emit(Store(E, running_at(i), e))
    lw.emit(Store(T, at(i), cast(call("select", ok, call("add", s, e), s), T.dtype)))


WINDOW_OPS = {"cuvil.max_pool2d": max_pool2d, "cuvil.avg_pool2d": avg_pool2d,
              "cuvil.adaptive_avg_pool2d": adaptive_avg_pool2d, "cuvil.adaptive_max_pool2d": adaptive_max_pool2d,
              "cuvil.conv2d": conv2d_direct}
LIBRARY = {"cuvil.linear": linear, "cuvil.matmul": matmul, "cuvil.conv2d": conv2d, "cuvil.sdpa": sdpa,
           "cuvil.argtopk": argtopk, "cuvil.grouped_matmul": grouped_matmul,
           "cuvil.index_put": index_put, **dict.fromkeys(SCANS, scan)}


def gathered_operands(op: Operation) -> list:
    """The operands of a GEMM-based op that are views it can read through: an im2col convolution
    gathers its input element by element (not through BLAS), attention copies its tile of
    queries and packs its keys and values into panels element by element, and so does a batched
    matmul with its operands, so a permute, reshape or split in front of them costs nothing
    (attention's heads of a joint QKV projection). Computed producers stay out: the gather reads
    each element kh*kw times, the packing once per tile of query rows."""
    if op.name == "cuvil.conv2d" and conv_algorithm(op) in ("im2col", "implicit", "depthwise", "columns"):
        candidates = [op.operands[0]]
    elif op.name == "cuvil.sdpa" and _packs_keys_and_values(op):
        candidates = list(op.operands[:3])
    elif op.name == "cuvil.matmul" and _packs_batched_right_sides(op):
        candidates = list(op.operands[:2])
    else:
        return []
    return [x for x in candidates if not x.is_arg and x.owner.has_tag("view")]


def _packs_batched_right_sides(op: Operation) -> bool:
    """Whether a batched matmul (both operands matrices, the right-hand one batched) packs its
    right-hand sides at run time."""
    a, b = op.operands
    return a.type.rank > 1 and b.type.rank > 2 and _packs_at_run_time(a.type.shape[-2], b.type.shape[-1])


def _packs_keys_and_values(op: Operation) -> bool:
    """Whether attention packs K^T and V in panels per tile (static sizes, enough query rows)."""
    q, k, v = op.operands[:3]
    L, S, Ev = q.type.shape[-2], k.type.shape[-2], v.type.shape[-1]
    return _packs_at_run_time(L, S) and _packs_at_run_time(L, Ev)


def classify(op: Operation) -> str | None:
    """window, library, or None for ops this module does not lower."""
    if op.name == "cuvil.conv2d":
        return "window" if conv_algorithm(op) == "direct" else "library"
    if op.name in WINDOW_OPS:
        return "window"
    if op.name in LIBRARY:
        return "library"
    return None
