"""In-place ops on tensors the model made itself, read as their functional forms.

`h += residual` (HF ResNet), `x.mul_(2)`, `nn.ReLU(inplace=True)`: torch.export keeps these as
`aten.add_.Tensor`, `aten.mul_.Tensor`, `aten.relu_.default`. Mutation in general needs
`run_decompositions` to functionalise the graph, which traces the whole model again (0.3 s and
more). Where no one can observe the mutation it is the functional op: the mutated tensor is a
fresh result (no view of anything, no input, parameter or buffer), every other use of it comes
before the in-place op and makes no view of it, and the functional op's result has the tensor's
own dtype. Anything else is left to `run_decompositions`.
"""
from __future__ import annotations

import operator

import torch
from torch.fx import Graph, Node

from .aten_table import ATEN_TABLE


def functionalize_local_inplace(graph: Graph) -> int:
    """Retarget the unobservable in-place ops of `graph` to their functional forms; returns how
    many were rewritten."""
    order = {node: i for i, node in enumerate(graph.nodes)}
    fresh: set[Node] = set()      # results that alias nothing: each in-place op rewritten makes one
    rewritten = 0
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        functional = _functional_form(node.target)
        if functional is not None and _unobservable(node, functional, order, fresh):
            node.target = functional
            rewritten += 1
        if _makes_fresh_tensor(node):
            fresh.add(node)
    return rewritten


def _functional_form(target) -> torch._ops.OpOverload | None:
    """aten.add_.Tensor -> aten.add.Tensor, where Cuvil imports the functional one."""
    if not isinstance(target, torch._ops.OpOverload) or not target._schema.is_mutable:
        return None
    name = target._schema.name.split("::")[-1]
    if not name.endswith("_") or name.startswith("_"):
        return None
    packet = getattr(torch.ops.aten, name[:-1], None)
    functional = getattr(packet, target._overloadname, None) if packet is not None else None
    return functional if functional in ATEN_TABLE else None


def _unobservable(node: Node, functional, order: dict[Node, int], fresh: set[Node]) -> bool:
    target = node.args[0] if node.args else None
    if not isinstance(target, Node) or target not in fresh:
        return False
    for user in target.users:
        if user is not node and (order[user] > order[node] or not _makes_fresh_tensor(user)):
            return False
    before = target.meta.get("val")
    return isinstance(before, torch.Tensor) and _functional_dtype(node, functional) == before.dtype


def _functional_dtype(node: Node, functional: torch._ops.OpOverload) -> torch.dtype | None:
    """The dtype of the functional form's result (an in-place op keeps its target's dtype, where
    `half + float` would promote), from the op run on one-element meta tensors of the operands'
    dtypes and ranks."""
    def dummy(a):
        if not isinstance(a, Node):
            return a
        val = a.meta.get("val")
        if not isinstance(val, torch.Tensor):
            raise TypeError(a)
        return torch.empty((1,) * val.dim(), dtype=val.dtype, device="meta")
    try:
        args, kwargs = torch.fx.node.map_aggregate((node.args, node.kwargs), dummy)
        return functional(*args, **kwargs).dtype
    except Exception:   # an operand without a tensor value, or an op meta tensors cannot run
        return None


def _makes_fresh_tensor(node: Node) -> bool:
    """A node whose result is new memory: an ATen op none of whose results alias an argument, or
    an element of such an op's tuple of results."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        source = node.args[0]
        return isinstance(source, Node) and _makes_fresh_tensor(source)
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and not target._schema.is_mutable and \
        all(r.alias_info is None for r in target._schema.returns)
