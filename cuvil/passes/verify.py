"""The `verify` pass: checks the IR and establishes the "verified" condition."""
from __future__ import annotations

from dataclasses import dataclass

from ..ir.core import Module
from ..ir.verifier import verify
from .base import ModulePass
from .registry import register_pass


@register_pass
@dataclass(frozen=True)
class VerifyPass(ModulePass):
    """Check the IR: SSA order, op signatures, attributes and result types (never changes it)."""
    name = "verify"
    priority = 0
    provides = frozenset({"verified"})

    def run(self, module: Module) -> bool:
        verify(module)
        return False
