"""The `shape-infer` pass: recomputes every result type from the argument types, op by op."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import CuvilVerifyError
from ..ir.core import Module, Operation
from ..ir.types import TensorType, symbol_ranges
from .base import ModulePass
from .registry import register_pass


@register_pass
@dataclass(frozen=True)
class ShapeInferPass(ModulePass):
    """Re-infer symbolic shapes and dtypes of every op in order from the function arguments."""
    name = "shape-infer"
    priority = 10
    provides = frozenset({"shapes-inferred"})

    def run(self, module: Module) -> dict:
        ops = changed = 0
        for fn in module.functions.values():
            for op in fn.ops:
                with symbol_ranges(fn.symbols):
                    types = None if _has_explicit_types(op) else _infer(op)
                if types is None:
                    continue
                ops += 1
                changed += _update(op, types)
        return {"ops": ops, "result-types-changed": changed}


def _has_explicit_types(op: Operation) -> bool:
    # constants carry their type; the terminator has no results
    return op.opdef.explicit_result_types or not op.results


def _infer(op: Operation) -> list[TensorType] | None:
    """The inferred result types, or None for a user op that declares no inference."""
    try:
        types = op.opdef.infer([v.type for v in op.operands], op.semantic_attrs)
    except NotImplementedError:
        return None
    except ValueError as e:
        raise CuvilVerifyError(f"shape inference failed: {e}", op) from None
    if len(types) != len(op.results):
        raise CuvilVerifyError(f"shape inference gives {len(types)} result types for {len(op.results)} results", op)
    return types


def _update(op: Operation, types: list[TensorType]) -> int:
    changed = 0
    for r, t in zip(op.results, types):
        if r.type != t:
            r.type = t
            changed += 1
    return changed
