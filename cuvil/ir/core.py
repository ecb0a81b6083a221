"""The graph IR data model: values, operations, functions, modules, and op declarations.

One function is one SSA block: a list of operations ending in `cuvil.return`. Weights are
module constants referenced by name from `cuvil.const` ops; their data lives in
`Module.constants` and is never printed.
"""
from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterable, Sequence

import torch

from ..errors import CuvilVerifyError
from .types import DType, TensorType, symbol_ranges


# ----------------------------------------------------------------------------- locations

@dataclass(frozen=True)
class Loc:
    """Where an op came from in the user's code: `loc("model.py":12)` or `loc("model.py":12:5)`."""
    file: str
    line: int
    col: int = 0

    def __str__(self) -> str:
        file = self.file.replace("\\", "\\\\").replace('"', '\\"')
        col = f":{self.col}" if self.col else ""
        return f'loc("{file}":{self.line}{col})'


# ----------------------------------------------------------------------------- attributes

ATTR_KINDS = ("int", "float", "bool", "str", "ints", "floats", "dims", "dtype", "int?", "float?", "any")


@dataclass(frozen=True)
class Attr:
    """Declaration of one op attribute: its kind and default (`REQUIRED` if it has none).

    kinds: int, float (also accepts ints, inf, nan), bool, str, ints (list of int), floats,
    dims (list of dimensions, possibly symbolic), dtype, `int?` / `float?` (or none),
    any (scalar int/float/bool).
    """
    kind: str
    default: Any = None
    required: bool = False

    def __post_init__(self):
        assert self.kind in ATTR_KINDS, self.kind


def is_discardable(key: str) -> bool:
    """MLIR-style discardable attribute: a dotted name (`fuse.group`, `schedule.max_latency_us`) that
    any op may carry without declaring it. Passes annotate ops with them; op semantics ignore them."""
    return "." in key


def semantic_attrs(attrs: dict[str, Any]) -> dict[str, Any]:
    """`attrs` without the discardable ones: what infer/evaluate/verify of the op see."""
    if not any("." in k for k in attrs):
        return attrs
    return {k: v for k, v in attrs.items() if "." not in k}


def required(kind: str) -> Attr:
    return Attr(kind, required=True)


def optional(kind: str, default: Any = None) -> Attr:
    return Attr(kind, default)


# ----------------------------------------------------------------------------- op declarations

OP_REGISTRY: dict[str, type["OpDef"]] = {}


class OpDef:
    """Declaration of one op kind. Subclass it once per op and decorate with `@register_op`.

    - `name`: full name, `cuvil.relu` for built-ins, `mylib.foo` for user ops.
    - `operands`: operand names; a trailing `?` marks an optional one (absent when not given,
      only at the end), a trailing `*` a variadic tail.
    - `attrs`: attribute name -> `Attr`.
    - `tags`: policy tags that passes read instead of op names: elementwise, injective
      (pure index remapping), view, reduction, opaque (a library call), commutative, pure.
    - `amp`: mixed-precision policy (always / follow / never); `sandbox`: tier (safe / trusted).
    - `infer(operand_types, attrs) -> list[TensorType]`: symbolic shape and dtype inference;
      raises `ValueError` with a readable message on ill-formed input.
    - `evaluate(attrs, *tensors) -> Tensor | tuple[Tensor, ...]`: reference semantics (torch).
    - `verify(op, module)`: extra constraints beyond `infer`; raises `ValueError`.
    - `explicit_result_types`: the creator gives the result types (`cuvil.const`); `infer` cannot.
    """
    name: ClassVar[str]
    operands: ClassVar[tuple[str, ...]] = ()
    attrs: ClassVar[dict[str, Attr]] = {}
    tags: ClassVar[frozenset[str]] = frozenset()
    amp: ClassVar[str] = "never"
    sandbox: ClassVar[str] = "safe"
    doc: ClassVar[str] = ""
    explicit_result_types: ClassVar[bool] = False

    @staticmethod
    def infer(types: Sequence[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        raise NotImplementedError

    @staticmethod
    def evaluate(attrs: dict[str, Any], *args: torch.Tensor):
        raise NotImplementedError

    @staticmethod
    def verify(op: "Operation", module: "Module") -> None:
        pass

    @classmethod
    def operand_range(cls) -> tuple[int, int | None]:
        """(min, max) number of operands; max is None for variadic ops."""
        lo = sum(1 for o in cls.operands if not o.endswith(("?", "*")))
        if any(o.endswith("*") for o in cls.operands):
            return lo, None
        return lo, len(cls.operands)

    @classmethod
    def full_attrs(cls, attrs: dict[str, Any]) -> dict[str, Any]:
        """The given attributes with declared defaults filled in."""
        # lists are copied so that no two ops share (and a pass cannot mutate) a declared default
        out = {k: list(a.default) if isinstance(a.default, list) else a.default
               for k, a in cls.attrs.items() if not a.required}
        out.update(attrs)
        return out


def register_op(cls: type[OpDef]) -> type[OpDef]:
    """Class decorator: make an op kind known to the parser, verifier and interpreter."""
    if not getattr(cls, "name", None) or "." not in cls.name:
        raise ValueError(f"op class {cls.__name__} needs a dotted name such as 'mylib.my_op'")
    if cls.name in OP_REGISTRY and OP_REGISTRY[cls.name] is not cls:
        raise ValueError(f"op '{cls.name}' is already registered")
    cls.tags = frozenset(cls.tags)
    OP_REGISTRY[cls.name] = cls
    return cls


def lookup_op(name: str) -> type[OpDef] | None:
    return OP_REGISTRY.get(name)


# ----------------------------------------------------------------------------- values and ops

class Value:
    """An SSA value: a function argument or one result of an operation."""
    __slots__ = ("type", "owner", "index", "name", "uses")

    def __init__(self, type: TensorType, owner: "Operation | Function", index: int, name: str | None = None):
        self.type = type
        self.owner = owner
        self.index = index
        self.name = name            # a printing hint; the printer makes names unique
        self.uses: list[Operation] = []

    @property
    def is_arg(self) -> bool:
        return isinstance(self.owner, Function)

    def replace_all_uses_with(self, other: "Value") -> None:
        for user in list(self.uses):
            user.operands = [other if v is self else v for v in user.operands]
            other.uses.append(user)
        self.uses.clear()

    def __repr__(self) -> str:
        return f"Value({self.name or '?'}: {self.type})"


class Operation:
    """One op instance. `attrs` always holds every declared attribute (defaults filled in), plus any
    discardable (dotted) attributes passes put on it (`is_discardable`)."""
    __slots__ = ("opdef", "operands", "results", "attrs", "loc", "id")
    _ids = itertools.count()

    def __init__(self, opdef: type[OpDef], operands: Sequence[Value], result_types: Sequence[TensorType],
                 attrs: dict[str, Any] | None = None, loc: Loc | None = None):
        self.opdef = opdef
        self.operands = list(operands)
        self.attrs = opdef.full_attrs(attrs or {})
        self.results = [Value(t, self, i) for i, t in enumerate(result_types)]
        self.loc = loc
        self.id = next(Operation._ids)   # stable identity across passes (the explorer keys on it)
        for v in self.operands:
            v.uses.append(self)

    @property
    def name(self) -> str:
        return self.opdef.name

    @property
    def result(self) -> Value:
        assert len(self.results) == 1, f"{self.name} has {len(self.results)} results"
        return self.results[0]

    def has_tag(self, tag: str) -> bool:
        return tag in self.opdef.tags

    @property
    def semantic_attrs(self) -> dict[str, Any]:
        """The declared attributes only: what the op's infer/evaluate/verify see."""
        return semantic_attrs(self.attrs)

    def drop_operands(self) -> None:
        for v in self.operands:
            if self in v.uses:
                v.uses.remove(self)
        self.operands = []

    def set_operand(self, i: int, v: Value) -> None:
        self.operands[i].uses.remove(self)   # `uses` holds one entry per operand slot
        self.operands[i] = v
        v.uses.append(self)

    def __repr__(self) -> str:
        return f"<{self.name} #{self.id}>"


class Function:
    """A graph function: arguments, a straight-line list of ops ending in `cuvil.return`,
    and the ranges of its dynamic-dimension symbols."""

    def __init__(self, name: str, arg_types: Sequence[TensorType], arg_names: Sequence[str] | None = None,
                 symbols: dict[str, tuple[int, int]] | None = None):
        self.name = name
        names = list(arg_names) if arg_names else [None] * len(arg_types)
        self.args = [Value(t, self, i, n) for i, (t, n) in enumerate(zip(arg_types, names))]
        self.ops: list[Operation] = []
        self.symbols: dict[str, tuple[int, int]] = dict(symbols or {})

    @property
    def return_op(self) -> Operation:
        if not self.ops or self.ops[-1].name != "cuvil.return":
            raise CuvilVerifyError(f"function @{self.name} does not end in cuvil.return")
        return self.ops[-1]

    @property
    def result_types(self) -> list[TensorType]:
        return [v.type for v in self.return_op.operands]

    def copy(self) -> "Function":
        """The same function in new values and ops (new ids), for passes to change; attributes are
        copied, types and locations shared (both immutable)."""
        out = Function(self.name, [a.type for a in self.args], [a.name for a in self.args], self.symbols)
        new = {id(a): b for a, b in zip(self.args, out.args)}
        for op in self.ops:
            twin = Operation(op.opdef, [new[id(v)] for v in op.operands], [r.type for r in op.results],
                             copy.deepcopy(op.attrs), op.loc)
            for r, t in zip(op.results, twin.results):
                t.name = r.name
                new[id(r)] = t
            out.ops.append(twin)
        return out

    def erase(self, op: Operation) -> None:
        """Remove an op whose results are unused."""
        for r in op.results:
            if r.uses:
                raise CuvilVerifyError(f"cannot erase an op whose result is still used by {r.uses[0].name}", op)
        op.drop_operands()
        self.ops.remove(op)

    def users(self, op: Operation) -> list[Operation]:
        return [u for r in op.results for u in r.uses]


@dataclass
class Module:
    """Functions by name plus the named constants (weights) they reference."""
    functions: dict[str, Function] = field(default_factory=dict)
    constants: dict[str, torch.Tensor] = field(default_factory=dict)

    def add_function(self, fn: Function) -> Function:
        self.functions[fn.name] = fn
        return fn

    def copy(self) -> "Module":
        """Copies of the functions; the constants are shared (passes add and replace weights, they
        never change one in place)."""
        out = Module(constants=dict(self.constants))
        for fn in self.functions.values():
            out.add_function(fn.copy())
        return out

    @property
    def main(self) -> Function:
        """The entry function: `forward` if present, otherwise the first one."""
        if "forward" in self.functions:
            return self.functions["forward"]
        return next(iter(self.functions.values()))

    def const_type(self, name: str) -> TensorType | None:
        t = self.constants.get(name)
        return None if t is None else TensorType(DType.from_torch(t.dtype), tuple(t.shape))


# ----------------------------------------------------------------------------- building

class Builder:
    """Appends (or inserts) ops into a function, inferring result types from the op declaration."""

    def __init__(self, fn: Function, index: int | None = None):
        self.fn = fn
        self.index = index  # insert before this position; None = append

    def create(self, name: str | type[OpDef], operands: Sequence[Value] = (), attrs: dict | None = None,
               loc: Loc | None = None, result_types: Sequence[TensorType] | None = None) -> Operation:
        opdef = lookup_op(name) if isinstance(name, str) else name
        if opdef is None:
            raise CuvilVerifyError(f"unknown op '{name}'")
        attrs = opdef.full_attrs(attrs or {})
        if result_types is None:
            try:
                with symbol_ranges(self.fn.symbols):
                    result_types = opdef.infer([v.type for v in operands], semantic_attrs(attrs))
            except ValueError as e:
                raise CuvilVerifyError(f"{opdef.name}: {e}") from None
        op = Operation(opdef, operands, result_types, attrs, loc)
        if self.index is None:
            self.fn.ops.append(op)
        else:
            self.fn.ops.insert(self.index, op)
            self.index += 1
        return op

    def __call__(self, name: str, *operands: Value, loc: Loc | None = None, **attrs) -> Value:
        """Shorthand for single-result ops: `b("cuvil.add", x, y)`."""
        return self.create(name, operands, attrs, loc).result


def walk_values(fn: Function) -> Iterable[Value]:
    yield from fn.args
    for op in fn.ops:
        yield from op.results


def topo_check(fn: Function, report: Callable[[str, Operation], None]) -> None:
    """Report every use of a value that is not defined earlier in the function."""
    defined = set(map(id, fn.args))
    for op in fn.ops:
        for v in op.operands:
            if id(v) not in defined:
                report(f"operand {v!r} is used before it is defined", op)
        defined.update(map(id, op.results))
