"""In-place ops on tensors the model made itself, read as their functional forms.

`h += residual` (HF ResNet), `x.mul_(2)`, `nn.ReLU(inplace=True)`: torch.export keeps these as
`aten.add_.Tensor`, `aten.mul_.Tensor`, `aten.relu_.default`. Mutation in general needs
`run_decompositions` to functionalise the graph, which traces the whole model again (0.3 s and
more). Where no one can observe the mutation it is the functional op: the mutated tensor is a
fresh result (no view of anything, no input, parameter or buffer), every other use of it comes
before the in-place op and makes no view of it, and the functional op's result has the tensor's
own dtype. Two more cases are read functionally:
- an in-place op that changes nothing: `nn.Dropout(inplace=True)` in inference, on any tensor
  (EfficientNet's classifier, on a view of its pooled features);
- a write through slices and selections of a fresh tensor (`mask[a:b, c:d] = k`, Swin's shifted
  window mask; `x[0] += y`): the write is the functional op on the view, put back with
  `slice_scatter` / `select_scatter` view by view, and the tensor's later uses read that result.
  The views on the way may have no other use, the in-place op's own result none, and the tensor's
  uses before the write make no view of it.
Anything else is left to `run_decompositions`.
"""
from __future__ import annotations

import operator

import torch
from torch.fx import Graph, Node

from .aten_table import ATEN_TABLE
from .fx_edit import new_call

aten = torch.ops.aten


def functionalize_local_inplace(graph: Graph) -> int:
    """Retarget the unobservable in-place ops of `graph` to their functional forms; returns how
    many were rewritten."""
    order = {node: i for i, node in enumerate(graph.nodes)}
    fresh: set[Node] = set()      # results that alias nothing: each in-place op rewritten makes one
    rewritten = 0
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        functional = _functional_form(node.target)
        if functional is None:
            pass
        elif _changes_nothing(node) or _unobservable(node, functional, order, fresh) or \
                _seen_only_through_its_result(node, functional, fresh) or _copied_back(node, functional, order):
            node.target = functional
            rewritten += 1
        elif chain := _write_chain(node, functional, order, fresh):
            fresh.add(_write_through(graph, node, functional, chain, order))
            rewritten += 1
            continue
        if _makes_fresh_tensor(node):
            fresh.add(node)
    return rewritten


# in-place ops that leave their tensor as it was, when the test on the node holds
_NO_CHANGE = {aten.dropout_.default: lambda n: not n.args[2]}
# views whose writes can be put back, and the op that puts them back (the view's own arguments after
# the source: dim, start, end, step; dim, index)
_PUT_BACK = {aten.slice.Tensor: aten.slice_scatter.default, aten.select.int: aten.select_scatter.default}


def _changes_nothing(node: Node) -> bool:
    return node.target in _NO_CHANGE and _NO_CHANGE[node.target](node)


def _keeps_dtype(node: Node, functional) -> bool:
    """Whether the functional form's result has the changed tensor's own dtype."""
    before = node.args[0].meta.get("val") if node.args and isinstance(node.args[0], Node) else None
    return isinstance(before, torch.Tensor) and _functional_dtype(node, functional) == before.dtype


def _seen_only_through_its_result(node: Node, functional, fresh: set[Node]) -> bool:
    """A change through views of a fresh tensor that nothing else reads (each view and the tensor
    used once, along the way): only the op's own result shows it (Funnel's `attn *= mask` on a
    slice of a reshaped product; Mamba's `offset = torch.tensor(0).to(...); offset += n`)."""
    view = node.args[0] if node.args else None
    steps = 0
    while isinstance(view, Node) and view not in fresh:
        if not _is_view(view) or _value_readers(view) != 1:
            return False
        view, steps = view.args[0], steps + 1
    return steps > 0 and isinstance(view, Node) and _value_readers(view) == 1 and _keeps_dtype(node, functional)


def _value_readers(node: Node) -> int:
    """How many users read `node`'s values: torch.export's checks of a tensor's dtype and device
    (`_assert_tensor_metadata`, Mamba's `.to(...)` of its offset) do not."""
    return sum(u.target is not aten._assert_tensor_metadata.default for u in node.users)


def _copied_back(node: Node, functional, order: dict[Node, int]) -> bool:
    """`t[i] += v`: Python's augmented assignment through a subscript changes the view in place,
    then copies the result onto the same view taken again (`copy_`), with nothing in between:
    the change is the functional op, the copy writes it (`_write_chain`)."""
    if len(node.users) != 1:
        return False
    copy = next(iter(node.users))
    if copy.target is not aten.copy_.default or copy.args[0] is node or copy.args[1:2] != (node,):
        return False
    mine, theirs = _put_back_views(node.args[0]), _put_back_views(copy.args[0])
    if mine is None or theirs is None or len(mine) != len(theirs) or mine[0] is not theirs[0] or len(mine) < 2:
        return False
    if any(a.target is not b.target or a.args[1:] != b.args[1:] or a.kwargs != b.kwargs
           for a, b in zip(mine[1:], theirs[1:])):
        return False
    between = [u for u in mine[0].users if order[node] < order[u] < order[copy]]
    return between == [theirs[1]] and _keeps_dtype(node, functional)


def _put_back_views(view) -> list[Node] | None:
    """[tensor, view, ..., `view`]: `view` as slices and selections, each used once, of a tensor
    that is not one of them."""
    chain = [view]
    while isinstance(chain[0], Node) and chain[0].op == "call_function" and chain[0].target in _PUT_BACK:
        if len(chain[0].users) != 1:
            return None
        chain.insert(0, chain[0].args[0])
    return chain if isinstance(chain[0], Node) else None


def _write_chain(node: Node, functional, order: dict[Node, int], fresh: set[Node]) -> list[Node] | None:
    """[tensor, view, ..., view written] where `node` writes through slices and selections of a
    fresh tensor as the module docstring allows; None otherwise."""
    chain = _put_back_views(node.args[0] if node.args else None)
    if chain is None or len(chain) < 2 or chain[0] not in fresh or node.users:
        return None
    if not all(_read_before(u, node, order) for u in chain[0].users if u is not chain[1]):
        return None
    written = chain[-1].meta.get("val")
    return chain if isinstance(written, torch.Tensor) and _functional_dtype(node, functional) == written.dtype else None


def _read_before(user: Node, node: Node, order: dict[Node, int]) -> bool:
    """Whether `user` of a tensor `node` changes is over with it by then: later, it reads the
    tensor as changed (its input is redirected); earlier, it makes a fresh tensor, or is a view
    that only such earlier reads use (the `t[i]` that `t[i] += v` added to)."""
    if order[user] > order[node] or _makes_fresh_tensor(user):
        return True
    return _is_view(user) and all(order[u] < order[node] and _read_before(u, node, order) for u in user.users)


def _write_through(graph: Graph, node: Node, functional, chain: list[Node], order: dict[Node, int]) -> Node:
    """Replace the write `node` by the functional op on the view, put back view by view into the
    tensor (`chain[0]`), whose uses after the write read the result instead; returns it."""
    base = chain[0]
    later = [u for u in base.users if order[u] > order[node]]
    with graph.inserting_before(node):
        value = new_call(graph, functional, node.args, node.kwargs, node)
        order[value] = order[node]
        for view in reversed(chain[1:]):
            value = new_call(graph, _PUT_BACK[view.target], (view.args[0], value, *view.args[1:]), view.kwargs, node)
            order[value] = order[node]
    for u in later:
        u.replace_input_with(base, value)
    graph.erase_node(node)
    return value


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
    return _keeps_dtype(node, functional)


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
    if target is aten.contiguous.default:     # a copy where its input is not in that layout already
        val = node.args[0].meta.get("val") if isinstance(node.args[0], Node) else None
        layout = node.kwargs.get("memory_format", torch.contiguous_format)
        return isinstance(val, torch.Tensor) and not val.is_contiguous(memory_format=layout)
    return isinstance(target, torch._ops.OpOverload) and not target._schema.is_mutable and \
        all(r.alias_info is None for r in target._schema.returns)


def _is_view(node: Node) -> bool:
    """An ATen op whose result may alias its first operand (a view, a reshape, `contiguous`)."""
    target = node.target
    return node.op == "call_function" and isinstance(target, torch._ops.OpOverload) and \
        not target._schema.is_mutable and bool(target._schema.returns) and \
        target._schema.returns[0].alias_info is not None and bool(node.args) and isinstance(node.args[0], Node)
