"""Built-in op declarations. Importing this package registers every `cuvil.*` op."""
from __future__ import annotations

from ..core import OP_REGISTRY, OpDef
from . import elementwise, layout, nn, reduction, source  # noqa: F401  (registration)


def ops_with_tag(tag: str) -> list[type[OpDef]]:
    """Every registered op (built-in or user) carrying `tag`, sorted by name."""
    return sorted((op for op in OP_REGISTRY.values() if tag in op.tags), key=lambda op: op.name)


def builtin_ops() -> list[type[OpDef]]:
    """The `cuvil.*` ops, sorted by name."""
    return sorted((op for op in OP_REGISTRY.values() if op.name.startswith("cuvil.")), key=lambda op: op.name)
