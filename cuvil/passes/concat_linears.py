"""The `concat-linears` pass: linears that read the same input with constant weights (attention's
query, key and value projections; a gated MLP's gate and up projections) become one linear over
their weights stacked along the output features, then a `cuvil.split` of its result:

    q = linear(x, Wq, bq); k = linear(x, Wk, bk); v = linear(x, Wv, bv)
    ->  q, k, v = split(linear(x, [Wq; Wk; Wv], [bq; bk; bv]), dim = -1, sizes = [out_q, out_k, out_v])

One GEMM of the summed width runs nearer the GEMM's peak than several narrow ones and reads x
once; the split is a view, folded into the indexing of what reads each piece. The stacked weight
and bias are new module constants named after the originals
(`enc.attn.{query,key,value}.weight`); the old ones stay in `module.constants` until `dce`
removes the unreferenced ones. Runs before `layout`, which then packs the stacked weight.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch

from ..ir.core import Function, Module, Operation
from ..ir.types import TensorType
from .base import ModulePass
from .fold_constants import add_constant
from .registry import register_pass
from .rewrite import Rewriter, producer


@register_pass
@dataclass(frozen=True)
class ConcatLinearsPass(ModulePass):
    """Stack the weights of linears that share their input into one linear and a split.

    A linear joins when its weight (and bias) are constants with data that nothing else reads, and
    its weight is not yet packed; the statistics count the linears that share an input with
    another but were left alone, by reason."""
    name = "concat-linears"
    priority = 84
    requires = frozenset({"verified"})

    def run(self, module: Module) -> dict:
        skipped: Counter = Counter()
        groups = joined = 0
        reads = Counter(_storage(module, op.attrs["name"]) for fn in module.functions.values() for op in fn.ops
                        if op.name == "cuvil.const" for _ in op.result.uses)
        for fn in module.functions.values():
            rw = Rewriter(module, fn)
            for linears in _sharing_an_input(fn):
                members = []
                for op in linears:
                    reason = _refusal(module, op, reads)
                    if reason is None:
                        members.append(op)
                    else:
                        skipped[reason] += 1
                if len(members) < 2:
                    skipped["alone"] += len(members)
                    continue
                with torch.no_grad():
                    _concat(rw, members)
                groups += 1
                joined += len(members)
        return {"groups": groups, "linears": joined, "skipped": dict(sorted(skipped.items()))}


def _sharing_an_input(fn: Function) -> list[list[Operation]]:
    """The linears of `fn` grouped by their input, in program order; groups of two or more."""
    by_input: dict[int, list[Operation]] = {}
    for op in fn.ops:
        if op.name == "cuvil.linear":
            by_input.setdefault(id(op.operands[0]), []).append(op)
    return [ops for ops in by_input.values() if len(ops) > 1]


def _refusal(module: Module, op: Operation, reads: Counter) -> str | None:
    """Why linear `op` cannot join (a statistics key), or None. `reads`: how many ops read each
    constant's memory, through any of the const ops that name it (torch.export lifts a tensor
    that a function reads twice as two constants of one storage)."""
    if op.attrs["out_features"] is not None:
        return "packed"
    for v in op.operands[1:]:
        p = producer(v)
        if p is None or p.name != "cuvil.const":
            return "not-constant"
        if p.attrs["name"] not in module.constants:
            return "no-data"
        if reads[_storage(module, p.attrs["name"])] != 1:
            return "shared-weight"      # stacking would store it twice
    return None


def _storage(module: Module, name: str):
    data = module.constants.get(name)
    return name if data is None else data.untyped_storage().data_ptr()


def _concat(rw: Rewriter, linears: list[Operation]) -> None:
    first = linears[0]
    x, dtype = first.operands[0], first.operands[1].type.dtype
    weights = [rw.module.constants[producer(op.operands[1]).attrs["name"]] for op in linears]
    stacked_w = torch.cat([w.to(weights[0].dtype) for w in weights])
    operands = [x, _const(rw, first, _joint_name([producer(op.operands[1]).attrs["name"] for op in linears]),
                          stacked_w, dtype)]
    if any(len(op.operands) == 3 for op in linears):     # a missing bias is zeros
        biases = [rw.module.constants[producer(op.operands[2]).attrs["name"]] if len(op.operands) == 3
                  else torch.zeros(w.shape[0], dtype=stacked_w.dtype) for op, w in zip(linears, weights)]
        names = [producer(op.operands[2]).attrs["name"] if len(op.operands) == 3
                 else f"{producer(op.operands[1]).attrs['name'].removesuffix('.weight')}.bias" for op in linears]
        operands.append(_const(rw, first, _joint_name(names), torch.cat(biases), dtype))
    joint = rw.create(first, "cuvil.linear", operands, loc=first.loc).result
    pieces = rw.create(first, "cuvil.split", [joint], {"dim": joint.type.rank - 1,
                                                       "sizes": [w.shape[0] for w in weights]}, loc=first.loc)
    for op, piece in zip(linears, pieces.results):
        rw.replace(op, [piece])


def _const(rw: Rewriter, before: Operation, stem: str, data: torch.Tensor, dtype):
    name = add_constant(rw.module, stem, data)
    return rw.create(before, "cuvil.const", attrs={"name": name},
                     result_types=[TensorType(dtype, tuple(data.shape))], loc=before.loc).result


def _joint_name(names: list[str]) -> str:
    """`a.{q,k,v}.weight` for `a.q.weight`, `a.k.weight` and `a.v.weight`: the dotted parts all
    names share at the start and at the end, the rest of each listed between them."""
    parts = [n.split(".") for n in names]
    head = 0
    while all(len(p) > head + 1 for p in parts) and len({p[head] for p in parts}) == 1:
        head += 1
    tail = 0
    while all(len(p) > head + tail + 1 for p in parts) and len({p[-1 - tail] for p in parts}) == 1:
        tail += 1
    middles = [".".join(p[head:len(p) - tail]) for p in parts]
    return ".".join([*parts[0][:head], "{" + ",".join(middles) + "}", *(parts[0][len(parts[0]) - tail:] if tail else [])])
