"""Helpers for the rewrites of the exported graph before import (`inplace`, `masked_updates`,
`complex_pairs`, `local_decompositions`): new calls that keep the source location of the node
they replace, with their values worked out on fake tensors as torch.export's own are."""
from __future__ import annotations

import torch
from torch.fx import Graph, Node

# what `locations.py` reads to name a node's source line, copied onto the nodes that replace it
LOCATION_META = ("stack_trace", "nn_module_stack", "source_fn_stack", "from_node", "seq_nr")


def new_call(graph: Graph, target, args: tuple, kwargs: dict, like: Node) -> Node:
    """A call of `target` at the graph's insertion point, with `like`'s source location and its
    value computed on the operands' fake values."""
    node = graph.call_function(target, args, kwargs)
    node.meta.update({k: like.meta[k] for k in LOCATION_META if k in like.meta})
    fake = torch.fx.node.map_arg((args, kwargs), lambda n: n.meta["val"])
    mode = torch._guards.detect_fake_mode(torch.utils._pytree.tree_leaves(fake))
    with mode:
        node.meta["val"] = target(*fake[0], **fake[1])
    return node
