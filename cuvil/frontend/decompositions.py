"""Cuvil's own decompositions: ops with no row in the ATen table, written in ops that have one
(`run_decompositions` traces them into the graph, after torch.export's default ones).

- `aten.histc` with a given range: each value's bin compared with every bin and counted (a
  histogram of few bins, such as a mixture of experts' tokens per expert).
- `aten.scatter` (of a value or of a tensor) and `aten.scatter_add` of a static index that fits
  in the input (torch's rule): each position along `dim` compared with every index (the cost
  is their product: meant for few positions), over the part of the input the index reaches, padded to the input's sizes (a router's `scatter(-1, top, -inf)`).
  The index goes through `cuvil::check_index` first: one outside the dim matches no position,
  and would write nothing where torch raises. `aten.scatter_reduce` (sum, prod, mean, amax, amin,
  with or without the input's own values) the same way, each position's reduction over the
  values whose index names it.
- `aten.grid_sampler_2d` (`F.grid_sample`: deformable attention in Mask2Former, Deformable DETR):
  bilinear or nearest, with zero or border padding, as gathers along the flattened image of each
  corner's index, computed once per sample point and shared by the channels, its weight 0 where
  the corner lies outside; bicubic and reflection through torch's own decomposition
  (`torch._decomp`, which torch.export's default table leaves out), which computes every
  channel's indices.
- `transformers::grouped_mm_fallback`: a mixture of experts' grouped product (transformers'
  default `grouped_mm` experts on a CPU), rows sorted by expert and `offs` the running count of
  each expert's rows: Cuvil's own `cuvil::grouped_mm`, imported as `cuvil.grouped_matmul` (one GEMM
  per expert over its rows, their count read at run time; `library.grouped_matmul`).
"""
from __future__ import annotations

import math
import sys

import torch
from torch._decomp import decomposition_table as torch_decompositions

aten = torch.ops.aten


def histc(x: torch.Tensor, bins: int = 100, min: float = 0.0, max: float = 0.0) -> torch.Tensor:
    if min == max:      # the range is the data's own: a value torch.export would read as a size
        return NotImplemented

    flat = x.reshape(-1)
    # torch's CPU kernel: the bin is (x - min) * bins / (max - min) truncated, and x == max falls in the last
    at = ((flat - min) * (bins / (max - min))).floor().clamp(0, bins - 1).long()
    inside = (flat >= min) & (flat <= max)
    hits = (at.unsqueeze(-1) == torch.arange(bins, device=x.device)) & inside.unsqueeze(-1)
    return hits.sum(0).to(x.dtype)


def _names_along(index: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    """[..., j, t, ...]: whether index[..., j, ...] is t (an axis of `size` after `dim`)."""
    shape = [1] * (index.dim() + 1)
    shape[dim + 1] = size
    return index.unsqueeze(dim + 1) == torch.arange(size, device=index.device).reshape(shape)


def _scatter_form(x: torch.Tensor, dim: int, index: torch.Tensor) -> int | None:
    """`dim` made positive where the index fits in x but along `dim` (torch's rule), else None."""
    if x.dim() == 0 or index.dim() != x.dim():
        return None
    dim = dim % x.dim()
    fits = all(isinstance(index.shape[d], int) and index.shape[d] <= x.shape[d] for d in range(x.dim()) if d != dim)
    return dim if fits else None


def _to_input(part: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """`part` (over the part of x the index reaches: its extent along every dim) padded with 0 to
    x's sizes."""
    pads = [p for d in reversed(range(x.dim())) for p in (0, x.shape[d] - part.shape[d])]
    return torch.nn.functional.pad(part, pads) if any(pads) else part


def scatter_value(x: torch.Tensor, dim: int, index: torch.Tensor, value) -> torch.Tensor:
    if (dim := _scatter_form(x, dim, index)) is None:
        return NotImplemented
    index = torch.ops.cuvil.check_index(index, x.shape[dim], dim, "scatter")
    hit = _to_input(_names_along(index, dim, x.shape[dim]).any(dim).to(torch.int8), x)
    return torch.where(hit > 0, torch.scalar_tensor(value, dtype=x.dtype), x)


def scatter_src(x: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    if (dim := _scatter_form(x, dim, index)) is None:
        return NotImplemented
    index = torch.ops.cuvil.check_index(index, x.shape[dim], dim, "scatter")
    src = src[tuple(slice(0, n) for n in index.shape)].to(x.dtype)
    order = torch.arange(1, index.shape[dim] + 1, device=x.device).reshape([-1] + [1] * (x.dim() - dim))
    last = (_names_along(index, dim, x.shape[dim]) * order).amax(dim)          # 0: no index names it
    taken = torch.gather(src, dim, (last - 1).clamp(min=0))
    return torch.where(_to_input(last, x) > 0, _to_input(taken, x), x)


def scatter_add(x: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    if (dim := _scatter_form(x, dim, index)) is None:
        return NotImplemented
    index = torch.ops.cuvil.check_index(index, x.shape[dim], dim, "scatter_add")
    src = src[tuple(slice(0, n) for n in index.shape)].to(x.dtype)
    names = _names_along(index, dim, x.shape[dim])
    return x + _to_input(torch.where(names, src.unsqueeze(dim + 1), torch.zeros((), dtype=x.dtype)).sum(dim), x)


SCATTER_REDUCTIONS = ("sum", "prod", "mean", "amax", "amin")


def scatter_reduce(x: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor, reduce: str,
                   include_self: bool = True) -> torch.Tensor:
    """Each position's reduction over the src values whose index names it (TAPAS's segment
    minimum: `scatter_reduce(..., "amin", include_self=False)`), combined with x's value there when
    `include_self`; positions no index names keep x's. The mean of an integer tensor (torch
    divides with rounding down) is left to the refusal."""
    if (dim := _scatter_form(x, dim, index)) is None or reduce not in SCATTER_REDUCTIONS \
            or (reduce == "mean" and not x.is_floating_point()):
        return NotImplemented
    index = torch.ops.cuvil.check_index(index, x.shape[dim], dim, "scatter_reduce")
    src = src[tuple(slice(0, n) for n in index.shape)].to(x.dtype)
    names = _names_along(index, dim, x.shape[dim])
    spread = src.unsqueeze(dim + 1)
    count = names.sum(dim)
    if reduce in ("sum", "mean", "prod"):
        fill = torch.ones((), dtype=x.dtype) if reduce == "prod" else torch.zeros((), dtype=x.dtype)
        picked = torch.where(names, spread, fill)
        part = picked.prod(dim) if reduce == "prod" else picked.sum(dim)
    else:
        info = torch.finfo(x.dtype) if x.is_floating_point() else torch.iinfo(x.dtype)
        extreme = -math.inf if reduce == "amax" else math.inf
        fill = torch.scalar_tensor(extreme if x.is_floating_point() else (info.min if reduce == "amax" else info.max),
                                   dtype=x.dtype)
        picked = torch.where(names, spread, fill)
        part = picked.amax(dim) if reduce == "amax" else picked.amin(dim)
    if include_self:
        mine = x[tuple(slice(0, n) for n in count.shape)]
        part = {"sum": lambda: mine + part, "prod": lambda: mine * part, "mean": lambda: (mine + part) / (count + 1),
                "amax": lambda: torch.maximum(mine, part), "amin": lambda: torch.minimum(mine, part)}[reduce]()
    elif reduce == "mean":
        part = part / count.clamp(min=1)
    return torch.where(_to_input((count > 0).to(torch.int8), x) > 0, _to_input(part, x), x)


def grid_sampler_2d(x: torch.Tensor, grid: torch.Tensor, interpolation_mode: int = 0, padding_mode: int = 0,
                    align_corners: bool = False) -> torch.Tensor:
    if interpolation_mode not in (0, 1) or padding_mode not in (0, 1):     # bicubic, reflection
        return torch_decompositions[aten.grid_sampler_2d.default](x, grid, interpolation_mode, padding_mode,
                                                                  align_corners)
    n, c, h, w = x.shape
    ix, iy = (_unnormalize(grid[..., i], size, align_corners, padding_mode) for i, size in ((0, w), (1, h)))
    if interpolation_mode == 1:         # nearest: torch rounds half to even
        corners = [(ix.round(), iy.round(), None)]
    else:
        x0, y0 = ix.floor(), iy.floor()
        x1, y1 = x0 + 1, y0 + 1
        corners = [(x0, y0, (x1 - ix) * (y1 - iy)), (x1, y0, (ix - x0) * (y1 - iy)),
                   (x0, y1, (x1 - ix) * (iy - y0)), (x1, y1, (ix - x0) * (iy - y0))]
    flat = x.reshape(n, c, h * w)
    out = None
    for cx, cy, weight in corners:
        inside = (cx >= 0) & (cx < w) & (cy >= 0) & (cy < h)
        at = (cy.clamp(0, h - 1) * w + cx.clamp(0, w - 1)).to(torch.int64).reshape(n, 1, -1)
        weight = inside.to(x.dtype) if weight is None else torch.where(inside, weight, 0.0)
        term = torch.gather(flat, 2, at.expand(n, c, at.shape[2])) * weight.reshape(n, 1, -1)
        out = term if out is None else out + term
    return out.reshape(n, c, *grid.shape[1:3])


def _unnormalize(coord: torch.Tensor, size: int, align_corners: bool, padding_mode: int) -> torch.Tensor:
    """A grid coordinate in [-1, 1] as a pixel coordinate (torch's `grid_sampler_compute_source_index`)."""
    pixel = (coord + 1) / 2 * (size - 1) if align_corners else ((coord + 1) * size - 1) / 2
    return pixel.clamp(0, size - 1) if padding_mode == 1 else pixel


@torch.library.custom_op("cuvil::check_index", mutates_args=())
def check_index_op(index: torch.Tensor, size: int, dim: int, of: str) -> torch.Tensor:
    """`cuvil.check_index` as a torch op: `index` (a copy: a custom op's result may not alias its
    operand), each value in [0, size), or IndexError as torch's `of` raises."""
    if index.numel() and not (0 <= int(index.min()) and int(index.max()) < size):
        raise IndexError(f"{of}: an index outside [0, {size - 1}] in dim {dim}")
    return index.clone()


@check_index_op.register_fake
def _check_index_shape(index, size, dim, of):
    return torch.empty_like(index)


@torch.library.custom_op("cuvil::grouped_mm", mutates_args=())
def grouped_mm_op(rows: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """`cuvil.grouped_matmul` as a torch op, for the decomposition to trace: each expert's rows
    (offsets[e-1] to offsets[e]) times its matrix, and 0 past the last offset."""
    out = rows.new_zeros(rows.shape[0], weight.shape[2])
    start = 0
    for e, end in enumerate(offsets.tolist()):
        out[start:end] = rows[start:end] @ weight[e]
        start = end
    return out


@grouped_mm_op.register_fake
def _grouped_mm_shape(rows, weight, offsets):
    return rows.new_empty(rows.shape[0], weight.shape[2])


def grouped_mm(rows: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    return torch.ops.cuvil.grouped_mm(rows, weight.contiguous(), offs)


def cuvil_decompositions() -> dict:
    table = {aten.histc.default: histc, aten.scatter.value: scatter_value,
             aten.scatter.src: scatter_src, aten.scatter_add.default: scatter_add,
             aten.scatter_reduce.two: scatter_reduce,
             aten.grid_sampler_2d.default: grid_sampler_2d}
    if "transformers" in sys.modules and hasattr(torch.ops, "transformers") \
            and hasattr(torch.ops.transformers, "grouped_mm_fallback"):
        table[torch.ops.transformers.grouped_mm_fallback.default] = grouped_mm
    return table
