"""Which graph ops share a kernel: the groups `lower_group` turns into kernels, in run order.

- "fused" (`groups_from_attrs`): the groups the `fuse` pass chose, read from its `fuse.group`
  attributes; every op without one is a kernel of its own.
- "single" (`group_single_ops`): one kernel per op.

Either way views and inline constants (literal, full, arange) go with the ops that read them: they
are index arithmetic, recomputed where they are read (`rematerialize`), except where an op reads
an operand from memory (a GEMM's operands, a gather's table); a view gets a kernel of its own when
something needs it in memory (a return, such an operand).
"""
from __future__ import annotations

import heapq
from typing import Callable

from ..errors import CuvilError
from ..ir.core import Function, Operation
from .lower import REMATERIALIZED, SKIP_OPS, fusible_operands, group_legality, needs_memory, op_kind, recomputed, stored

Grouping = Callable[[Function], "list[list[Operation]]"]
GROUP_ATTR = "fuse.group"


def rematerialize(fn: Function, ops: list[Operation], order: dict[int, int] | None = None) -> list[Operation]:
    """`ops` plus the views and inline constants they read (transitively, through the operands the
    kernel computes rather than loads), in program order (`order`: `program_order(fn)`, which
    callers that ask many times pass in: building it per call made fusing LeViT's 800 ops quadratic)."""
    ids = {id(op) for op in ops}
    out = list(ops)
    frontier = [v for op in ops for v in fusible_operands(op)]
    while frontier:
        p = frontier.pop().owner
        if isinstance(p, Operation) and id(p) not in ids and recomputed(p):
            ids.add(id(p))
            out.append(p)
            frontier.extend(fusible_operands(p))
    order = order or program_order(fn)
    return sorted(out, key=lambda op: order[id(op)])


def program_order(fn: Function) -> dict[int, int]:
    """Each op's position in `fn`, by id."""
    return {id(op): i for i, op in enumerate(fn.ops)}


def kernel_roots(fn: Function) -> list[Operation]:
    """The ops that are computed by some kernel of their own or of a group: all but the skipped
    ones (const, return), the views and inline constants nothing needs in memory, and the dead ops
    (nothing returned depends on them: a pipeline without `dce` keeps them)."""
    live = live_ops(fn)
    return [op for op in fn.ops if op.name not in SKIP_OPS and id(op) in live
            and (op_kind(op) not in REMATERIALIZED or needs_memory(op, live))]


def live_ops(fn: Function) -> set[int]:
    """The ids of the ops that the returned values depend on."""
    live: set[int] = set()
    frontier = [fn.return_op]
    while frontier:
        op = frontier.pop()
        for v in op.operands:
            owner = v.owner
            if isinstance(owner, Operation) and id(owner) not in live:
                live.add(id(owner))
                frontier.append(owner)
    return live


def kernel_ops(group: list[Operation]) -> list[Operation]:
    """The ops a group's kernel is for: all but the views and constants it only recomputes for
    them (the last op, the one whose result the kernel stores, always counts)."""
    return [op for op in group if op_kind(op) not in REMATERIALIZED or op is group[-1]]


def group_single_ops(fn: Function) -> list[list[Operation]]:
    """No fusion: one kernel per op (with the views and constants it reads)."""
    order = program_order(fn)
    return [rematerialize(fn, [op], order) for op in kernel_roots(fn)]


def groups_from_attrs(fn: Function) -> list[list[Operation]]:
    """One kernel per `fuse.group` value (the ops carrying it, plus what they rematerialize), and
    one per other op; in an order that runs every group after the groups it reads. A group that a
    later pass (or a hand-written attribute) made impossible raises a CuvilError naming it."""
    tagged: dict[object, list[Operation]] = {}
    for op in kernel_roots(fn):
        tag = op.attrs.get(GROUP_ATTR)
        if tag is not None:
            tagged.setdefault(tag, []).append(op)
    order = program_order(fn)
    for tag, core in tagged.items():
        if len(core) > 1:
            problem = group_legality(fn, rematerialize(fn, core, order))
            if problem is not None:
                raise CuvilError(f"fusion group {GROUP_ATTR} = {tag} ({_names(core)}) cannot be one kernel: "
                                 f"{problem.reason} [{problem.rule}]")
    return groups_from_cores(fn, list(tagged.values()))


def groups_from_cores(fn: Function, cores: list[list[Operation]]) -> list[list[Operation]]:
    """The kernels of `fn` when each list of `cores` is one kernel and every other op is one of its
    own: each with what it rematerializes, in run order."""
    grouped = {id(op) for core in cores for op in core}
    singles = [[op] for op in kernel_roots(fn) if id(op) not in grouped]
    order = program_order(fn)
    return run_order(fn, [rematerialize(fn, core, order) for core in [*cores, *singles]])


def run_order(fn: Function, groups: list[list[Operation]]) -> list[list[Operation]]:
    """`groups` ordered so that each comes after the groups computing what it reads, otherwise by
    its last op's position; groups that read each other (a cycle) raise a CuvilError."""
    position = program_order(fn)
    computed_by: dict[int, int] = {}
    for g, ops in enumerate(groups):
        for op in kernel_ops(ops):
            computed_by[id(op)] = g
    deps: list[set[int]] = []
    for g, ops in enumerate(groups):
        inside = {id(op) for op in ops}
        reads = [stored(v).owner for op in ops for v in op.operands]
        # a view the group recomputes for some readers but another reads from memory: its buffer
        # is written by the kernel that stores it
        from_memory = [stored(v).owner for op in ops for v in op.operands if not any(v is f for f in fusible_operands(op))]
        deps.append({computed_by[id(o)] for o in reads if id(o) in computed_by and id(o) not in inside} |
                    {computed_by[id(o)] for o in from_memory if id(o) in computed_by and computed_by[id(o)] != g})
    users: list[list[int]] = [[] for _ in groups]
    for g, ds in enumerate(deps):
        for d in ds:
            users[d].append(g)
    waiting = [len(ds) for ds in deps]
    ready = [(position[id(ops[-1])], g) for g, ops in enumerate(groups) if not waiting[g]]
    heapq.heapify(ready)
    out = []
    while ready:
        _, g = heapq.heappop(ready)
        out.append(groups[g])
        for u in users[g]:
            waiting[u] -= 1
            if not waiting[u]:
                heapq.heappush(ready, (position[id(groups[u][-1])], u))
    if len(out) < len(groups):
        stuck = next(ops for g, ops in enumerate(groups) if waiting[g])
        raise CuvilError(f"fusion groups read each other (a cycle): the group of {_names(stuck)} "
                         f"reads a group that reads it; fix the {GROUP_ATTR} attributes")
    return out


def _names(ops: list[Operation]) -> str:
    return ", ".join(f"{op.name} #{op.id}" for op in kernel_ops(ops))


GROUPINGS: dict[str, Grouping] = {"fused": groups_from_attrs, "single": group_single_ops}


def register_grouping(name: str, grouping: Grouping) -> None:
    """Make `grouping` available by name; registering "fused" changes what `enable_fusion=True` uses."""
    GROUPINGS[name] = grouping


def grouping_for(enable_fusion: bool | str | Grouping) -> Grouping:
    if callable(enable_fusion):
        return enable_fusion
    if isinstance(enable_fusion, str):
        if enable_fusion not in GROUPINGS:
            raise CuvilError(f"unknown grouping '{enable_fusion}'; known: {', '.join(GROUPINGS)}")
        return GROUPINGS[enable_fusion]
    return GROUPINGS["fused" if enable_fusion else "single"]
