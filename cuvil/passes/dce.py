"""The `dce` pass: removes unused pure ops and the module constants nothing references any more."""
from __future__ import annotations

from dataclasses import dataclass

from ..ir.core import Module
from .base import ModulePass
from .registry import register_pass
from .rewrite import Rewriter


@register_pass
@dataclass(frozen=True)
class DCEPass(ModulePass):
    """Remove unused pure ops and unreferenced module constants (dead code elimination).

    The return op always stays; user ops are removed only if they carry the `pure` tag."""
    name = "dce"
    priority = 120
    requires = frozenset({"verified"})

    def run(self, module: Module) -> dict:
        ops = 0
        for fn in module.functions.values():
            rewriter = Rewriter(module, fn)
            for op in reversed(list(fn.ops)):   # users before producers: one sweep clears chains
                ops += rewriter.erase_dead(op) if rewriter.alive(op) else 0
        used = {op.attrs["name"] for fn in module.functions.values() for op in fn.ops if op.name == "cuvil.const"}
        unused = [name for name in module.constants if name not in used]
        for name in unused:
            del module.constants[name]
        return {"ops-removed": ops, "constants-removed": len(unused)}
