"""The graph-IR verifier: structure, SSA, attributes and types. Run after every pass.

`verify(module)` raises `CuvilVerifyError(message, op)` for the first problem it finds.
"""
from __future__ import annotations

from collections import Counter

import sympy

from ..errors import CuvilVerifyError
from .core import Attr, Function, Module, Operation, is_discardable, lookup_op
from .printer import attr_value_str
from .types import DType, TensorType, dims_equal, symbol_ranges, symbols_of


def verify(module: Module) -> None:
    for fn in module.functions.values():
        verify_function(fn, module)


def verify_function(fn: Function, module: Module) -> None:
    if not fn.ops or fn.ops[-1].name != "cuvil.return":
        raise CuvilVerifyError(f"function @{fn.name} does not end in cuvil.return",
                               fn.ops[-1] if fn.ops else None)
    declared = set(fn.symbols)
    for v in fn.args:
        _check_symbols(v.type, declared, fn, None, f"argument {_value_name(v)}")
    _check_ssa(fn)
    for op in fn.ops:
        _check_op(op, fn, module, declared)


# ----------------------------------------------------------------------------- structure

def _value_name(v) -> str:
    return f"%{v.name}" if v.name else ("argument" if v.is_arg else "result") + f" #{v.index}"


def _check_ssa(fn: Function) -> None:
    defined: set[int] = {id(v) for v in fn.args}
    expected_uses: dict[int, Counter] = {id(v): Counter() for v in fn.args}
    seen_ops: set[int] = set()
    for op in fn.ops:
        if id(op) in seen_ops:
            raise CuvilVerifyError(f"operation #{op.id} appears twice in @{fn.name}", op)
        seen_ops.add(id(op))
        if op.name == "cuvil.return" and op is not fn.ops[-1]:
            raise CuvilVerifyError("cuvil.return must be the last operation of the function", op)
        for i, v in enumerate(op.operands):
            if id(v) not in defined:
                raise CuvilVerifyError(f"operand {i} ({_value_name(v)}: {v.type}) is used before it is defined", op)
            expected_uses[id(v)][id(op)] += 1
        for i, r in enumerate(op.results):
            if r.owner is not op or r.index != i:
                raise CuvilVerifyError(f"result {i} does not point back to its operation", op)
            defined.add(id(r))
            expected_uses[id(r)] = Counter()
    ops_by_id = {id(op): op for op in fn.ops}
    for op in [None, *fn.ops]:
        for v in fn.args if op is None else op.results:
            actual = Counter(map(id, v.uses))
            if actual != expected_uses[id(v)]:
                _report_uses(v, actual, expected_uses[id(v)], ops_by_id, op)


def _report_uses(v, actual: Counter, expected: Counter, ops_by_id: dict, owner) -> None:
    stray = next((u for u in v.uses if actual[id(u)] > expected[id(u)]), None)
    if stray is not None:
        where = "" if id(stray) in ops_by_id else " (an operation not in the function)"
        raise CuvilVerifyError(f"use-list of {_value_name(v)} lists {stray.name} #{stray.id}{where} "
                               f"more often than it is an operand", owner)
    missing = next(ops_by_id[i] for i in expected if expected[i] > actual[i])
    raise CuvilVerifyError(f"use-list of {_value_name(v)} misses its use by {missing.name} #{missing.id}", owner)


# ----------------------------------------------------------------------------- attributes

def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_float(v) -> bool:
    return isinstance(v, float) or _is_int(v)


def _is_dim(v) -> bool:
    return _is_int(v) or (isinstance(v, sympy.Expr) and v.is_integer is not False)


def _is_list(v, item) -> bool:
    return isinstance(v, (list, tuple)) and all(map(item, v))


_KIND_CHECKS = {
    "int": _is_int,
    "float": _is_float,
    "bool": lambda v: isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "ints": lambda v: _is_list(v, _is_int),
    "floats": lambda v: _is_list(v, _is_float),
    "dims": lambda v: _is_list(v, _is_dim),
    "dtype": lambda v: isinstance(v, DType),
    "int?": lambda v: v is None or _is_int(v),
    "float?": lambda v: v is None or _is_float(v),
    "any": lambda v: isinstance(v, (bool, int, float)),
}


def attr_kind_ok(attr: Attr, value) -> bool:
    """Whether `value` is a well-formed attribute of kind `attr.kind`."""
    return _KIND_CHECKS[attr.kind](value)


def _check_attrs(op: Operation) -> None:
    declared = op.opdef.attrs
    for key, value in op.attrs.items():
        if is_discardable(key):
            try:
                attr_value_str(value)
            except TypeError as e:
                raise CuvilVerifyError(f"discardable attribute '{key}': {e}", op) from None
        elif key not in declared:
            known = ", ".join(declared) or "none"
            raise CuvilVerifyError(f"unknown attribute '{key}' (known: {known})", op)
    for key, attr in declared.items():
        if key not in op.attrs:
            raise CuvilVerifyError(f"missing attribute '{key}' ({attr.kind})", op)
        value = op.attrs[key]
        if not attr_kind_ok(attr, value):
            raise CuvilVerifyError(f"attribute '{key}' must be of kind {attr.kind}, got {value!r}", op)


# ----------------------------------------------------------------------------- types

def _check_symbols(t: TensorType, declared: set[str], fn: Function, op, what: str) -> None:
    for d in t.shape:
        undeclared = symbols_of(d) - declared
        if undeclared:
            raise CuvilVerifyError(f"{what} has type {t} with symbol {sorted(undeclared)[0]} "
                                   f"not declared in the symbols of @{fn.name}", op)


def _types_match(a: TensorType, b: TensorType) -> bool:
    return a.dtype == b.dtype and a.rank == b.rank and all(map(dims_equal, a.shape, b.shape))


def _check_op(op: Operation, fn: Function, module: Module, declared: set[str]) -> None:
    opdef = lookup_op(op.name)
    if opdef is None or opdef is not op.opdef:
        raise CuvilVerifyError(f"unknown op '{op.name}' (not registered)", op)
    lo, hi = opdef.operand_range()
    n = len(op.operands)
    if n < lo or (hi is not None and n > hi):
        expected = f"at least {lo}" if hi is None else (f"{lo}" if lo == hi else f"{lo} to {hi}")
        raise CuvilVerifyError(f"expects {expected} operands ({', '.join(opdef.operands)}), got {n}", op)
    _check_attrs(op)
    for key, attr in opdef.attrs.items():
        if attr.kind == "dims":
            undeclared = set().union(*(symbols_of(d) for d in op.attrs[key])) - declared
            if undeclared:
                raise CuvilVerifyError(f"attribute '{key}' uses symbol {sorted(undeclared)[0]} "
                                       f"not declared in the symbols of @{fn.name}", op)
    for i, r in enumerate(op.results):
        _check_symbols(r.type, declared, fn, op, f"result {i}")
    if not opdef.explicit_result_types:
        try:
            with symbol_ranges(fn.symbols):
                inferred = opdef.infer([v.type for v in op.operands], op.semantic_attrs)
        except ValueError as e:
            raise CuvilVerifyError(f"{op.name}: {e}", op) from None
        actual = [r.type for r in op.results]
        if len(inferred) != len(actual):
            raise CuvilVerifyError(f"has {len(actual)} results but its operands give {len(inferred)}", op)
        for i, (want, got) in enumerate(zip(inferred, actual)):
            if not _types_match(want, got):
                raise CuvilVerifyError(f"result {i} has type {got} but its operands give {want}", op)
    try:
        opdef.verify(op, module)
    except ValueError as e:
        raise CuvilVerifyError(f"{op.name}: {e}", op) from None
