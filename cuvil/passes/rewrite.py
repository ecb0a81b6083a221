"""Local rewrites: a rewriter that edits one function safely, and a greedy driver that applies an
op-indexed table of patterns to a fixpoint (MLIR's greedy pattern rewrite, small).

A pattern is a function `pattern(op, rewriter) -> bool` that either leaves the IR alone and returns
False, or rewrites `op` through the rewriter and returns True.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Callable, Sequence

import torch

from ..errors import CuvilPassError
from ..ir.core import Builder, Function, Loc, Module, Operation, Value
from ..ir.types import TensorType, dims_equal

Pattern = Callable[[Operation, "Rewriter"], bool]

ANY_OP = "*"   # key of the patterns that apply to every op


def is_pure(op: Operation) -> bool:
    """Whether an unused op may be removed and two identical ones merged: every built-in op except
    the terminator; user ops only when they declare the `pure` tag."""
    if op.name == "cuvil.return":
        return False
    return op.name.startswith("cuvil.") or op.has_tag("pure")


def same_type(a: TensorType, b: TensorType) -> bool:
    return a.dtype == b.dtype and a.rank == b.rank and all(dims_equal(x, y) for x, y in zip(a.shape, b.shape))


def producer(v: Value) -> Operation | None:
    return None if v.is_arg else v.owner


def constant_data(module: Module, v: Value) -> torch.Tensor | None:
    """The value's data when it is a literal or a constant whose data the module holds."""
    op = producer(v)
    if op is None:
        return None
    if op.name == "cuvil.literal":
        return op.opdef.evaluate(op.attrs)
    if op.name == "cuvil.const":
        return module.constants.get(op.attrs["name"])
    return None


def splat_value(module: Module, v: Value) -> Any:
    """The scalar every element of `v` equals (a literal, a full, or a uniform constant), else None."""
    op = producer(v)
    if op is None:
        return None
    if op.name == "cuvil.full":
        return op.attrs["value"]
    data = constant_data(module, v)
    return None if data is None else uniform_value(data)


def uniform_value(t: torch.Tensor) -> Any:
    """The scalar all elements of `t` equal, bit for bit (+0.0 and -0.0 differ; NaN never matches), else None."""
    flat = t.reshape(-1)
    if not flat.numel():
        return None
    first = flat[0]
    same = flat == first
    if t.is_floating_point():
        same &= flat.signbit() == first.signbit()
    return first.item() if bool(same.all()) else None


class Rewriter:
    """Edits one function: creates ops before the op being rewritten, replaces values, and erases
    ops that become dead, keeping use lists consistent."""

    def __init__(self, module: Module, fn: Function):
        self.module, self.fn = module, fn
        self.erased: set[int] = set()      # `Operation.id`s: Python's id() of an erased op is reused
        self.created: list[Operation] = []

    def alive(self, op: Operation) -> bool:
        return op.id not in self.erased

    def create(self, before: Operation, name: str, operands: Sequence[Value] = (), attrs: dict | None = None,
               result_types: Sequence[TensorType] | None = None, loc: Loc | None = None) -> Operation:
        """A new op inserted just before `before`, with `before`'s location unless given."""
        builder = Builder(self.fn, self.fn.ops.index(before))
        op = builder.create(name, operands, attrs, loc or before.loc, result_types)
        self.created.append(op)
        return op

    def replace(self, op: Operation, values: Sequence[Value]) -> None:
        """Make every use of `op`'s results use `values` instead, then erase `op` and any producer
        that became dead. The new values must have the same types (or the rewrite would be wrong)."""
        if len(values) != len(op.results):
            raise CuvilPassError(f"rewrite of {op.name} gives {len(values)} values for {len(op.results)} results")
        for r, v in zip(op.results, values):
            if not same_type(r.type, v.type):
                raise CuvilPassError(f"rewrite of {op.name} would replace a {r.type} by a {v.type}")
        for r, v in zip(op.results, values):
            if v.name is None:
                v.name = r.name
            r.replace_all_uses_with(v)
        self.erase_dead(op)

    def erase_dead(self, op: Operation) -> int:
        """Erase `op` if it is unused and pure, then its producers that become unused; the count erased."""
        count = 0
        work = [op]
        while work:
            op = work.pop()
            if not self.alive(op) or not is_pure(op) or any(r.uses for r in op.results):
                continue
            producers = [p for p in map(producer, op.operands) if p is not None]
            self.fn.erase(op)
            self.erased.add(op.id)
            count += 1
            work.extend(producers)
        return count


def apply_patterns(module: Module, patterns: dict[str, Sequence[Pattern]], max_sweeps: int = 20) -> Counter:
    """Apply patterns (keyed by op name, or ANY_OP) over every function until none applies.
    Returns how often each pattern fired, by pattern name."""
    fired: Counter = Counter()
    generic = list(patterns.get(ANY_OP, ()))
    for fn in module.functions.values():
        rewriter = Rewriter(module, fn)
        for _ in range(max_sweeps):
            if not _sweep(fn, rewriter, patterns, generic, fired):
                break
        else:
            raise CuvilPassError(f"rewrite patterns on @{fn.name} did not converge in {max_sweeps} sweeps "
                                 f"(fired: {dict(fired)}); two patterns probably undo each other")
    return fired


def _sweep(fn: Function, rewriter: Rewriter, patterns: dict[str, Sequence[Pattern]], generic: list[Pattern],
           fired: Counter) -> bool:
    changed = False
    for op in list(fn.ops):
        if not rewriter.alive(op):
            continue
        for pattern in (*patterns.get(op.name, ()), *generic):
            if pattern(op, rewriter):
                fired[pattern.__name__] += 1
                changed = True
                break
    return changed
