"""A structural fingerprint of a module, to tell whether a pass changed it without printing it.

Two modules have equal fingerprints when they have the same functions, argument types, symbols,
ops (name, operands by position, attributes, result types, locations) and constant tensors.
Value names and op ids are ignored: they are printing hints and identities, not meaning.
"""
from __future__ import annotations

from ..ir.core import Function, Module


def fingerprint(module: Module) -> tuple:
    functions = tuple(_function_key(fn) for fn in module.functions.values())
    # Constants by identity: a pass that swaps in a new tensor or writes into one in place changes it.
    constants = tuple((name, id(t), _version(t)) for name, t in module.constants.items())
    return functions, constants


def _version(t) -> int:
    # Tensors made under torch.inference_mode have no version counter (and cannot be written
    # in place outside it); identity alone tells them apart.
    return -1 if t.is_inference() else t._version


def _function_key(fn: Function) -> tuple:
    number = {id(v): i for i, v in enumerate(fn.args)}
    ops = []
    for op in fn.ops:
        operands = tuple(number.get(id(v), -1) for v in op.operands)
        for r in op.results:
            number[id(r)] = len(number)
        attrs = tuple(sorted((k, repr(v)) for k, v in op.attrs.items()))
        ops.append((op.name, operands, attrs, tuple(repr(r.type) for r in op.results), str(op.loc)))
    args = tuple(repr(v.type) for v in fn.args)
    return fn.name, args, tuple(sorted(fn.symbols.items())), tuple(ops)
