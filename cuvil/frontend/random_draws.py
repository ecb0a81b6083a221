"""Random tensors a model makes (`torch.randn_like(x)`, `torch.rand(n, 3)`, `t.normal_(0, 2)`),
drawn from torch's generator at each call, before the engine runs.

An op whose random values depend only on sizes, dtypes and constants is not compiled: it becomes
an extra argument of the graph function (after the user's), and each call runs the op itself, the
same ATen overload with the same arguments at the call's sizes (a tensor argument, whose values
these ops ignore, as `torch.empty` of its size). Eager runs those ops in program order between
its others, which draw nothing, so drawing them all first, in that order, takes the same numbers
from the generator: after `torch.manual_seed` the results equal eager's. Ops whose draws depend on
values the model computes are rewritten as eager's CPU kernels compute them (`rewrite_random_ops`:
`torch.bernoulli(p)`, dropout in training mode, `torch.multinomial` without replacement); their
other forms are refused, because torch's decompositions of them draw other numbers than eager.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import CuvilError, CuvilUnsupportedOpError
from ..runtime.exprs import evaluate, to_postfix

aten = torch.ops.aten

# the overloads drawn before the run: every argument a size, a dtype, a constant or a tensor
# whose values the op does not read (the functional forms torch's functionalisation gives
# `normal_`, `uniform_`, `bernoulli_(p)`, ...)
DRAWN = frozenset({
    aten.rand.default, aten.randn.default, aten.randint.default, aten.randint.low, aten.randperm.default,
    aten.rand_like.default, aten.randn_like.default, aten.randint_like.default, aten.randint_like.low_dtype,
    aten.normal.float_float, aten.normal_functional.default, aten.uniform.default, aten.bernoulli.p,
    aten.exponential.default, aten.log_normal.default, aten.cauchy.default, aten.geometric.default,
    aten.random.default, getattr(aten.random, "from"), aten.random.to,
})

# random ops whose torch decompositions draw other numbers than eager: kept whole, so that they
# are refused by name instead of compiled to other values than eager's
NOT_DECOMPOSED = (aten.bernoulli.default, aten.rrelu.default)


def rewrite_random_ops(graph: torch.fx.Graph) -> bool:
    """Random ops whose draws depend on computed values, rewritten as eager's CPU kernels compute
    them, as drawn ops (values ignored, sizes only) and ordinary ones; True if any was rewritten.
    Forms whose eager kernel draws otherwise stay, and are refused by name."""
    changed = False
    for node in [n for n in graph.nodes if n.op == "call_function" and n.target in _REWRITES]:
        if node.kwargs.get("generator") is None and _REWRITES[node.target](graph, node):
            graph.erase_node(node)
            changed = True
    return changed


def _multinomial(graph: torch.fx.Graph, node: torch.fx.Node) -> bool:
    """`torch.multinomial(p, n)` without replacement (or of one sample): q = an Exp(1) draw of p's
    size, then the index of the largest p / q (argmax for one sample, topk's indices for n), after
    eager's checks of p. One with replacement and several samples is not rewritten."""
    p, n = node.args[:2]
    replacement = node.args[2] if len(node.args) > 2 else node.kwargs.get("replacement", False)
    if (replacement and n != 1) or not isinstance(p, torch.fx.Node):
        return False
    with graph.inserting_before(node):
        call = _caller(graph, node)
        valid = call(aten.all.default, call(aten.logical_and.default, call(aten.isfinite.default, p),
                                            call(aten.ge.Scalar, p, 0)))
        call(aten._assert_async.msg, valid, "probability tensor contains either `inf`, `nan` or element < 0")
        positive = call(aten.all.default, call(aten.gt.Scalar, call(aten.sum.dim_IntList, p, [-1]), 0))
        call(aten._assert_async.msg, positive, "invalid multinomial distribution (sum of probabilities <= 0)")
        q = call(aten.exponential.default, call(aten.zeros_like.default, p), 1.0)   # (its values unread)
        ratio = call(aten.div.Tensor, p, q)
        picked = call(aten.argmax.default, ratio, -1, True) if n == 1 else \
            call(operator.getitem, call(aten.topk.default, ratio, n), 1)
    node.replace_all_uses_with(picked)
    return True


def _bernoulli(graph: torch.fx.Graph, node: torch.fx.Node) -> bool:
    """`torch.bernoulli(p)` of an f32 p: eager's CPU kernel draws one f32 uniform per element, in
    memory order, and keeps 1 where it lies below p: a `rand_like` draw compared with p, after
    eager's check of p. A half-precision p (eager draws f32 uniforms for its values, not uniforms
    of its dtype) and a p that is not contiguous (another order) are not rewritten."""
    p = node.args[0]
    val = p.meta.get("val") if isinstance(p, torch.fx.Node) else None
    if val is None or val.dtype != torch.float32 or not val.is_contiguous():
        return False
    with graph.inserting_before(node):
        call = _caller(graph, node)
        valid = call(aten.all.default, call(aten.logical_and.default, call(aten.ge.Scalar, p, 0),
                                            call(aten.le.Scalar, p, 1)))
        call(aten._assert_async.msg, valid, "Expected p_in >= 0 && p_in <= 1 to be true, but got false.")
        u = call(aten.rand_like.default, p)       # (p's values unread)
        drawn = call(aten._to_copy.default, call(aten.lt.Tensor, u, p), dtype=val.dtype)
    node.replace_all_uses_with(drawn)
    return True


def _dropout(graph: torch.fx.Graph, node: torch.fx.Node) -> bool:
    """Dropout in training mode (`F.dropout(x, p, training=True)`, Monte Carlo dropout), which
    torch's decompositions make `native_dropout`: eager's CPU `dropout` fills a noise tensor of x's
    size with `bernoulli_(1 - p)` (a drawn op), divides it by 1 - p and multiplies x by it. Only
    the output is rewritten; a use of the mask is refused."""
    x, p, train = (list(node.args) + [None])[:3]
    uses = list(node.users)
    if train is False or not all(u.target is operator.getitem and u.args[1] == 0 for u in uses):
        return False
    with graph.inserting_before(node):
        call = _caller(graph, node)
        if p == 0:
            out = x
        elif p == 1:
            out = call(aten.mul.Scalar, x, 0.0)
        else:
            noise = call(aten.bernoulli.p, x, 1 - p)     # (x's values unread)
            out = call(aten.mul.Tensor, x, call(aten.div.Scalar, noise, 1 - p))
    for u in uses:
        u.replace_all_uses_with(out)
        graph.erase_node(u)
    return True


_REWRITES = {aten.multinomial.default: _multinomial, aten.bernoulli.default: _bernoulli,
             aten.native_dropout.default: _dropout}


def _caller(graph: torch.fx.Graph, like: torch.fx.Node):
    """A function that adds a call before `like`, with its source location and torch's value."""
    def call(target, *args, **kwargs):
        vals = torch.fx.node.map_arg(args, lambda a: a.meta["val"])
        new = graph.call_function(target, args, kwargs)
        new.meta.update({k: like.meta[k] for k in ("stack_trace", "nn_module_stack") if k in like.meta})
        new.meta["val"] = target(*vals, **kwargs)
        return new
    return call


def is_random(target) -> bool:
    return isinstance(target, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in target.tags


@dataclass(frozen=True)
class Draw:
    """One random op run at each call. `args`/`kwargs` hold JSON-able values, with sizes as
    `{"size": e}` and tensor arguments as `{"empty": [e, ...], "dtype": name}`, where `e` is a
    Cuvil dim at import (`imported`) and a postfix expression over the program's symbols once
    `bound`."""
    op: str                  # "aten.randn_like.default"
    args: tuple
    kwargs: dict

    def bound(self, symbol_index: dict[str, int]) -> "Draw":
        def bind(v):
            if isinstance(v, dict) and "size" in v:
                return {"size": to_postfix(v["size"], symbol_index)}
            if isinstance(v, dict) and "empty" in v:
                return {**v, "empty": [to_postfix(d, symbol_index) for d in v["empty"]]}
            return [bind(x) for x in v] if isinstance(v, list) else v
        return Draw(self.op, tuple(bind(a) for a in self.args), {k: bind(v) for k, v in self.kwargs.items()})

    def tensor(self, symbols: list[int]) -> torch.Tensor:
        """Run the op at the call's symbol values (a bound draw)."""
        def value(v):
            if isinstance(v, list):
                return [value(x) for x in v]
            if not isinstance(v, dict):
                return v
            if "size" in v:
                return evaluate(v["size"], symbols)
            if "empty" in v:
                return torch.empty([evaluate(d, symbols) for d in v["empty"]], dtype=getattr(torch, v["dtype"]))
            kind, name = next(iter(v.items()))
            return getattr(torch, name) if kind in ("dtype", "layout", "memory_format") else torch.device(name)
        return _overload(self.op)(*(value(a) for a in self.args), **{k: value(v) for k, v in self.kwargs.items()})

    def state(self) -> list:
        return [self.op, list(self.args), self.kwargs]

    @staticmethod
    def from_state(state: list) -> "Draw":
        op, args, kwargs = state
        if _overload(op) not in DRAWN:
            raise CuvilError(f"a saved model draws with {op}, which Cuvil does not draw")
        return Draw(op, tuple(args), kwargs)


def _overload(name: str) -> torch._ops.OpOverload:
    namespace, packet, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload)


def imported_draw(node: torch.fx.Node, dim, where: str | None) -> Draw:
    """The draw of a DRAWN node, its sizes as Cuvil dims (`dim` converts torch's ints and SymInts)."""
    def refuse(detail: str):
        raise CuvilUnsupportedOpError(str(node.target), where, detail)

    def encode(a):
        if isinstance(a, torch.fx.Node):
            val = a.meta.get("val")
            if isinstance(val, torch.SymInt):
                return {"size": dim(val)}
            if isinstance(val, torch.Tensor):
                if not val.is_contiguous():
                    refuse("a random fill of a tensor that is not contiguous: eager fills it in another order")
                return {"empty": [dim(d) for d in val.shape], "dtype": str(val.dtype).removeprefix("torch.")}
            refuse(f"argument '{a.name}' is a {type(val).__name__}")
        if isinstance(a, (list, tuple)):
            return [encode(x) for x in a]
        if isinstance(a, torch.dtype):
            return {"dtype": str(a).removeprefix("torch.")}
        if isinstance(a, torch.layout):
            return {"layout": str(a).removeprefix("torch.")}
        if isinstance(a, torch.memory_format):
            return {"memory_format": str(a).removeprefix("torch.")}
        if isinstance(a, torch.device):
            if a.type != "cpu":
                refuse(f"a random tensor made on {a}; Cuvil runs on the CPU")
            return {"device": "cpu"}
        if isinstance(a, torch.Generator):
            refuse("a random op given its own generator: Cuvil draws from torch's default one")
        if a is None or isinstance(a, (bool, int, float, str)):
            return a
        refuse(f"an argument of type {type(a).__name__}")

    return Draw(str(node.target), tuple(encode(a) for a in node.args),
                {k: encode(v) for k, v in node.kwargs.items() if not (k == "generator" and v is None)})


def refuse_random(node: torch.fx.Node, where: str | None) -> Any:
    raise CuvilUnsupportedOpError(
        str(node.target), where,
        "its random numbers depend on values the model computes; Cuvil draws a model's random tensors from "
        "torch's generator before each run, those whose values depend only on sizes (torch.rand, randn, randint, "
        "randperm, their _like forms, and normal_, uniform_, bernoulli_(p), exponential_ of a new tensor)")
