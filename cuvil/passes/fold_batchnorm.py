"""The `fold-batchnorm` pass: an inference batch norm right after a conv2d (or a linear, for
BatchNorm1d; or a 1-d convolution, a conv2d behind a squeeze) is an affine map per output channel,
so it folds into that op's weight and bias:

    s  = gamma / sqrt(var + eps)
    w' = w * s (per output channel, dim 0 of the weight)
    b' = (b - mean) * s + beta

The new weight and bias are computed in float64 at compile time and stored as new module constants
(`conv1.weight.bn_folded`, `conv1.bias.bn_folded`); the batch norm disappears. The old weights stay
in `module.constants` until `dce` removes the unreferenced ones.

A float32 batch norm with constant statistics that no such op feeds (DenseNet's, after a
concatenation; a pre-activation block's) becomes that affine map itself, `x * s + t` with `s` and
`t` (`norm1.bn_scale`, `norm1.bn_shift`, shaped to broadcast along dim 1) computed the same way:
eager's CPU inference computes it so too, and an elementwise multiply and add fuse, and carry a
layout, where a batch norm reads its channels at dim 1.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch

from ..ir.core import Module, Operation, Value
from ..ir.ops.layout import RESHAPES
from ..ir.types import DType, TensorType, dims_equal
from .base import ModulePass
from .fold_constants import add_constant
from .registry import register_pass
from .rewrite import Rewriter, producer

FOLDABLE_PRODUCERS = frozenset({"cuvil.conv2d", "cuvil.linear"})


@register_pass
@dataclass(frozen=True)
class FoldBatchNormPass(ModulePass):
    """Fold inference batch norms into the conv2d (or linear) that feeds them.

    Folds only when the batch norm is the producer's only user and every weight, bias and statistic
    is a constant with data; the statistics count every batch norm left alone, by reason."""
    name = "fold-batchnorm"
    priority = 95
    requires = frozenset({"verified"})

    def run(self, module: Module) -> dict:
        skipped: Counter = Counter()
        folded = affine = 0
        for fn in module.functions.values():
            rw = Rewriter(module, fn)
            for bn in [op for op in fn.ops if op.name == "cuvil.batch_norm"]:
                reason = _refusal(module, bn)
                with torch.no_grad():   # weights may require grad; folding records no autograd graph
                    if reason is None:
                        _fold(rw, bn)
                        folded += 1
                    elif _constant_statistics(module, bn) and bn.result.type.dtype == DType.f32:
                        _to_affine(rw, bn)
                        affine += 1
                    else:
                        skipped[reason] += 1
        return {"folded": folded, "affine": affine, "skipped": dict(sorted(skipped.items()))}


def _producer(bn: Operation) -> tuple[Operation | None, Operation | None]:
    """The op whose result `bn` normalises, and the view between them that keeps the batch and the
    channels as dims 0 and 1 (a 1-d convolution's squeeze), if any."""
    p = producer(bn.operands[0])
    if p is None or p.name not in RESHAPES or len(p.result.uses) != 1:
        return p, None
    shape, viewed = p.operands[0].type.shape, p.result.type.shape
    keeps = len(shape) > 2 and len(viewed) > 2 and all(dims_equal(shape[i], viewed[i]) for i in (0, 1))
    return (producer(p.operands[0]), p) if keeps else (p, None)


def _refusal(module: Module, bn: Operation) -> str | None:
    """Why `bn` cannot be folded (a statistics key), or None."""
    p, _ = _producer(bn)
    if p is None or p.name not in FOLDABLE_PRODUCERS:
        return "not-after-conv-or-linear"
    if p.name == "cuvil.conv2d" and p.attrs["layout"] != "nchw":
        return "conv-not-nchw"          # batch norm's channels (dim 1) are not the conv's channels
    if p.name == "cuvil.linear" and p.attrs["out_features"] is not None:
        return "linear-packed"          # the weight is in panels (the layout pass runs later in O3)
    if p.name == "cuvil.linear" and p.result.type.rank != 2:
        return "linear-not-rank-2"      # batch norm's channels (dim 1) are not the linear's features
    if len(p.result.uses) != 1:
        return "producer-multi-use"
    return _constants_refusal(module, [*bn.operands[1:], *p.operands[1:]])


def _constants_refusal(module: Module, params: list[Value]) -> str | None:
    if any(producer(v) is None or producer(v).name != "cuvil.const" for v in params):
        return "not-constant"
    if any(producer(v).attrs["name"] not in module.constants for v in params):
        return "no-data"
    return None


def _constant_statistics(module: Module, bn: Operation) -> bool:
    return _constants_refusal(module, bn.operands[1:]) is None


def _data(rw: Rewriter, v: Value | None) -> torch.Tensor | None:
    return None if v is None else rw.module.constants[producer(v).attrs["name"]]


def _affine(rw: Rewriter, bn: Operation, b: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch norm as x * scale + shift per channel, in float64 (`b`: a bias added before it)."""
    mean, var, gamma, beta = (_data(rw, v) for v in (*bn.operands[1:], None, None)[:4])   # weight?, bias?
    f64 = torch.float64
    scale = torch.rsqrt(var.to(f64) + bn.attrs["eps"])
    if gamma is not None:
        scale = scale * gamma.to(f64)
    shift = -mean.to(f64) * scale
    if b is not None:
        shift = shift + b.to(f64) * scale
    if beta is not None:
        shift = shift + beta.to(f64)
    return scale, shift


def _to_affine(rw: Rewriter, bn: Operation) -> None:
    x = bn.operands[0]
    stem = producer(bn.operands[1]).attrs["name"].removesuffix(".running_mean")
    per_channel = [x.type.shape[1]] + [1] * (x.type.rank - 2)
    values = []
    for suffix, data in zip(("bn_scale", "bn_shift"), _affine(rw, bn)):
        name = add_constant(rw.module, f"{stem}.{suffix}", data.to(torch.float32).reshape(per_channel))
        values.append(rw.create(bn, "cuvil.const", attrs={"name": name},
                                result_types=[TensorType(x.type.dtype, tuple(per_channel))]).result)
    scaled = rw.create(bn, "cuvil.mul", [x, values[0]]).result
    rw.replace(bn, rw.create(bn, "cuvil.add", [scaled, values[1]]).results)


def _fold(rw: Rewriter, bn: Operation) -> None:
    p, view = _producer(bn)
    x, w_value, *b_value = p.operands
    w, b = _data(rw, w_value), _data(rw, b_value[0] if b_value else None)
    scale, shift = _affine(rw, bn, b)
    new_w = _scaled_rows(w, scale)

    w_name = producer(w_value).attrs["name"]
    b_stem = producer(b_value[0]).attrs["name"] if b_value else f"{w_name.removesuffix('.weight')}.bias"
    consts = [rw.create(bn, "cuvil.const", attrs={"name": add_constant(rw.module, f"{stem}.bn_folded", data)},
                        result_types=[TensorType(w_value.type.dtype, tuple(data.shape))], loc=p.loc).result
              for stem, data in [(w_name, new_w), (b_stem, shift.to(w.dtype))]]
    new = rw.create(bn, p.name, [x, *consts], dict(p.attrs), result_types=[p.result.type], loc=p.loc)
    if view is not None:
        new = rw.create(bn, view.name, new.results, dict(view.attrs), result_types=[view.result.type], loc=view.loc)
    rw.replace(bn, new.results)


def _scaled_rows(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """w * scale per output channel, each product in float64 and rounded once to w's dtype, in
    blocks of rows: float64 copies of a whole weight took 3x as long (new memory for each; ResNet-50
    folded in 0.1-0.17 s)."""
    out = torch.empty_like(w)
    rows = max(1, (1 << 18) // max(1, w[0].numel()))
    for a in range(0, w.shape[0], rows):
        block = w[a:a + rows].to(torch.float64) * scale[a:a + rows].reshape(-1, *[1] * (w.dim() - 1))
        out[a:a + rows] = block
    return out
