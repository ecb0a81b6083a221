"""Inputs that are indices: token ids into an embedding, positions into an index_select.

A compiled gather reads a NaN row (0 for an integer table) for an index outside its table, where
eager PyTorch raises (codegen.md, gathers). For an index tensor the caller passes in, every value
can be checked at the call instead, before anything runs, and refused as eager refuses it: token
ids past the vocabulary are the usual case. `index_bounds` finds the arguments whose every
element reaches a gather's index operand unchanged (through reshapes, permutes, expands and
integer casts: ops that keep every value, so the check refuses exactly the calls eager refuses),
and the range the gather accepts; `Guard.match` (cuvil/compiled.py) and the native fast path
(`TensorCall`) check them on every call.

An index the model counts itself, `torch.arange(x.shape[1])` into a table of positions, runs past
the table when the dynamic dim it counts to does: `size_limits` gives the largest value each such
dim may take, and the guard refuses a larger one as eager does.
"""
from __future__ import annotations

from dataclasses import dataclass

from .ir.core import Function, Operation, Value
from .runtime.exprs import binding

# ops whose result holds every value of their first operand, and nothing else
_KEEP_VALUES = frozenset({"cuvil.reshape", "cuvil.permute", "cuvil.expand", "cuvil.squeeze", "cuvil.unsqueeze",
                          "cuvil.copy"})
# gather -> [(an index operand, the table dim it indexes)]
_GATHERS = {
    "cuvil.embedding": lambda op: [(op.operands[1], 0)],
    "cuvil.index_select": lambda op: [(op.operands[1], op.attrs["dim"])],
    "cuvil.gather": lambda op: [(op.operands[1], op.attrs["dim"])],
    "cuvil.index": lambda op: [(v, k) for k, v in enumerate(op.operands[1:])],
    "cuvil.index_put": lambda op: [(op.operands[1], 0)],      # a row it writes: checked as a gather's
}
_FROM_THE_END = ("cuvil.index", "cuvil.index_put")       # negative indices count from the end
_INDEX_DTYPES = ("i64", "i32")


@dataclass(frozen=True)
class IndexBound:
    lo: int             # the smallest index accepted (-n for advanced indexing, else 0)
    hi: int             # the largest (n - 1)
    what: str           # the gather, for the error: "the embedding at model.py:12 (30522 rows)"


def index_bounds(fn: Function) -> dict[int, IndexBound]:
    """{argument number: the values it may hold} for the arguments used as whole gather indices."""
    out: dict[int, IndexBound] = {}
    for op in fn.ops:
        pick = _GATHERS.get(op.name)
        if pick is None:
            continue
        table = op.operands[0].type
        for index, dim in pick(op):
            n = table.shape[dim]
            arg = _source_argument(index)
            if arg is None or not isinstance(n, int):
                continue
            lo = -n if op.name in _FROM_THE_END else 0
            bound = IndexBound(lo, n - 1, describe_gather(op, dim, n))
            old = out.get(arg.index)
            if old is not None:     # read by several gathers: what every one of them accepts
                what = old.what if bound.what in old.what else f"{old.what} and {bound.what}"
                bound = IndexBound(max(lo, old.lo), min(n - 1, old.hi), what)
            out[arg.index] = bound
    return out


@dataclass(frozen=True)
class SizeLimit:
    symbol: str         # a dynamic dim may be ...
    lo: int | None      # ... at least this
    hi: int | None      # ... and at most this,
    why: str            # or the call is refused as eager refuses it, for this reason


def size_limits(fn: Function) -> list[SizeLimit]:
    """The sizes of dynamic dims that eager refuses: an arange counting to one (`arange(s)`,
    `arange(2 * s)`, start >= 0, step > 0) whose values index a gather's table (of static size)
    unchanged runs past the table above some size; a topk of k elements needs k along its dim."""
    out = []
    for op in fn.ops:
        if op.name == "cuvil.argtopk" and op.attrs["k"]:
            bound = binding(op.operands[0].type.shape[op.attrs["dim"]])
            if bound is not None:
                where = f" at {op.loc.file}:{op.loc.line}" if op.loc else ""
                out.append(SizeLimit(bound[0].name, -(-op.attrs["k"] // bound[1]), None,
                                     f"the topk{where} selects k = {op.attrs['k']} elements along it"))
        pick = _GATHERS.get(op.name)
        if pick is None:
            continue
        for index, dim in pick(op):
            n = op.operands[0].type.shape[dim]
            source = _kept_values(index)
            if source.is_arg or source.owner.name != "cuvil.arange" or not isinstance(n, int):
                continue
            start, step = source.owner.attrs["start"], source.owner.attrs["step"]
            bound = binding(source.type.shape[0])      # the count: q * s
            if bound is None or not isinstance(start, int) or not isinstance(step, int) or start < 0 or step <= 0:
                continue
            symbol, q = bound
            # the last index, start + (q s - 1) step, stays below n
            out.append(SizeLimit(symbol.name, None, ((n - 1 - start) // step + 1) // q,
                                 f"the indices the model counts up to it run past {describe_gather(op, dim, n)}"))
    return out


def _kept_values(v: Value) -> Value:
    """What `v` copies every value of, through views and copies."""
    while not v.is_arg and v.owner.name in _KEEP_VALUES and v.owner.operands:
        v = v.owner.operands[0]
    return v


def _source_argument(v: Value) -> Value | None:
    """The function argument whose values `v` holds, all of them, or None."""
    while not v.is_arg:
        op: Operation = v.owner
        if op.name == "cuvil.cast" and op.operands[0].type.dtype.value in _INDEX_DTYPES \
                and v.type.dtype.value == "i64":
            v = op.operands[0]
        elif op.name in _KEEP_VALUES and op.operands:
            v = op.operands[0]
        else:
            return None
    return v if v.type.dtype.value in _INDEX_DTYPES else None


def index_outside(op: Operation, dim: int, n, lo) -> str:
    """The error of an index that a compiled gather, index_put or scatter finds outside its table."""
    return (f"an index lies outside {describe_gather(op, dim, n)}: indices must lie in [{lo}, {n - 1}] "
            f"(eager PyTorch raises too)")


def describe_gather(op: Operation, dim: int, n: int) -> str:
    where = f" at {op.loc.file}:{op.loc.line}" if op.loc else ""
    what = op.attrs["of"] if op.name == "cuvil.check_index" else op.name.removeprefix("cuvil.")
    size = f"{n} rows" if op.name == "cuvil.embedding" else f"size {n} in dim {dim}"
    return f"the {what}{where} ({size})"
