"""The `fuse-attention` pass: attention written out op by op becomes one `cuvil.sdpa`.

    s = matmul(q, kT)           kT: k with its last two dims swapped (a permute)
    s = s / c  or  s * c        optional, c a scalar
    s = s + mask                optional, a float mask that broadcasts to the scores; or
    s = where(keep, s, -inf)    a bool one (`masked_fill(~keep, -inf)`, as nanoGPT writes it)
    out = matmul(softmax(s, dim=-1), v)
    ->  out = sdpa(q, permute(kT), v, mask, scale=1/c or c, masked_rows="nan")

Written out, the [..., L, S] scores go to memory twice (the first product's epilogue, then the
softmax kernel) and back twice; sdpa's kernel keeps a tile of query rows' scores in scratch
between its two products. The permute in front of k composes with kT's own (canonicalize), so
k is read through a view as before.

Each intermediate must have no other user (attention weights a model also returns stay written
out). The scale becomes sdpa's multiplication: s / c and s * (1/c) can differ in the last bit.
softmax of a row that is -inf throughout is NaN and sdpa's default is 0: the fused op keeps
softmax's NaN (`masked_rows = "nan"`). A constant mask that is exactly the causal one (0 on and
below the diagonal, -inf or the lowest float above; or a bool mask true on and below it, as torch's
own sdpa gets from Hugging Face's "sdpa" attention) becomes `is_causal`: the kernel then computes no
score above the diagonal.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import torch

from ..ir.core import Module, Operation, Value
from ..ir.types import DType, dims_equal
from .base import ModulePass
from .fold_constants import add_constant
from .registry import register_pass
from .rewrite import Rewriter, constant_data, producer, splat_value


@register_pass
@dataclass(frozen=True)
class FuseAttentionPass(ModulePass):
    """Rewrite matmul -> [scale] -> [+ mask] -> softmax -> matmul into one `cuvil.sdpa`, and an
    sdpa with a constant causal mask into one with `is_causal`.

    Statistics: `fused`, `causal` (sdpa ops whose mask was the causal one, fused here or imported),
    and the softmax-then-matmul pairs left alone, by reason."""
    name = "fuse-attention"
    priority = 83
    requires = frozenset({"verified"})

    def run(self, module: Module) -> dict:
        refused: Counter = Counter()
        fused = causal = 0
        for fn in module.functions.values():
            rw = Rewriter(module, fn)
            for op in list(fn.ops):
                if rw.alive(op) and op.name == "cuvil.sdpa":
                    causal += _mask_to_causal(rw, op)
                if not rw.alive(op) or op.name != "cuvil.matmul":
                    continue
                found = _match(module, op)
                if isinstance(found, str):
                    if found != "not-attention":
                        refused[found] += 1
                    continue
                causal += _fuse(rw, op, found)
                fused += 1
        return {"fused": fused, "causal": causal, "refused": dict(sorted(refused.items()))}


@dataclass
class Attention:
    q: Value
    kt: Value
    v: Value
    mask: Value | None
    scale: float
    masks_where_true: bool = False      # a bool mask that says where -inf goes, not what is kept


def _only_use(v: Value, user: Operation) -> bool:
    return len(v.uses) == 1 and v.uses[0] is user


def _match(module: Module, out: Operation) -> Attention | str:
    """The attention ending in matmul `out`, or why not (a statistics key; "not-attention" when the
    matmul does not read a softmax at all)."""
    probs, v = out.operands
    softmax = producer(probs)
    if softmax is None or softmax.name != "cuvil.softmax":
        return "not-attention"
    scores = softmax.operands[0]
    if softmax.attrs["dim"] != scores.type.rank - 1:
        return "softmax-not-over-keys"
    if not _only_use(probs, out):
        return "probabilities-used-elsewhere"
    chain, mask, scale, masks_where_true = softmax, None, 1.0, False
    s = scores
    step = producer(s)
    if step is not None and step.name == "cuvil.where":
        if not _only_use(s, chain):
            return "scores-used-elsewhere"
        cond, a, b = step.operands
        masks_where_true = splat_value(module, a) == -math.inf and a.type.rank == 0
        first = b if masks_where_true else a
        fill = a if masks_where_true else b
        if fill.type.rank != 0 or splat_value(module, fill) != -math.inf:
            return "mask-fill-not-minus-inf"
        if cond.type.dtype is not DType.bool or not _same_shape(first, s):
            return "mask-shape-or-dtype"
        mask, chain, s, step = cond, step, first, producer(first)
    elif step is not None and step.name == "cuvil.add":
        if not _only_use(s, chain):
            return "scores-used-elsewhere"
        a, b = step.operands
        first, mask = (a, b) if _scores_side(a) else (b, a)
        if mask.type.dtype is not scores.type.dtype or not _same_shape(first, s):
            return "mask-shape-or-dtype"
        chain, s, step = step, first, producer(first)
    if step is not None and step.name in ("cuvil.div", "cuvil.mul"):
        factor = step.operands[1] if step.name == "cuvil.div" or _scores_side(step.operands[0]) else step.operands[0]
        kept = step.operands[0] if factor is step.operands[1] else step.operands[1]
        c = splat_value(module, factor) if factor.type.rank == 0 else None
        if c is None or not _same_shape(kept, s):
            return "scale-not-a-scalar"
        if not _only_use(s, chain):
            return "scores-used-elsewhere"
        scale = 1.0 / float(c) if step.name == "cuvil.div" else float(c)
        if not math.isfinite(scale) or scale == 0.0:
            return "scale-not-a-scalar"
        chain, s, step = step, kept, producer(kept)
    if step is None or step.name != "cuvil.matmul":
        return "scores-not-a-product"
    if not _only_use(s, chain):
        return "scores-used-elsewhere"
    q, kt = step.operands
    if not all(t.type.dtype is DType.f32 for t in (q, kt, v)):
        return "not-f32"
    ranks = {q.type.rank, kt.type.rank, v.type.rank}
    if len(ranks) != 1 or not all(
            dims_equal(a, b) and dims_equal(a, c) for a, b, c in zip(q.type.shape[:-2], kt.type.shape, v.type.shape)):
        return "batch-dims-differ"
    return Attention(q, kt, v, mask, scale, masks_where_true)


def _scores_side(v: Value) -> bool:
    """Whether `v` is the scores' side of an add or product: a matmul's, or a scaling of one."""
    op = producer(v)
    if op is not None and op.name in ("cuvil.div", "cuvil.mul"):
        op = producer(op.operands[0]) or op
    return op is not None and op.name == "cuvil.matmul"


def _same_shape(a: Value, b: Value) -> bool:
    return a.type.rank == b.type.rank and all(map(dims_equal, a.type.shape, b.type.shape))


def _fuse(rw: Rewriter, out: Operation, a: Attention) -> bool:
    """Replace `out` by the sdpa of `a`; whether its mask was the causal one."""
    rank = a.kt.type.rank
    k = rw.create(out, "cuvil.permute", [a.kt], {"perm": [*range(rank - 2), rank - 1, rank - 2]}).result
    mask = _kept(rw, out, a.mask) if a.masks_where_true else a.mask
    causal = mask is not None and _is_causal(rw.module, mask, a.q.type.shape[-2], a.kt.type.shape[-1])
    operands = [a.q, k, a.v] + ([mask] if mask is not None and not causal else [])
    attrs = {"scale": a.scale, "is_causal": causal, "masked_rows": "nan"}
    fused = rw.create(out, "cuvil.sdpa", operands, attrs)
    rw.replace(out, [fused.result])
    return causal


def _kept(rw: Rewriter, before: Operation, masked: Value) -> Value:
    """The keys kept where `masked` says which get -inf: a new constant for a constant, else its
    logical_not."""
    data = constant_data(rw.module, masked)
    if data is None:
        return rw.create(before, "cuvil.logical_not", [masked]).result
    name = add_constant(rw.module, f"{producer(masked).attrs.get('name', 'mask')}.kept", ~data)
    return rw.create(before, "cuvil.const", attrs={"name": name}, result_types=[masked.type]).result


def _mask_to_causal(rw: Rewriter, op: Operation) -> bool:
    """An sdpa (torch's own, imported) whose mask is a constant causal one: the same without the
    mask, `is_causal`. Whether it was rewritten."""
    q, k, v, *mask = op.operands
    if not mask or not _is_causal(rw.module, mask[0], q.type.shape[-2], k.type.shape[-2]):
        return False
    fused = rw.create(op, "cuvil.sdpa", [q, k, v], {**op.attrs, "is_causal": True})
    rw.replace(op, [fused.result])
    return True


def _is_causal(module: Module, mask: Value, L, S) -> bool:
    """Whether `mask` is a constant that keeps exactly the keys at or before each query, over the
    whole [L, S] of the scores (it may have leading dims of 1): True there for a bool mask (torch's
    sdpa, Hugging Face's "sdpa" attention); for a float one 0 there and -inf or the lowest float
    elsewhere (Hugging Face's masks). Added to a row's finite scores, either lowest value weighs
    exactly 0 after softmax: the row's own key keeps its maximum finite, and exp(lowest - maximum)
    is 0 in f32."""
    data = constant_data(module, mask)
    if data is None or not isinstance(L, int) or not isinstance(S, int) or data.shape[-2:] != (L, S):
        return False
    if any(d != 1 for d in data.shape[:-2]):
        return False
    data = data.reshape(L, S)
    above = torch.ones(L, S, dtype=torch.bool).triu(1)
    if data.dtype == torch.bool:
        return torch.equal(data, ~above)
    lowest = (data == -math.inf) | (data == torch.finfo(data.dtype).min)
    return bool(torch.equal(lowest, above) and (data[~above] == 0).all())
