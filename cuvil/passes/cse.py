"""The `cse` pass: merges ops that compute the same thing from the same operands."""
from __future__ import annotations

from dataclasses import dataclass

from ..ir.core import Function, Module, Operation
from .base import ModulePass
from .registry import register_pass
from .rewrite import Rewriter, is_pure


@register_pass
@dataclass(frozen=True)
class CSEPass(ModulePass):
    """Merge ops that compute the same value (common subexpression elimination).

    Ops with equal name, operands and attributes are merged into the first one. `aggressive` also
    merges operand-less ops (duplicate consts, literals, fulls)."""
    name = "cse"
    priority = 110
    requires = frozenset({"verified"})
    aggressive: bool = False

    def run(self, module: Module) -> dict:
        merged = sum(self._run_function(module, fn) for fn in module.functions.values())
        return {"merged": merged}

    def _run_function(self, module: Module, fn: Function) -> int:
        rewriter = Rewriter(module, fn)
        seen: dict[tuple, Operation] = {}
        merged = 0
        for op in list(fn.ops):
            if not is_pure(op) or (not op.operands and not self.aggressive):
                continue
            key = _key(module, op)
            first = seen.setdefault(key, op)
            if first is not op:
                rewriter.replace(op, first.results)
                merged += 1
        return merged


def _key(module: Module, op: Operation) -> tuple:
    types = tuple(repr(r.type) for r in op.results)
    memory = _const_memory(module, op)
    if memory is not None:
        return op.name, memory, types
    operands = [id(v) for v in op.operands]
    if op.has_tag("commutative"):
        operands.sort()
    attrs = tuple(sorted((k, repr(v)) for k, v in op.attrs.items()))
    return op.name, tuple(operands), attrs, types


def _const_memory(module: Module, op: Operation) -> tuple | None:
    """Constants with different names are still one value when their data views the same memory
    the same way (tied weights), so a constant with data is keyed by its memory, not its name."""
    if op.name != "cuvil.const":
        return None
    t = module.constants.get(op.attrs["name"])
    if t is None:
        return None
    return t.data_ptr(), t.dtype, tuple(t.shape), t.stride(), t.storage_offset()
