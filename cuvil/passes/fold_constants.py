"""The `fold-constants` pass: every subgraph that depends only on constants is evaluated once, at
compile time, with the ops' reference semantics, and the values it hands to the rest of the graph
become new constants (or literals and fulls when they are scalars or splats).

Unlike canonicalize's op-by-op folding, this evaluates a whole constant subgraph in one walk and
materialises only its frontier (the values that runtime ops read), so no intermediate constants are
created; `full` and `arange` count as sources too.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch

from ..errors import CuvilPassError
from ..ir.core import Function, Module, Operation, Value
from ..ir.types import TensorType
from .base import ModulePass
from .registry import register_pass
from .rewrite import Rewriter, is_pure, producer, uniform_value

SOURCE_OPS = frozenset({"cuvil.const", "cuvil.literal", "cuvil.full", "cuvil.arange"})


@register_pass
@dataclass(frozen=True)
class FoldConstantsPass(ModulePass):
    """Evaluate subgraphs that depend only on constants at compile time and replace them by constants.

    Sources are constants with data, literals, and fulls and aranges of static shape. A folded value
    becomes a literal (rank 0), a full (all elements equal) or a new module constant named after the
    constant it came from (`fc1.weight.permute`). Values over `max-bytes` are computed at run time."""
    name = "fold-constants"
    priority = 90
    requires = frozenset({"verified"})
    max_bytes: int = 1 << 26

    def run(self, module: Module) -> dict:
        stats: Counter = Counter()
        skipped: Counter = Counter()
        with torch.no_grad():   # weights may require grad; folding records no autograd graph
            for fn in module.functions.values():
                _FunctionFolder(module, fn, self.max_bytes, stats, skipped).run()
        return {"folded-ops": stats["folded-ops"], "new-constants": stats["new-constants"],
                "new-splats": stats["new-splats"], "bytes": stats["bytes"], "skipped": dict(sorted(skipped.items()))}


def add_constant(module: Module, stem: str, data: torch.Tensor) -> str:
    """Store `data` as a new module constant under a fresh name derived from `stem`; the name."""
    name, n = stem, 1
    while name in module.constants:
        name, n = f"{stem}.{n}", n + 1
    module.constants[name] = data.contiguous()
    return name


def _nbytes(t: TensorType) -> int:
    return t.numel() * t.dtype.itemsize


# Ops that only rearrange the elements of their operand (views, and copy).
def _rearranges(op: Operation) -> bool:
    return op.has_tag("view") or op.name == "cuvil.copy"


class _FunctionFolder:
    """Folding of one function: evaluate, choose what to materialise, rewrite."""

    def __init__(self, module: Module, fn: Function, max_bytes: int, stats: Counter, skipped: Counter):
        self.module, self.fn, self.max_bytes = module, fn, max_bytes
        self.stats, self.skipped = stats, skipped
        self.data: dict[Value, torch.Tensor] = {}   # compile-time constant values, evaluated
        self.lazy: set[Value] = set()              # literals, fulls and aranges, evaluated when folded into
        self.folded: list[Operation] = []          # non-source ops whose results are all in `data`
        self.is_folded: set[Operation] = set()
        self.kept: set[Operation] = set()          # folded ops that must still run

    def run(self) -> None:
        self._evaluate()
        if not self.folded:
            return
        position = {op: i for i, op in enumerate(self.fn.ops)}
        chosen = sorted(self._choose(), key=lambda v: (position[v.owner], v.index))
        rw = Rewriter(self.module, self.fn)
        for v in chosen:
            new = self._materialise(rw, v)
            if new.name is None:
                new.name = v.name
            v.replace_all_uses_with(new)
            rw.erase_dead(v.owner)      # and what computed it; unused folded ops elsewhere are dce's
        self.stats["folded-ops"] += sum(not rw.alive(op) for op in self.folded)

    # ------------------------------------------------------------------ evaluation

    def _evaluate(self) -> None:
        no_data: set[Value] = set()     # values that would be constant if every constant had data
        for op in self.fn.ops:
            if op.name in SOURCE_OPS:
                self._source(op, no_data)
                continue
            if not op.operands or not is_pure(op):
                continue
            if not all(v in self.data or v in self.lazy or v in no_data for v in op.operands):
                continue
            if any(v in no_data for v in op.operands):
                self.skipped["no-data"] += 1
                no_data.update(op.results)
            elif not all(r.type.is_static for r in op.results):
                self.skipped["symbolic-shape"] += 1
            else:
                self._fold(op)

    def _source(self, op: Operation, no_data: set[Value]) -> None:
        if op.name == "cuvil.const":
            t = self.module.constants.get(op.attrs["name"])
            if t is None:
                no_data.add(op.result)
            else:
                self.data[op.result] = t
        elif op.result.type.is_static:
            self.lazy.add(op.result)

    def _tensor(self, v: Value) -> torch.Tensor:
        if v not in self.data:
            self.data[v] = v.owner.opdef.evaluate(v.owner.semantic_attrs)
        return self.data[v]

    def _fold(self, op: Operation) -> None:
        try:
            out = op.opdef.evaluate(op.semantic_attrs, *map(self._tensor, op.operands))
        except NotImplementedError:
            self.skipped["no-reference-semantics"] += 1
            return
        except Exception as e:   # the op fails on these constants; running it would fail the same way
            where = f" at {op.loc}" if op.loc is not None else ""
            raise CuvilPassError(f"fold-constants: evaluating {op.name}{where} on its constant operands "
                                 f"failed: {type(e).__name__}: {e}") from None
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        for r, t in zip(op.results, outs):
            if tuple(t.shape) != r.type.shape or t.dtype != r.type.dtype.torch:
                raise CuvilPassError(f"fold-constants: the reference semantics of {op.name} gave {t.dtype} "
                                     f"{list(t.shape)} but the op declares {r.type}")
            self.data[r] = t
        self.folded.append(op)
        self.is_folded.add(op)

    # ------------------------------------------------------------------ what to materialise

    def _choose(self) -> list[Value]:
        """The frontier values (folded values that ops running at run time read) worth replacing.

        A value over max-bytes keeps its op, whose folded operands then join the frontier. A value
        that only rearranges one constant (a transpose, reshape, slice or broadcast of a weight) is
        decided per constant afterwards: it is folded when that moves the weight into the layout its
        consumers read (a pre-transposed GEMM operand) at no cost in memory, i.e. when nothing at run
        time reads the weight itself any more and its rearrangements together are no larger than it.
        Otherwise folding would only add a second copy (tied embeddings) or a broadcast copy of a bias."""
        work = [r for op in self.folded for r in op.results if any(u not in self.is_folded for u in r.uses)]
        chosen: list[Value] = []
        views: dict[Operation, list[Value]] = {}
        seen: set[Value] = set()
        while work:
            v = work.pop()
            if v in seen:
                continue
            seen.add(v)
            source = self._rearranged_constant(v)
            if source is not None:
                views.setdefault(source, []).append(v)
            elif _nbytes(v.type) > self.max_bytes and uniform_value(self.data[v]) is None:
                self.skipped["max-bytes"] += 1
                work += self._keep(v.owner)
            else:
                chosen.append(v)
        for source, values in views.items():
            reason = self._view_refusal(source, values)
            if reason is None:
                chosen += values
                continue
            self.skipped[reason] += len(values)
            for v in values:
                op = v.owner
                while op is not source:   # keep the chain down to the weight
                    self._keep(op)
                    op = op.operands[0].owner
        return chosen

    def _keep(self, op: Operation) -> list[Value]:
        """Mark a folded op as still running; its folded operands, which now reach run time."""
        self.kept.add(op)
        return [v for v in op.operands if v.owner in self.is_folded and v.owner not in self.kept]

    @staticmethod
    def _rearranged_constant(v: Value) -> Operation | None:
        """The `cuvil.const` op that the folded value `v` only rearranges, if there is one."""
        op = v.owner
        while op is not None and _rearranges(op):
            op = producer(op.operands[0])
        return op if op is not None and op.name == "cuvil.const" else None

    def _view_refusal(self, source: Operation, values: list[Value]) -> str | None:
        weight = _nbytes(source.result.type)
        if any(_nbytes(v.type) > weight for v in values):
            return "view-would-grow"
        if any(_nbytes(v.type) > self.max_bytes for v in values):
            return "max-bytes"
        read_at_run_time = any(u not in self.is_folded or u in self.kept for u in source.result.uses)
        if read_at_run_time or sum(_nbytes(v.type) for v in values) > weight:
            return "view-would-copy"
        return None

    # ------------------------------------------------------------------ rewriting

    def _materialise(self, rw: Rewriter, v: Value) -> Value:
        """A literal, full or new constant op holding `v`'s data, placed before `v`'s producer."""
        op, t, data = v.owner, v.type, self.data[v]
        value = data.item() if t.rank == 0 else uniform_value(data)
        if value is not None:
            self.stats["new-splats"] += 1
            if t.rank == 0:
                return rw.create(op, "cuvil.literal", attrs={"value": value, "dtype": t.dtype}).result
            return rw.create(op, "cuvil.full", attrs={"shape": list(t.shape), "value": value, "dtype": t.dtype}).result
        self.stats["new-constants"] += 1
        self.stats["bytes"] += _nbytes(t)
        name = add_constant(self.module, self._stem(op), data)
        return rw.create(op, "cuvil.const", attrs={"name": name}, result_types=[t]).result

    def _stem(self, op: Operation) -> str:
        """`<weight>.<op>`: the first constant found walking up the first operands, and the op's short name."""
        short = op.name.split(".", 1)[1]
        p = op
        while p is not None and p.name != "cuvil.const":
            p = producer(p.operands[0]) if p.operands else None
        return f"{p.attrs['name']}.{short}" if p is not None else f"folded.{short}"
