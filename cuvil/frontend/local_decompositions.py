"""Ops the importer has no row for, decomposed one node at a time instead of the whole model.

`run_decompositions` re-traces the whole exported model to decompose a single op, which costs
more than the export did: 8.5 s of RAFT-small's import for its 48 `grid_sampler`s, 4 s of
MaxViT-T's for 22 `swapaxes`, 1.1 s of ViT-B/16's for 12 `unflatten`s. Here each such node's
decomposition (from the same table) is traced alone, on the fake values torch.export recorded,
and spliced in where the node was: the graph comes out as the whole re-trace would make it
around that node. Nodes alike (one op, the same shapes, strides, dtypes and other arguments)
share one trace: RAFT-small's 86 such nodes are 7 traces (0.25 s in all).

A node is left to `run_decompositions` when its trace would not stand alone: a size argument
computed in the graph, a symbolic shape or a result that is a number (the trace would bake the
symbols in, or make one of its own), a trace that makes a constant or uses an op the importer has
no row for either, or a user that is not an element of its results.
"""
from __future__ import annotations

import operator

import torch
import torch.utils._pytree as pytree
from torch.fx import Graph, GraphModule, Node

from .aten_table import ATEN_TABLE
from .fx_edit import LOCATION_META


def decompose_locally(graph: Graph, table: dict, wanted) -> int:
    """Decompose, through `table`, each call of `graph` that `wanted(node)` asks for and that can
    be traced alone (module docstring); returns how many were."""
    todo = [(n, v) for n in graph.nodes if n.op == "call_function" and wanted(n) and (v := _values(n)) is not None]
    if not todo:
        return 0
    # (imported here: a process that loads a cached model never imports torch.export's tracing)
    from torch._dispatch.python import enable_python_dispatcher
    from torch.export._trace import _ignore_backend_decomps
    from torch.export.exported_program import (_override_composite_implicit_decomp,
                                               _split_decomp_table_to_cia_and_python_decomp)
    mode = torch._guards.detect_fake_mode([n.meta.get("val") for n in graph.nodes])
    # as `run_decompositions` traces: composite ops the table decomposes (or keeps: those with a
    # row) take its entry through the Python dispatcher, not their C++ form, which skips checks on
    # fake tensors (one_hot's range assertions)
    composite, python = _split_decomp_table_to_cia_and_python_decomp(dict(table))
    traces: dict[tuple, GraphModule | None] = {}
    done = 0
    with _ignore_backend_decomps(), _override_composite_implicit_decomp(composite), enable_python_dispatcher():
        for node, values in todo:
            key = _signature(node.target, values)
            if key not in traces:
                traces[key] = _trace(node.target, values, python, mode)
            if traces[key] is not None and _splice(graph, node, traces[key]):
                done += 1
    return done


def _values(node: Node) -> tuple | None:
    """The node's (args, kwargs) with its tensor operands as their fake values; None where an
    operand is anything else computed in the graph, or an operand or result is not a tensor of
    static shape (`item()`'s number: a trace would make a symbol of its own for it)."""
    static = _static_tensors(node.meta.get("val"))

    def value(a):
        nonlocal static
        val = a.meta.get("val")
        static = static and _static_tensors(val)
        return val
    values = torch.fx.node.map_arg((node.args, node.kwargs), value)
    return values if static else None


def _static_tensors(val) -> bool:
    vals = val if isinstance(val, (tuple, list)) else [val]
    return all(isinstance(v, torch.Tensor) and all(isinstance(d, int) for d in v.shape) for v in vals)


def _signature(target, values: tuple) -> tuple:
    leaves = pytree.tree_leaves(values)
    return target, str(pytree.tree_structure(values)), tuple(
        (tuple(x.shape), x.stride(), x.dtype) if isinstance(x, torch.Tensor) else (type(x), x) for x in leaves)


def _trace(target, values: tuple, table: dict, mode) -> GraphModule | None:
    """`target` on `values` (fake tensors of `mode`), traced through the decompositions of `table`
    into ops the importer has rows for; None where it does not come out so."""
    leaves, spec = pytree.tree_flatten(values)
    at = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]

    def call(*tensors):
        filled = list(leaves)
        for i, t in zip(at, tensors):
            filled[i] = t
        args, kwargs = pytree.tree_unflatten(filled, spec)
        return target(*args, **kwargs)
    from torch.fx.experimental.proxy_tensor import make_fx
    tensors = [leaves[i] for i in at]
    try:
        with mode:
            traced = make_fx(call, decomposition_table=table, tracing_mode="real")(*tensors)
    except Exception:       # anything torch cannot trace alone is the whole re-trace's to try
        return None
    for n in traced.graph.nodes:
        if n.op == "call_function" and (n.target not in ATEN_TABLE and n.target is not operator.getitem
                                        or "val" not in n.meta):
            return None
        if n.op not in ("call_function", "placeholder", "output"):
            return None
    return traced


def _splice(graph: Graph, node: Node, traced: GraphModule) -> bool:
    """Put `traced`'s calls in place of `node`, on its tensor operands; False (the graph
    unchanged) where a user of the node is not an element of its results."""
    results = traced.graph.output_node().args[0]
    several = isinstance(results, (tuple, list))
    if several and any(u.target is not operator.getitem for u in node.users):
        return False
    operands = iter([a for a in pytree.tree_leaves((node.args, node.kwargs)) if isinstance(a, Node)])
    env: dict[Node, Node] = {}
    inserted: list[Node] = []
    location = {k: node.meta[k] for k in LOCATION_META if k in node.meta}
    with graph.inserting_before(node):
        for n in traced.graph.nodes:
            if n.op == "placeholder":
                env[n] = next(operands)
            elif n.op == "call_function":
                env[n] = graph.call_function(n.target, *torch.fx.node.map_arg((n.args, n.kwargs), env.__getitem__))
                env[n].meta.update(location, val=n.meta["val"])
                inserted.append(env[n])
    made = torch.fx.node.map_arg(results, env.__getitem__)
    if several:
        for user in list(node.users):
            user.replace_all_uses_with(made[user.args[1]])
            graph.erase_node(user)
    else:
        node.replace_all_uses_with(made)
    graph.erase_node(node)
    for n in reversed(inserted):     # what computes only results nobody reads (max_pool1d's indices)
        if not n.users and not n.is_impure():
            graph.erase_node(n)
    return True
