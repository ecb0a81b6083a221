"""The `mixed-precision` pass: the numerics of `torch.autocast` in bf16 or fp16, by each op's
declared mixed-precision policy (`OpDef.amp`):

- `always` (linear, matmul, conv2d, sdpa): the float operands are rounded to the low dtype, the op
  accumulates in fp32, and its result is rounded;
- `follow` (elementwise ops, views, pools, ...): the result is rounded when every float operand of
  rank > 0 is already low, as torch's type promotion keeps bf16 with bf16 in bf16 (a rank-0 operand
  does not promote); a view's result needs no rounding;
- `never` (softmax, the norms, sums, ...): runs in fp32 on whatever it gets.

Rounding is a pair of casts, `cast(cast(x, bf16), f32)`: the graph keeps its fp32 types, the GEMMs
stay fp32 (OpenBLAS; this CPU has no bf16 arithmetic), and the weights' rounding folds at compile
time when `fold-constants` runs after this pass. So it shows what running the model in low precision
does to its results (the explorer's Summary reports the error against fp32 eager), but it does
not make the model faster here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..ir.core import Module, Operation, Value
from ..ir.types import DType
from .base import ModulePass
from .registry import register_pass
from .rewrite import Rewriter

SOURCE_OPS = frozenset({"cuvil.const", "cuvil.literal", "cuvil.full", "cuvil.arange"})


@register_pass
@dataclass(frozen=True)
class MixedPrecisionPass(ModulePass):
    """Round values to `dtype` where torch.autocast would compute in it: torch.autocast's numerics.

    Policies as in the module docstring. Statistics: ops run in low precision, by policy, and
    rounding casts inserted."""
    name = "mixed-precision"
    priority = 20
    requires = frozenset({"verified"})
    dtype: Literal["bf16", "f16"] = "bf16"

    def run(self, module: Module) -> dict:
        low = DType(self.dtype)
        counts = {"always": 0, "follow": 0, "roundings": 0}
        for fn in module.functions.values():
            rw = Rewriter(module, fn)
            rounded: set[int] = set()      # ids of values that hold low-precision numbers
            for op in list(fn.ops):
                if op.name in SOURCE_OPS or op.name == "cuvil.return":
                    continue
                policy = op.opdef.amp
                floats = [v for v in op.operands if v.type.dtype == DType.f32 and v.type.rank > 0]
                if policy == "always" and floats:
                    for i, v in enumerate(op.operands):
                        if v.type.dtype == DType.f32 and id(v) not in rounded:
                            op.set_operand(i, _round(rw, op, v, low))
                            counts["roundings"] += 1
                    counts["always"] += 1
                elif not (policy == "follow" and floats and all(id(v) in rounded for v in floats)):
                    continue
                else:
                    counts["follow"] += 1
                    if op.has_tag("view"):      # rearranges rounded values: nothing to round
                        rounded.update(id(r) for r in op.results)
                        continue
                for r in op.results:
                    if r.type.dtype == DType.f32:
                        rounded.add(id(_round_result(rw, op, r, low)))
                        counts["roundings"] += 1
        return counts


def _round(rw: Rewriter, before: Operation, v: Value, low: DType) -> Value:
    narrow = rw.create(before, "cuvil.cast", [v], {"dtype": low})
    return rw.create(before, "cuvil.cast", [narrow.result], {"dtype": DType.f32}).result


def _round_result(rw: Rewriter, op: Operation, r: Value, low: DType) -> Value:
    """Round `op`'s result `r` for all its users; the rounded value."""
    users = list(r.uses)
    after = rw.fn.ops[rw.fn.ops.index(op) + 1]
    rounded = _round(rw, after, r, low)
    for u in users:
        for i, o in enumerate(u.operands):
            if o is r:
                u.set_operand(i, rounded)
    return rounded
