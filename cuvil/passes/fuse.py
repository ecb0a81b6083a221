"""The `fuse` pass: decides which ops share a kernel, marks them with `fuse.group = <id>`, and
records every decision (docs/passes.md#fuse).

Groups start as single ops (views and inline constants are not ops of their own here: every kernel
that reads them recomputes them). A producer's group joins the group of its consumers when
`can_fuse` allows it (legality); among the candidates, `score` says which joins first (priority):
GEMM/conv epilogues, then reductions with their prologue and epilogue, then the rest. Every
candidate left unfused at the end is reported with the rule that refused it.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

from ..codegen.grouping import (GROUP_ATTR, groups_from_attrs, groups_from_cores, kernel_ops, kernel_roots, live_ops,
                                program_order, rematerialize)
from ..codegen.lower import (INLINE_OPS, KEPT_ATTR, REMATERIALIZED, Refusal, alias_base, fusible_operands,
                             group_legality, needs_memory, op_kind, recomputed)
from ..ir.core import Function, Module, Operation
from ..ir.printer import value_names
from .base import ModulePass
from .registry import register_pass


@register_pass
@dataclass(frozen=True)
class FusePass(ModulePass):
    """Group ops into kernels (fusion) and record every group and refused candidate.

    Options: `max-ops` (most ops in one kernel, views not counted), `epilogue` (fuse elementwise
    epilogues into GEMM/conv kernels), `reductions` (fuse reductions with their prologue and
    epilogue). Statistics: groups, fused-ops, refused, and `fusion` (the decisions as JSON)."""
    name = "fuse"
    priority = 200
    requires = frozenset({"verified"})
    max_ops: int = 64
    epilogue: bool = True
    reductions: bool = True

    def run(self, module: Module) -> dict:
        groups, refused = [], []
        for fn in module.functions.values():
            fusion = Fusion(fn, self)
            fusion.plan()
            g, r = fusion.mark(first_id=len(groups))
            groups += g
            refused += r
        multi = [g for g in groups if g["kind"] != "single"]
        return {"groups": len(multi), "fused-ops": sum(g["size"] for g in multi), "refused": len(refused),
                "fusion": {"options": self.options(), "groups": groups, "refused": refused}}


def fusion_groups(fn: Function, options: FusePass | None = None) -> list[list[Operation]]:
    """The kernels the fuse pass would form for `fn`, without marking it."""
    fusion = Fusion(fn, options or FusePass())
    fusion.plan()
    return groups_from_cores(fn, fusion.cores())


# ----------------------------------------------------------------------------- the decisions


# A kernel recomputes each op it reads broadcast (a per-pixel index read by every channel): past
# MAX_BROADCAST_OPS such ops, reading the value from memory costs less than computing it again.
BROADCAST_TIMES = 4
MAX_BROADCAST_OPS = 4
# ShuffleNet's channel shuffles read each block's concatenation through the next block's split and
# shuffle: recomputed 8 deep, the innermost piece's index composed every shuffle inside every
# condition between (one kernel 75 kB of kernel IR, 0.45 s of LLVM IR building)
MAX_NESTED_CATS = 2


class Group:
    """Ops fused so far. Only the root (the last op) has uses outside the group: a producer joins
    a group only when all its readers are in it, so groups never read each other in a cycle."""
    __slots__ = ("ops", "root")

    def __init__(self, op: Operation):
        self.ops = [op]
        self.root = op


def score(producer: Group, consumer: Group) -> int:
    """Priority of `producer` joining `consumer` (higher first): a GEMM's or convolution's
    epilogue 3, a reduction's prologue or epilogue 2, anything else 1."""
    kinds = {op_kind(op) for op in producer.ops}
    if kinds & {"library", "window"}:
        return 3
    if "reduction" in kinds | {op_kind(op) for op in consumer.ops}:
        return 2
    return 1


class Fusion:
    """The fusion decisions for one function under the options of a FusePass."""

    def __init__(self, fn: Function, options: FusePass):
        self.fn, self.options = fn, options
        self.order = program_order(fn)
        self.names = value_names(fn)
        self.live = live_ops(fn)        # uses by dead ops (a pipeline without dce keeps them) do not count
        self._keep_nested_cats()
        core = kernel_roots(fn)
        self.group_of: dict[int, Group] = {id(op): Group(op) for op in core}
        self.readers: dict[int, list[Operation]] = {}          # op -> ops that compute it in their kernel
        self.escape: dict[int, str | None] = {}                # op -> why its result must be in memory
        self.memory_readers: dict[int, list[tuple[Operation, Refusal]]] = {}   # op -> (reader, why), GEMM-style
        self.producers: dict[int, list[Operation]] = {id(op): [] for op in core}
        for op in core:
            self._trace_uses(op)
        for op in core:
            for r in self.readers[id(op)]:
                self.producers[id(r)].append(op)

    def _trace_uses(self, p: Operation) -> None:
        """Who reads p's result: the ops that compute it in their kernel (following views, which
        their readers recompute), those that read it from memory, and why it must be in memory."""
        readers, memory, escape = [], [], None
        stack = [(r, u, None) for r in p.results for u in r.uses]
        seen = set()
        while stack:
            v, u, view = stack.pop()
            if (id(v), id(u)) in seen:
                continue
            seen.add((id(v), id(u)))
            if u.name != "cuvil.return" and id(u) not in self.live:
                continue
            fusible = any(o is v for o in fusible_operands(u))
            if view is not None and not fusible and u.name != "cuvil.return" and alias_base(v) is not None:
                memory.append((u, self._memory_read(p, u)))     # reads p's own buffer at the view's shape
                escape = escape or f"{self.value(p)} is also read from memory by {u.name} (through {view.name})"
                continue
            if view is not None and (u.name == "cuvil.return" or not fusible):
                continue            # reads the view's buffer, which the view's own kernel writes
            if u.name == "cuvil.return":
                escape = escape or f"{self.value(p)} is returned"
            elif not fusible:
                memory.append((u, self._memory_read(p, u)))
                escape = escape or f"{self.value(p)} is also read from memory by {u.name}"
            elif view is not None and op_kind(u) == "library" and op_kind(p) not in REMATERIALIZED:
                # the op gathers its operand through the views, each element as often as windows
                # overlap (kh*kw times): a value computed behind them is computed once, in memory
                memory.append((u, Refusal("gathered-operand", f"{u.name} gathers {self.value(p)} through views, "
                                                              f"reading each element several times")))
                escape = escape or f"{self.value(p)} is gathered by {u.name}"
            else:
                if (op_kind(u) not in REMATERIALIZED or needs_memory(u, self.live)) and u not in readers:
                    readers.append(u)
                if recomputed(u):
                    stack.extend((r, w, u) for r in u.results for w in r.uses)
        self.readers[id(p)] = readers
        self.memory_readers[id(p)] = memory
        self.escape[id(p)] = escape

    def _keep_nested_cats(self) -> None:
        """Mark (`KEPT_ATTR`) each concatenation that kernels would otherwise compute through more
        than MAX_NESTED_CATS - 1 others read through views: it is computed once, into memory."""
        depth: dict[int, int] = {}
        for op in self.fn.ops:
            op.attrs.pop(KEPT_ATTR, None)
            if op_kind(op) not in REMATERIALIZED or id(op) not in self.live:
                continue
            d = max((depth.get(id(v.owner), 0) for v in op.operands), default=0) + (op.name == "cuvil.cat")
            if op.name == "cuvil.cat" and d > MAX_NESTED_CATS:
                op.attrs[KEPT_ATTR] = True
                d = 0
            depth[id(op)] = d

    def _memory_read(self, p: Operation, reader: Operation) -> Refusal:
        kind = op_kind(reader)
        if kind == "unsupported":
            return Refusal("lowering", f"{reader.name} has no native lowering")
        what = "an operand of a library call: GEMM, topk, scan" if kind == "library" else "a gather's table"
        return Refusal("memory-operand", f"{reader.name} reads {self.value(p)} from memory ({what})")

    def value(self, op: Operation) -> str:
        return "%" + self.names[op.results[0]] if op.results else op.name

    # -- legality
    def consumer_group(self, p: Operation) -> Group | None:
        """The one group all readers of p are in, or None."""
        groups = {id(self.group_of[id(r)]): self.group_of[id(r)] for r in self.readers[id(p)]}
        return next(iter(groups.values())) if len(groups) == 1 else None

    def can_fuse(self, producer: Group, consumer: Group) -> Refusal | None:
        """None when `producer` may join `consumer`, else the rule that refuses it and why."""
        p = producer.root
        if p.attrs.get(KEPT_ATTR):
            return Refusal("nested-cats", f"{self.value(p)} is a concatenation read through {MAX_NESTED_CATS} others: "
                                          f"computed inside its readers, each one's index would be computed inside "
                                          f"the next's conditions (max-nested-cats {MAX_NESTED_CATS})")
        if self.escape[id(p)]:
            return Refusal("multi-use", self.escape[id(p)])
        outside = next((r for r in self.readers[id(p)] if self.group_of[id(r)] is not consumer), None)
        if outside is not None:
            return Refusal("multi-use", f"{self.value(p)} is also used by {self.value(outside)} ({outside.name}) "
                                        f"outside the group")
        kinds = {op_kind(op) for op in producer.ops + consumer.ops}
        if not self.options.epilogue and "library" in kinds:
            return Refusal("disabled", "epilogue=false: nothing is fused into GEMM-based kernels")
        if not self.options.reductions and "reduction" in kinds:
            return Refusal("disabled", "reductions=false: reductions are not fused with other ops")
        recomputed = self._broadcast_ops(producer.ops + consumer.ops, consumer.root)
        if len(recomputed) > MAX_BROADCAST_OPS:
            return Refusal("recompute", f"the kernel of {self.value(consumer.root)} would recompute {len(recomputed)} "
                                        f"elementwise ops it reads broadcast, each at least {BROADCAST_TIMES}x "
                                        f"(max {MAX_BROADCAST_OPS}): they are computed once, in memory")
        problem = group_legality(self.fn, rematerialize(self.fn, producer.ops + consumer.ops, self.order))
        if problem is None and len(producer.ops) + len(consumer.ops) > self.options.max_ops:
            return Refusal("max-ops", f"max-ops={self.options.max_ops} reached (the groups have "
                                      f"{len(producer.ops)} + {len(consumer.ops)} ops)")
        return problem

    @staticmethod
    def _broadcast_ops(ops: list[Operation], root: Operation) -> list[Operation]:
        """The elementwise ops whose results `root`'s kernel would read broadcast over at least
        BROADCAST_TIMES results each (static sizes): its loops recompute them each time."""
        total = root.results[0].type.numel() if root.results else None
        if not isinstance(total, int):
            return []
        return [op for op in ops if op_kind(op) == "elementwise" and isinstance(n := op.results[0].type.numel(), int)
                and n * BROADCAST_TIMES <= total]

    # -- planning
    def plan(self) -> None:
        """Merge groups, best score first, until no candidate is legal."""
        heap: list = []

        def push(p: Operation) -> None:
            producer, consumer = self.group_of[id(p)], self.consumer_group(p)
            if producer.root is p and consumer is not None and not self.escape[id(p)]:
                heapq.heappush(heap, (-score(producer, consumer), -self.order[id(p)], p.id, p))

        for op in self.fn.ops:
            if id(op) in self.group_of:
                push(op)
        while heap:
            p = heapq.heappop(heap)[-1]
            producer, consumer = self.group_of[id(p)], self.consumer_group(p)
            if producer.root is not p or consumer is None or self.can_fuse(producer, consumer) is not None:
                continue
            consumer.ops = sorted(consumer.ops + producer.ops, key=lambda op: self.order[id(op)])
            for op in producer.ops:
                self.group_of[id(op)] = consumer
            push(consumer.root)
            for op in consumer.ops:
                for q in self.producers[id(op)]:
                    push(q)

    def cores(self) -> list[list[Operation]]:
        """The multi-op groups, as lists of ops in program order."""
        seen, out = set(), []
        for g in self.group_of.values():
            if id(g) not in seen and len(g.ops) > 1:
                seen.add(id(g))
                out.append(g.ops)
        return out

    def refusals(self) -> list[tuple[Operation, Operation, Refusal]]:
        """(candidate, consumer, why) for every producer left out of a group that reads it."""
        out = []
        for op in self.fn.ops:
            if id(op) not in self.group_of or self.group_of[id(op)].root is not op:
                continue
            producer, done = self.group_of[id(op)], set()
            for r in self.readers[id(op)]:
                consumer = self.group_of[id(r)]
                if id(consumer) not in done:
                    done.add(id(consumer))
                    out.append((op, r, self.can_fuse(producer, consumer)))
            out += [(op, reader, why) for reader, why in self.memory_readers[id(op)]]
        return out

    # -- marking and the decisions' JSON
    def mark(self, first_id: int) -> tuple[list[dict], list[dict]]:
        """Set `fuse.group` on the ops of every multi-op group (ids in run order from `first_id`)
        and return the groups and refusals as the fusion JSON (docs/passes.md#fuse)."""
        for op in self.fn.ops:
            op.attrs.pop(GROUP_ATTR, None)
        for k, core in enumerate(self.cores()):
            for op in core:
                op.attrs[GROUP_ATTR] = k
        kernels = groups_from_attrs(self.fn)
        group_id = {}
        groups = []
        for k, ops in enumerate(kernels, start=first_id):
            core = kernel_ops(ops)
            for op in core:
                if len(core) > 1:
                    op.attrs[GROUP_ATTR] = k
                group_id[id(op)] = k
            groups.append(self._group_json(k, ops, core))
        refused = [{"group": group_id[id(consumer)], "candidate": self.value(p), "candidate_op": p.id,
                    "candidate_name": p.name, "consumer": self.value(consumer), "rule": why.rule,
                    "reason": why.reason}
                   for p, consumer, why in self.refusals() if why is not None]
        return groups, refused

    def _group_json(self, k: int, ops: list[Operation], core: list[Operation]) -> dict:
        kinds = {op_kind(op) for op in core}
        kind = "single" if len(core) == 1 else next(
            (name for tag, name in (("library", "gemm-epilogue"), ("reduction", "reduction"), ("window", "window"),
                                    ("gather", "gather")) if tag in kinds), "elementwise")
        return {"id": k, "name": f"g{k}", "ops": [op.id for op in ops],
                "values": ["%" + self.names[r] for op in ops if op.name not in INLINE_OPS for r in op.results],
                "kind": kind, "root": self.value(core[-1]), "size": len(core),
                "summary": " + ".join(op.name.split(".", 1)[-1] for op in core)}
