"""`x[mask] += v`, `x[mask] *= 2`, `x[mask] = f(x[mask], y[mask])`: updates of the elements a bool
mask selects, computed from elements the same mask selects, as one `where` over the whole tensors.

torch.export captures `x[mask] += v` as `index_put(x, [mask], index(x, [mask]) + v)`, whose middle
has as many elements as the mask has true values: a size read from the data, which Cuvil does not
compile. When every value put comes from elementwise ops on elements the same mask selects (and
on numbers, or tensors that broadcast against the selection the same way as against the whole),
each selected element's new value is that op applied at its own place, so the put is
`where(mask, f(x, y), x)`, and no size depends on the data. So it is where the mask selects whole
rows and f computes each row from that row alone (a linear, a layer norm or a softmax over the
dims after the mask's: X-MOD's `out[mask] = adapter(h[mask])`): f over the whole tensor gives each
selected row's value at its place, at the cost of computing the rows the mask leaves. Anything else (a selection summed,
returned, or put through another mask) is left as it is, and refused at import as before.
"""
from __future__ import annotations

import operator

import torch
import torch.fx

from ..errors import CuvilUnsupportedOpError
from ..ir import DType
from .fx_edit import new_call
from .locations import node_frame

aten = torch.ops.aten

# nodes that only state facts about the selection's size: erased with it
_SIZE_FACTS = {aten.sym_size.int, aten._assert_scalar.default, aten.sym_constrain_range_for_size.default,
               aten.sym_constrain_range.default}


def rewrite_masked_updates(graph: torch.fx.Graph) -> bool:
    """Rewrite every masked update the module docstring describes; True if any was."""
    changed = False
    for put in [n for n in graph.nodes if n.op == "call_function" and n.target is aten.index_put.default]:
        changed |= _rewrite(graph, put)
    return changed


def _rewrite(graph: torch.fx.Graph, put: torch.fx.Node) -> bool:
    target, indices, values = put.args[:3]
    accumulate = put.args[3] if len(put.args) > 3 else put.kwargs.get("accumulate", False)
    lead = len(indices) - 1                      # dims before the mask's, taken whole (`y[:, mask]`)
    if lead < 0 or any(i is not None for i in indices[:-1]) or not isinstance(indices[-1], torch.fx.Node) \
            or not isinstance(values, torch.fx.Node):
        return False
    mask, full = indices[-1], _val(target)
    k = _val(mask).dim()
    if _val(mask).dtype != torch.bool or _val(mask).shape != full.shape[lead:lead + k] or (lead and k != 1):
        return False
    rest = full.dim() - lead - k                 # the dims after the mask's, taken whole
    selections: list[torch.fx.Node] = []
    if not _elementwise_of_selections(values, indices, full.shape, rest, selections) or not selections:
        return False
    if _val(values).dtype != full.dtype:
        frame = node_frame(put)
        raise CuvilUnsupportedOpError("aten.index_put.default", str(frame) if frame else None,
                                      f"values of {_name(_val(values).dtype)} put into a tensor of "
                                      f"{_name(full.dtype)}: eager "
                                      f"raises 'Index put requires the source and destination dtypes match'")
    replaced = {s: s.args[0] for s in selections}
    with graph.inserting_before(put):
        whole = _rebuild(graph, values, replaced)
        if accumulate:
            whole = new_call(graph, aten.add.Tensor, (target, whole), {}, put)
        where_mask = mask                        # broadcast from the right: the mask's dims, then rest
        for _ in range(rest):
            where_mask = new_call(graph, aten.unsqueeze.default, (where_mask, -1), {}, put)
        result = new_call(graph, aten.where.self, (where_mask, whole, target), {}, put)
    put.replace_all_uses_with(result)
    graph.erase_node(put)
    _erase_dead(graph, selections, set(replaced))
    return True


def _elementwise_of_selections(node, indices: list, shape, rest: int, selections: list) -> bool:
    """Whether `node` is elementwise ops over `index(base, indices)` nodes (base of `shape`) and
    operands that broadcast against the selection as against the whole (numbers, and tensors
    whose dims reach no further than the dims after the mask's, or are 1 from there); the
    selections found go into `selections`."""
    if not isinstance(node, torch.fx.Node):
        return isinstance(node, (int, float, bool))
    if node.op == "call_function" and node.target is aten.index.Tensor:
        base, picks = node.args[0], node.args[1]
        if len(picks) == len(indices) and all(_same_value(a, b) for a, b in zip(picks, indices)) \
                and _val(base).shape == shape:
            selections.append(node)
            return True
        return False
    val = _val(node)
    if val is None or not isinstance(val, torch.Tensor):
        return False
    if not _depends_on_selection(node):
        # aligned from the right: 1 along the selection's count (and, with the mask leading, before
        # it too: those dims would meet the mask's dims in the whole)
        before = val.shape[:max(0, val.dim() - rest)]
        if not before:
            return True
        return before[-1] == 1 if len(indices) > 1 else all(d == 1 for d in before)
    if node.op == "call_function" and _within_rows(node, rest):
        # the selected rows go on; the weights must be the same for every row
        weights = list(node.args[1:]) + list(node.kwargs.values())
        return not any(isinstance(w, torch.fx.Node) and _depends_on_selection(w) for w in weights) \
            and _elementwise_of_selections(node.args[0], indices, shape, rest, selections)
    if node.op != "call_function" or not _is_elementwise(node):
        return False
    args = list(node.args) + [v for v in node.kwargs.values() if isinstance(v, torch.fx.Node)]
    return all(_elementwise_of_selections(a, indices, shape, rest, selections) for a in args)


def _last_dim(node: torch.fx.Node) -> int | None:
    """1 where a softmax runs along its input's last dim."""
    dim, rank = node.args[1], _val(node.args[0]).dim()
    return 1 if rank and dim % rank == rank - 1 else None


# ops that compute each row of their first operand from that row alone, and how many trailing dims
# a row spans: applied to the whole tensor, a selected row comes out as it would selected
_ROW_OPS = {aten.linear.default: lambda n: 1, aten.layer_norm.default: lambda n: len(n.args[1]),
            aten._softmax.default: _last_dim, aten._log_softmax.default: _last_dim,
            aten.softmax.int: _last_dim, aten.log_softmax.int: _last_dim}
_ALONG_A_DIM = (aten._softmax.default, aten._log_softmax.default, aten.softmax.int, aten.log_softmax.int)


def _within_rows(node: torch.fx.Node, rest: int) -> bool:
    """Whether `node` is a row op (`_ROW_OPS`: X-MOD's `out[mask] = adapter(h[mask])`, a linear of
    the selected rows) whose rows lie within the dims after the mask's, which the selection takes
    whole."""
    span = _ROW_OPS[node.target](node) if node.target in _ROW_OPS else None
    return span is not None and span <= rest


def _same_value(a, b) -> bool:
    """Whether two nodes compute the same value: one node, or one op of the same operands (a mask
    written out twice, `y[z > 0] = y[z > 0] * 2`)."""
    if a is b or (a is None and b is None):
        return True
    return (isinstance(a, torch.fx.Node) and isinstance(b, torch.fx.Node) and a.op == b.op == "call_function"
            and a.target is b.target and a.kwargs == b.kwargs and len(a.args) == len(b.args)
            and all(_same_value(x, y) if isinstance(x, torch.fx.Node) else x == y for x, y in zip(a.args, b.args)))


def _is_elementwise(node: torch.fx.Node) -> bool:
    if node.target is aten._to_copy.default:        # a dtype conversion
        return set(node.kwargs) <= {"dtype"}
    if node.target is aten.floor_divide.default:    # elementwise, though torch does not tag it so
        return True
    return isinstance(node.target, torch._ops.OpOverload) and torch.Tag.pointwise in node.target.tags


def _depends_on_selection(node: torch.fx.Node) -> bool:
    """Whether a selection by a mask (`index` with a bool index) is among `node`'s inputs."""
    seen, todo = set(), [node]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == "call_function" and n.target is aten.index.Tensor and any(
                isinstance(i, torch.fx.Node) and _val(i) is not None and _val(i).dtype == torch.bool
                for i in n.args[1]):
            return True
        todo += [a for a in n.all_input_nodes]
    return False


def _rebuild(graph: torch.fx.Graph, node, replaced: dict):
    """`node` computed over the whole tensors: each selection replaced by its base."""
    if not isinstance(node, torch.fx.Node):
        return node
    if node in replaced:
        return replaced[node]
    if not _depends_on_selection(node):
        return node
    args = tuple(_rebuild(graph, a, replaced) for a in node.args)
    if node.target in _ALONG_A_DIM:
        args = (args[0], -1, *args[2:])      # the selection's last dim, whatever the whole's rank
    kwargs = {k: _rebuild(graph, v, replaced) for k, v in node.kwargs.items()}
    replaced[node] = new_call(graph, node.target, args, kwargs, node)
    return replaced[node]


def _erase_dead(graph: torch.fx.Graph, selections: list[torch.fx.Node], rebuilt: set) -> None:
    """Erase the selections and the ops computed from them (`rebuilt`), with the facts about the
    selection's size, when nothing else reads them (else the import refuses the selection)."""
    closure, todo = [], list(selections)
    while todo:
        n = todo.pop()
        if n in closure:
            continue
        closure.append(n)
        todo += list(n.users)
    if any(n not in rebuilt and n.target not in _SIZE_FACTS and not _is_size_arithmetic(n) for n in closure):
        return
    order = {n: i for i, n in enumerate(graph.nodes)}
    for n in sorted(closure, key=order.get, reverse=True):
        graph.erase_node(n)


def _is_size_arithmetic(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and getattr(node.target, "__module__", None) in (operator.__name__, "_operator")


def _name(dtype: torch.dtype) -> str:
    """Cuvil's name of a dtype (`f32`), or torch's where Cuvil has none (`float64`)."""
    try:
        return str(DType.from_torch(dtype))
    except (TypeError, KeyError, ValueError):
        return str(dtype).removeprefix("torch.")


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None
