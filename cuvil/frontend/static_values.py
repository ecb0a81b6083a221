"""Values a model computes from constants alone in a dtype Cuvil has no kernels for (RT-DETR's
sinusoidal position embedding: `torch.arange(h, dtype=torch.float64)`, its sines and cosines in
float64, then `.to(torch.float32)`), computed by torch at import.

A node is static when its sizes are numbers and its inputs are static nodes, lifted constants and
Python values; random ops are never static. Cuvil has no float64, so a static float64 node and
every static node computed from one are run by torch, once, exactly as eager runs them, and the
importer takes their values as constants (`_Const`, emitted where a Cuvil op reads one). Other
static nodes stay ops (Cuvil recomputes an `arange` as index arithmetic, cheaper than a read).
With a dynamic size in them the float64 ops remain and are refused by name, as before.
"""
from __future__ import annotations

import operator
from typing import Any, Callable

import torch
from torch.export.graph_signature import InputKind

from .random_draws import is_random

UNSUPPORTED = (torch.float64,)


def static_constants(ep: torch.export.ExportedProgram, const: Callable[[str, torch.Tensor], Any]) -> dict:
    """{node: const(name, value)} for the static nodes computed from a float64 static node (those
    included), each value computed by torch (a check's None, a tuple as it is: only other folded
    nodes read them)."""
    values: dict[torch.fx.Node, Any] = {}
    lifted = {s.arg.name: ep.constants[s.target] for s in ep.graph_signature.input_specs
              if s.kind is InputKind.CONSTANT_TENSOR and isinstance(ep.constants.get(s.target), torch.Tensor)}
    static: set[torch.fx.Node] = set()
    folded: set[torch.fx.Node] = set()
    for node in ep.graph.nodes:
        if node.op == "placeholder" and node.name in lifted:
            static.add(node)
            values[node] = lifted[node.name]
        elif node.op == "call_function" and _computable(node, static):
            static.add(node)
            if _is_unsupported(node) or any(a in folded for a in node.all_input_nodes):
                folded.add(node)
    if not folded:
        return {}
    out = {}
    for node in ep.graph.nodes:
        if node in folded:
            value = _evaluate(node, values)
            out[node] = const(f"static.{node.name}", value) if isinstance(value, torch.Tensor) else value
    return out


def _computable(node: torch.fx.Node, static: set) -> bool:
    """Whether a call's inputs are all static and its result has sizes that are numbers."""
    target = node.target
    if not (isinstance(target, torch._ops.OpOverload) or target is operator.getitem) or \
            (isinstance(target, torch._ops.OpOverload) and is_random(target)):
        return False
    if not all(a in static for a in node.all_input_nodes):
        return False
    if target in _CHECKS:
        return True
    vals = node.meta.get("val")
    vals = vals if isinstance(vals, (list, tuple)) else [vals]
    return all(isinstance(v, torch.Tensor) and all(isinstance(d, int) for d in v.shape) for v in vals) and \
        not any(isinstance(a, torch.SymInt) for a in torch.utils._pytree.tree_leaves((node.args, node.kwargs)))


# checks of a static value's metadata (`.to(torch.float32)` asserts its input's dtype): run by torch
_CHECKS = frozenset({torch.ops.aten._assert_tensor_metadata.default})


def _is_unsupported(node: torch.fx.Node) -> bool:
    vals = node.meta.get("val")
    vals = vals if isinstance(vals, (list, tuple)) else [vals]
    return any(isinstance(v, torch.Tensor) and v.dtype in UNSUPPORTED for v in vals)


def _evaluate(node: torch.fx.Node, values: dict):
    """The node's value, computing the static nodes it reads first (memoised in `values`)."""
    if node not in values:
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: _evaluate(n, values))
        values[node] = node.target(*args, **kwargs)
    return values[node]
