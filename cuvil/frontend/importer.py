"""The FX walk: a core-ATen ExportedProgram -> one Cuvil graph function.

Each `call_function` node is lowered by its row in `aten_table.ATEN_TABLE`. A row receives a
`Lowering` (the builder plus helpers for the node being imported) and the node's arguments bound
to the ATen schema (defaults filled in, FX nodes replaced by Cuvil values, symbolic ints by Cuvil
dims). After every row the importer checks the Cuvil result types against torch's own
(`node.meta["val"]`), so a wrong row fails at import, naming the op and the source line.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sympy
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes
from torch.export.graph_signature import ConstantArgument, InputKind, OutputKind, TensorArgument
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from ..errors import CuvilError, CuvilUnsupportedOpError, CuvilVerifyError
from ..ir import Builder, DType, Function, Loc, Module, TensorType, Value
from ..ir.types import Dim, dims_equal
from ..runtime.exprs import binding
from .complex_pairs import as_pairs
from .locations import SourceFrame, node_frame
from .random_draws import DRAWN, Draw, imported_draw, is_random, refuse_random
from .static_values import static_constants
from .symbols import SymbolTable


@dataclass(frozen=True)
class Unavailable:
    """A result Cuvil does not produce (e.g. the saved mean of native_layer_norm); using it is an error."""
    what: str


@dataclass
class _Const:
    """A parameter/buffer placeholder; becomes a `cuvil.const` op at its first use."""
    name: str
    tensor: torch.Tensor
    value: Value | None = None


def op_name(target) -> str:
    """`aten.relu.default` for ATen overloads, the function name otherwise."""
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    return getattr(target, "__name__", str(target))


def bind(target, args: tuple, kwargs: dict) -> list:
    """An ATen call's arguments in schema order, with defaults filled in."""
    if not isinstance(target, torch._ops.OpOverload):
        return list(args)
    out = []
    for i, a in enumerate(target._schema.arguments):
        if i < len(args) and not a.kwarg_only:
            out.append(args[i])
        elif a.name in kwargs:
            out.append(kwargs[a.name])
        else:
            out.append(a.default_value if a.has_default_value() else None)
    return out


class Lowering:
    """What a table row works with: emit ops at the current node's location, read torch's
    result metadata, make literals, casts and normalised axes."""

    def __init__(self, fn: Function, module: Module, symbols: SymbolTable):
        self.builder = Builder(fn)
        self.module = module
        self.symbols = symbols
        self.node: torch.fx.Node | None = None
        self.frame: SourceFrame | None = None
        self.data_bounds: dict = {}     # symbols of tensor values read by assertions: their (lo, hi)
        self.assertions: list[tuple[Value, str, SourceFrame | None]] = []   # checks of tensor values: `_return`

    # -- emitting
    @property
    def loc(self) -> Loc | None:
        return self.frame.loc if self.frame else None

    def op(self, name: str, *operands: Value, **attrs) -> Value:
        return self.builder.create(name, operands, attrs, self.loc).result

    def multi(self, name: str, operands: list[Value], **attrs) -> list[Value]:
        return self.builder.create(name, operands, attrs, self.loc).results

    def scalar(self, value, dtype: DType):
        """A Python number as an attribute value of `dtype`'s kind."""
        if isinstance(value, sympy.Basic):
            self.unsupported(f"a symbolic size ({value}) used as a tensor value")
        return float(value) if dtype.is_float else bool(value) if dtype is DType.bool else int(value)

    def literal(self, value, dtype: DType) -> Value:
        if isinstance(value, sympy.Basic) and dtype is not DType.bool:   # a dynamic size as a value
            return self.op("cuvil.size", size=[value], dtype=dtype)
        return self.op("cuvil.literal", value=self.scalar(value, dtype), dtype=dtype)

    def const(self, c: _Const) -> Value:
        if c.value is None:
            dtype = self.dtype_of(c.tensor, f"constant '{c.name}'")
            self.module.constants[c.name] = c.tensor
            c.value = self.builder.create("cuvil.const", (), {"name": c.name}, None,
                                          [TensorType(dtype, tuple(c.tensor.shape))]).result
        return c.value

    def constant(self, stem: str, tensor: torch.Tensor) -> Value:
        """A new module constant holding `tensor`, named `stem` (made unique)."""
        name, n = stem, 1
        while name in self.module.constants:
            name, n = f"{stem}.{n}", n + 1
        return self.const(_Const(name, tensor))

    def cast(self, v: Value, dtype: DType) -> Value:
        return v if v.type.dtype is dtype else self.op("cuvil.cast", v, dtype=dtype)

    def tensor(self, x, dtype: DType) -> Value:
        """A tensor operand of `dtype`: a value cast to it, or a Python scalar as a literal."""
        return self.cast(x, dtype) if isinstance(x, Value) else self.literal(x, dtype)

    # -- torch's view of the current node
    def val(self, i: int | None = None):
        v = self.node.meta["val"]
        return v if i is None else v[i]

    def out_shape(self, i: int | None = None) -> tuple:
        return self.symbols.shape(self.val(i))

    def out_dtype(self, i: int | None = None) -> DType:
        return self.dtype_of(self.val(i), "result")

    def dtype_of(self, t: torch.Tensor, what: str) -> DType:
        try:
            return DType.from_torch(t.dtype)
        except TypeError as e:
            self.unsupported(f"{what}: {e}")

    def promoted(self, *xs, int_to_float: bool = False) -> DType:
        """torch's type promotion of values and Python scalars (0-d and n-d tensors weigh differently)."""
        dummies = [torch.empty((1,) * x.type.rank, dtype=x.type.dtype.torch) if isinstance(x, Value) else x
                   for x in xs]
        _, result = elementwise_dtypes(*dummies, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)
        if int_to_float and not result.is_floating_point:
            result = torch.get_default_dtype()
        return DType.from_torch(result)

    # -- normalisation
    def torch_dim(self, x) -> Dim:
        """A torch int or SymInt (from node metadata) as a Cuvil dim. Row arguments are converted already."""
        return self.symbols.dim(x)

    @staticmethod
    def axis(d: int, rank: int) -> int:
        return d + rank if d < 0 else d

    def axes(self, dims, rank: int) -> list[int]:
        if dims is None:
            return []
        return [self.axis(d, rank) for d in ([dims] if isinstance(dims, int) else dims)]

    def error(self, detail: str) -> CuvilUnsupportedOpError:
        return CuvilUnsupportedOpError(op_name(self.node.target), str(self.frame) if self.frame else None, detail)

    def unsupported(self, detail: str):
        raise self.error(detail)


@dataclass
class ImportedGraph:
    module: Module
    input_names: list[str]
    symbols: SymbolTable
    tensor_positions: list[int]   # which of the flattened user inputs are the function's arguments
    draws: list[Draw]             # the random tensors each call draws: the function's last arguments


def import_graph(ep: torch.export.ExportedProgram, table: dict, name: str,
                 hints: dict[str, dict[int, str]], default_max: int) -> ImportedGraph:
    outputs = _user_outputs(ep)
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    user_specs = [s for s in ep.graph_signature.input_specs if s.kind is InputKind.USER_INPUT]
    tensor_positions = [i for i, s in enumerate(user_specs) if isinstance(s.arg, TensorArgument)]
    user = [placeholders[user_specs[i].arg.name] for i in tensor_positions]
    symbols = SymbolTable(_same_sizes(ep, user, hints))
    for node in user:   # graph inputs are named after the parameters, as the hints are
        _add_symbols(symbols, ep, node, hints.get(node.name, {}), default_max)

    drawn = [n for n in ep.graph.nodes if n.op == "call_function" and n.target in DRAWN]
    draws = [_draw(n, symbols) for n in drawn]

    module = Module()
    fn = module.add_function(Function(name, [_arg_type(n, symbols) for n in user + drawn],
                                      [n.name for n in user + drawn], symbols.ranges))
    lowering = Lowering(fn, module, symbols)
    env: dict[torch.fx.Node, Any] = {**dict(zip(user + drawn, fn.args)), **_other_inputs(ep, placeholders),
                                     **static_constants(ep, lambda name, t: _Const(name, t.detach()))}
    for node in ep.graph.nodes:
        if node.op == "call_function":
            if node not in env:     # (a draw is an argument)
                env[node] = _lower(lowering, table, node, env)
        elif node.op == "output":
            _return(lowering, env, node, outputs)
        elif node.op != "placeholder":
            _refuse_node(node)
    fn.symbols.update(symbols.ranges)       # as ops' constant bounds narrowed them
    return ImportedGraph(module, [n.name for n in user], symbols, tensor_positions, draws)


def _draw(node: torch.fx.Node, symbols: SymbolTable) -> Draw:
    """A random op drawn at each call (random_draws.py), its result sized in Cuvil dims."""
    frame = node_frame(node)
    where = str(frame) if frame else None
    try:
        symbols.shape(node.meta["val"])
        return imported_draw(node, symbols.dim, where)
    except (TypeError, KeyError) as e:
        raise CuvilUnsupportedOpError(str(node.target), where, f"a random tensor whose size Cuvil cannot "
                                                               f"follow ({e})") from None


# ops that require two of their operands' sizes equal, which torch checks only when they run:
# {op: ((operand, axis), (operand, axis))}
_EQUAL_SIZES = {torch.ops.aten.scaled_dot_product_attention.default: ((1, -2), (2, -2))}


def _required_equal(ep) -> dict:
    """Input symbols that an op requires equal to another (torch symbol -> the one it is): under
    Dynamo a cache's keys and values each get a length of their own, `1 + s0` and `1 + s1`, and
    attention needs them equal, as eager checks when it runs. The guard then checks it per call."""
    same = {}
    for node in ep.graph.nodes:
        pairs = _EQUAL_SIZES.get(node.target) if node.op == "call_function" else None
        if pairs is None:
            continue
        a, b = (node.args[i].meta["val"].shape[axis] for i, axis in pairs)
        if not (isinstance(a, torch.SymInt) and isinstance(b, torch.SymInt)):
            continue
        difference = sympy.expand(a.node.expr - b.node.expr)
        symbols = sorted(difference.free_symbols, key=str)
        if len(symbols) == 2 and sympy.expand(difference - (symbols[0] - symbols[1])) * \
                sympy.expand(difference + (symbols[0] - symbols[1])) == 0:
            same[symbols[1]] = same.get(symbols[0], symbols[0])
    return same


def _same_sizes(ep, user: list[torch.fx.Node], hints: dict[str, dict[int, str]]) -> dict:
    """Input symbols that stand for another's size: those an op requires equal, and those of dims
    the user named alike that torch kept apart (an open dim is a symbol per input: BERT's batch in
    its ids and in its mask). Either is one Cuvil symbol, which the guard checks on each call."""
    same = _required_equal(ep)

    def root(s):
        while s in same:
            s = same[s]
        return s
    first = {}
    for node in user:
        for axis, name in hints.get(node.name, {}).items():
            size = node.meta["val"].shape[axis]
            if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                a, b = root(first.setdefault(name, size.node.expr)), root(size.node.expr)
                if a != b:
                    same[b] = a
    return same


def _add_symbols(symbols: SymbolTable, ep, node: torch.fx.Node, hint: dict[int, str], default_max: int) -> None:
    """Number the input's dynamic dims, with the user's names and the ranges torch.export settled on."""
    for axis, d in enumerate(node.meta["val"].shape):
        if not isinstance(d, torch.SymInt):
            continue
        # a dim asked as a multiple (q*_h) binds torch's symbol, the quotient (runtime/exprs.binding)
        bound = binding(d.node.expr)
        if bound is None:
            continue
        s, q = bound
        vr = ep.range_constraints.get(s)
        lo = int(vr.lower) if vr is not None else 1
        # torch's int_oo (no upper bound) says it is finite; it is no Integer
        hi = int(vr.upper) if vr is not None and vr.upper.is_Integer else default_max // q
        symbols.add(s, hint.get(axis), lo, hi, None if d.node.hint is None else d.node.hint // q)


def _arg_type(node: torch.fx.Node, symbols: SymbolTable) -> TensorType:
    val = node.meta["val"]
    try:
        return TensorType(DType.from_torch(val.dtype), symbols.shape(val))
    except TypeError as e:
        raise CuvilUnsupportedOpError("input dtype", None, f"input '{node.name}': {e}") from None


def _other_inputs(ep, placeholders: dict) -> dict:
    """Parameters, buffers and lifted constants (as lazily emitted consts); baked-in scalar inputs."""
    out = {}
    for spec in ep.graph_signature.input_specs:
        node = placeholders[spec.arg.name]
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            source = ep.constants if spec.target in ep.constants else ep.state_dict
            out[node] = _Const(spec.target, as_pairs(source[spec.target].detach()))
        elif isinstance(spec.arg, ConstantArgument):
            out[node] = spec.arg.value
        elif isinstance(ep.constants.get(spec.target), torch.Generator):
            frame = next((f for f in map(node_frame, node.users) if f is not None), None)
            raise CuvilUnsupportedOpError("torch.Generator", str(frame) if frame else None,
                                          "a random op given a generator the model makes: Cuvil draws a model's random "
                                          "tensors from torch's default generator")
        elif not isinstance(spec.arg, TensorArgument):
            raise CuvilUnsupportedOpError(f"{type(spec.arg).__name__} input", None,
                                          f"input '{node.name}' ({spec.kind.name.lower()}); Cuvil takes tensors")
    return out


def _refuse_node(node: torch.fx.Node):
    """A node that is not an op: the branches of torch.cond, while_loop or map (`get_attr` of a
    subgraph), named by the op that runs them, at the user's line."""
    runner = next((u for u in node.users if isinstance(u.target, torch._ops.HigherOrderOperator)), None)
    if runner is not None:
        frame = node_frame(runner)
        raise CuvilUnsupportedOpError(f"torch.{runner.target.name()}", str(frame) if frame else None,
                                      "control flow as a higher-order op: Cuvil compiles straight-line programs "
                                      "(a branch on sizes, in Python, compiles a variant per branch taken)")
    raise CuvilUnsupportedOpError(f"FX {node.op} node", None, f"node '{node.name}'")


def _return(lowering: Lowering, env: dict, node: torch.fx.Node, outputs: list[int]) -> None:
    lowering.node, lowering.frame = node, None
    results = [_operand(lowering, env, node.args[0][k], f"output {i}") for i, k in enumerate(outputs)]
    for i, r in enumerate(results):
        if not isinstance(r, Value):
            raise CuvilUnsupportedOpError("non-tensor output", None, f"output {i} is {r!r}; Cuvil returns tensors only")
    # a check of tensor values (`torch._assert_async`) has no result: it rides on an output, whose
    # kernel checks it (so no pass drops it): the first that is not empty (an empty one's kernel
    # computes nothing), else the first
    if lowering.assertions and results:
        k = next((i for i, r in enumerate(results) if 0 not in r.type.shape), 0)
        for cond, message, frame in lowering.assertions:
            lowering.frame = frame
            results[k] = lowering.op("cuvil.check_true", results[k], cond, message=message)
    lowering.builder.create("cuvil.return", results)


def _user_outputs(ep) -> list[int]:
    """The positions of the graph's outputs the caller gets. A buffer 'mutation' that writes back
    the buffer itself (`self.b = self.b.to(device, dtype)` with the ones it has: CTRL's positional
    encoding) changes nothing and is left out; any other is refused."""
    buffers = {s.target: s.arg.name for s in ep.graph_signature.input_specs if s.kind is InputKind.BUFFER}
    written = ep.graph.output_node().args[0]
    outputs = []
    for k, spec in enumerate(ep.graph_signature.output_specs):
        if spec.kind is OutputKind.USER_OUTPUT:
            outputs.append(k)
        elif spec.kind is not OutputKind.BUFFER_MUTATION or spec.arg.name != buffers.get(spec.target):
            value = written[k]      # the new value: where the model computes it is where it writes it
            frame = node_frame(value) if isinstance(value, torch.fx.Node) else None
            raise CuvilUnsupportedOpError(
                "mutation", str(frame) if frame else None, f"the model updates '{spec.target}' in place "
                f"({spec.kind.name.lower()}); Cuvil imports pure inference functions")
    return outputs


def _operand(lowering: Lowering, env: dict, a, where: str):
    """An FX argument with nodes replaced by their Cuvil values (constants materialised on first use)."""
    if isinstance(a, torch.fx.Node):
        v = env[a]
        if isinstance(v, _Const):
            return lowering.const(v)
        if isinstance(v, Unavailable):
            lowering.unsupported(f"{where} uses {v.what}")
        return v
    if isinstance(a, (list, tuple)):
        return type(a)(_operand(lowering, env, x, where) for x in a)
    return a


def _lower(lowering: Lowering, table: dict, node: torch.fx.Node, env: dict):
    lowering.node, lowering.frame = node, node_frame(node)
    row = table.get(node.target)
    if row is None and is_random(node.target):
        refuse_random(node, str(lowering.frame) if lowering.frame else None)
    if row is None:
        lowering.unsupported(DATA_SIZED if _data_sized(node) else "")
    args = bind(node.target, _operand(lowering, env, node.args, "an argument"),
                {k: _operand(lowering, env, v, f"argument '{k}'") for k, v in node.kwargs.items()})
    try:
        result = row(lowering, *args)
        _check_result(lowering, result)
        if isinstance(result, (list, tuple)):
            return type(result)(_pinned(lowering, r) for r in result)
        return _pinned(lowering, result)
    except CuvilVerifyError as e:
        raise lowering.error(str(e)) from None
    except CuvilUnsupportedOpError as e:
        if e.source is None and lowering.frame is not None:    # a size torch computed that Cuvil dims refuse
            raise CuvilUnsupportedOpError(e.op_name, str(lowering.frame), e.detail) from None
        raise


DATA_SIZED = ("its result's size depends on tensor values, and a Cuvil program's sizes depend on its inputs' "
              "sizes only; torch.compile(model, backend=\"cuvil\") compiles the graphs before and after it with "
              "Cuvil and runs it in eager PyTorch between them")


def _data_sized(node: torch.fx.Node) -> bool:
    """A result whose size torch.export could only name by an unbacked symbol (`nonzero`, `unique`,
    `masked_select`)."""
    vals = node.meta.get("val")
    vals = vals if isinstance(vals, (list, tuple)) else [vals]
    return any(isinstance(v, torch.Tensor) and free_unbacked_symbols(v.shape) for v in vals)


def _pinned(lowering: Lowering, v):
    """A value whose size expression takes one value over the ranges torch.export settled on
    (a strided conv's `(W - 3)//2 + 1` width, which a linear then fixes to 4) with that size: a
    reshape, free, so that the ops after it see the number torch sees."""
    if not isinstance(v, Value):
        return v
    shape = [lowering.symbols.pin(d) for d in v.type.shape]
    return v if list(v.type.shape) == shape else lowering.op("cuvil.reshape", v, shape=shape)


def _bind_unsized(symbols: SymbolTable, want: torch.Tensor, got: Value) -> None:
    """Dims torch's trace could not size (a slice between bounds read with `.item()` gets a new
    `u` symbol) take the size Cuvil inferred, for the ops after it."""
    if want.dim() != got.type.rank:
        return
    for d, mine in zip(want.shape, got.type.shape):
        if isinstance(d, torch.SymInt) and d.node.expr.is_Symbol and str(d.node.expr).startswith("u") \
                and not symbols.knows(d.node.expr):
            symbols.bind(d.node.expr, mine)


def _check_result(lowering: Lowering, result) -> None:
    """Cuvil's inferred types must equal torch's; a mismatch is a bug in a row or an op's inference."""
    val = lowering.node.meta.get("val")
    pin = lowering.symbols.pin
    pairs = zip(result, val) if isinstance(result, (list, tuple)) else [(result, val)]
    for got, want in pairs:
        if not isinstance(got, Value) or not isinstance(want, torch.Tensor):
            continue
        _bind_unsized(lowering.symbols, want, got)
        expect = TensorType(lowering.dtype_of(want, "result"), lowering.symbols.shape(want))
        same = got.type.dtype is expect.dtype and got.type.rank == expect.rank and all(
            a == b or dims_equal(pin(a), pin(b)) for a, b in zip(got.type.shape, expect.shape))
        if not same:
            where = f" at {lowering.frame}" if lowering.frame else ""
            raise CuvilError(f"internal error importing {op_name(lowering.node.target)}{where}: "
                             f"Cuvil inferred {got.type}, torch says {expect}")
