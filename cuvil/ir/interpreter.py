"""Reference interpreter: runs a graph function op by op with eager torch.

It is the semantic ground truth for tests and for the pass manager's numeric check. Inputs are
checked against the argument types, symbols are bound from the inputs' dims, and every op's
result is checked against its declared type, so a shape-inference bug cannot pass silently.
"""
from __future__ import annotations

import zlib
from typing import Any, Sequence

import sympy
import torch

from ..errors import CuvilError
from .core import Function, Module, Operation, Value
from .types import Dim, DType, TensorType


def interpret(module: Module, *inputs: torch.Tensor, function: str | Function | None = None,
              constants: dict[str, torch.Tensor] | None = None) -> list[torch.Tensor]:
    """Run `function` (default: the module's entry) on `inputs`; returns its results."""
    fn = _pick_function(module, function)
    data = {**module.constants, **(constants or {})}
    if len(inputs) != len(fn.args):
        raise CuvilError(f"@{fn.name} takes {len(fn.args)} inputs, got {len(inputs)}")
    env: dict[int, torch.Tensor] = {}
    bindings = bind_symbols(fn, inputs)
    for v, x in zip(fn.args, inputs):
        env[id(v)] = x
    for op in fn.ops:
        try:
            args = [env[id(v)] for v in op.operands]
        except KeyError:
            raise CuvilError(f"{op.name} #{op.id}{_where(op)} uses a value before it is defined "
                             f"(verify the module)") from None
        if op.name == "cuvil.return":
            return args
        if op.name == "cuvil.const":
            results = (_const_data(op, data),)
        else:
            results = _run_op(op, args, bindings)
        if len(results) != len(op.results):
            raise CuvilError(f"{op.name} #{op.id}{_where(op)} produced {len(results)} results, "
                             f"its declaration has {len(op.results)}")
        for r, t in zip(op.results, results):
            _check_result(op, r, t, bindings)
            env[id(r)] = t
    raise CuvilError(f"@{fn.name} does not end in cuvil.return")


def _pick_function(module: Module, function) -> Function:
    if isinstance(function, Function):
        return function
    if function is None:
        if not module.functions:
            raise CuvilError("the module has no functions to run")
        return module.main
    if function not in module.functions:
        raise CuvilError(f"no function @{function} in the module (has: {', '.join(module.functions)})")
    return module.functions[function]


# ----------------------------------------------------------------------------- inputs and symbols

def _arg_name(fn: Function, i: int) -> str:
    v = fn.args[i]
    return f"input {i} (%{v.name})" if v.name else f"input {i}"


def bind_symbols(fn: Function, inputs: Sequence[torch.Tensor]) -> dict[sympy.Symbol, int]:
    """Check inputs against the argument types and return the value of every symbol.

    A symbol is bound by the first input dim that is exactly that symbol; compound dims such as
    `2*s0` are checked once every symbol is bound.
    """
    bindings: dict[sympy.Symbol, int] = {}
    for i, (v, x) in enumerate(zip(fn.args, inputs)):
        t = v.type
        if not isinstance(x, torch.Tensor):
            raise CuvilError(f"{_arg_name(fn, i)} must be a torch.Tensor of type {t}, got {type(x).__name__}")
        if x.dtype != t.dtype.torch:
            raise CuvilError(f"{_arg_name(fn, i)} has dtype {x.dtype}, expected {t.dtype.torch} ({t})")
        if x.dim() != t.rank:
            raise CuvilError(f"{_arg_name(fn, i)} has rank {x.dim()} (shape {list(x.shape)}), expected {t.rank} ({t})")
        for d, size in zip(t.shape, x.shape):
            if isinstance(d, sympy.Symbol) and d not in bindings:
                bindings[d] = int(size)
    for s, value in bindings.items():
        lo, hi = fn.symbols.get(s.name, (value, value))
        if not lo <= value <= hi:
            raise CuvilError(f"symbol {s} = {value} (from {_first_use(fn, s)}) is outside its range [{lo}, {hi}]")
    for i, (v, x) in enumerate(zip(fn.args, inputs)):
        for k, (d, size) in enumerate(zip(v.type.shape, x.shape)):
            unbound = {s for s in getattr(d, "free_symbols", ()) if s not in bindings}
            if unbound:
                raise CuvilError(f"dim {k} of {_arg_name(fn, i)} is {d}: symbol {sorted(map(str, unbound))[0]} "
                                 f"is not the whole of any input dim, so it cannot be bound")
            expected = substitute(d, bindings)
            if expected != size:
                raise CuvilError(f"dim {k} of {_arg_name(fn, i)} is {size}, expected {expected}"
                                 + ("" if isinstance(d, int) else f" ({d})") + f" for type {v.type}")
    return bindings


def _first_use(fn: Function, s: sympy.Symbol) -> str:
    return next(f"dim {k} of {_arg_name(fn, i)}" for i, v in enumerate(fn.args)
                for k, d in enumerate(v.type.shape) if d == s)


def substitute(d: Dim, bindings: dict[sympy.Symbol, int]) -> int:
    """The value of a dim once its symbols are bound."""
    if isinstance(d, int):
        return d
    value = sympy.sympify(d.xreplace(bindings))
    if not value.is_Integer:
        raise CuvilError(f"dim {d} uses a symbol that no input dim binds: {sorted(map(str, value.free_symbols))}")
    return int(value)


# ----------------------------------------------------------------------------- running ops

def _concrete_attrs(op: Operation, bindings) -> dict[str, Any]:
    attrs = dict(op.semantic_attrs)
    for key, attr in op.opdef.attrs.items():
        if attr.kind == "dims":
            attrs[key] = [substitute(d, bindings) for d in attrs[key]]
    return attrs


def _run_op(op: Operation, args: list[torch.Tensor], bindings) -> tuple[torch.Tensor, ...]:
    try:
        out = op.opdef.evaluate(_concrete_attrs(op, bindings), *args)
    except CuvilError:
        raise
    except Exception as e:    # a user op's reference code, or torch rejecting the data
        raise CuvilError(f"evaluating {op.name} #{op.id}{_where(op)} failed: {type(e).__name__}: {e}") from e
    return out if isinstance(out, (tuple, list)) else (out,)


def _where(op: Operation) -> str:
    return f" at {op.loc.file}:{op.loc.line}" if op.loc else ""


def _const_data(op: Operation, data: dict[str, torch.Tensor]) -> torch.Tensor:
    name = op.attrs["name"]
    if name not in data:
        raise CuvilError(f"constant @{name} has no data (IR parsed from text carries none): pass it in "
                         f"constants={{'{name}': tensor}} or use random_constants(module)")
    return data[name]


def _check_result(op: Operation, r: Value, t, bindings) -> None:
    expected: TensorType = r.type
    if not isinstance(t, torch.Tensor):
        raise CuvilError(f"{op.name} #{op.id}{_where(op)} returned {type(t).__name__}, expected a tensor {expected}")
    shape = [substitute(d, bindings) for d in expected.shape]
    if t.dtype != expected.dtype.torch or list(t.shape) != shape:
        raise CuvilError(f"{op.name} #{op.id}{_where(op)} produced {t.dtype} {list(t.shape)}, "
                         f"but its type {expected} says {expected.dtype.torch} {shape}")


# ----------------------------------------------------------------------------- constants for parsed IR

def random_constants(module: Module, seed: int = 0) -> dict[str, torch.Tensor]:
    """Deterministic data for every `cuvil.const` of the module, for running IR parsed from text.

    Floats are normal with std 1/sqrt(last dim) (keeps deep stacks finite); integers lie in [0, 4);
    bools are fair coins. Each constant's data depends only on `seed`, its name and its type.
    """
    out: dict[str, torch.Tensor] = {}
    for fn in module.functions.values():
        for op in fn.ops:
            if op.name != "cuvil.const" or op.attrs["name"] in out:
                continue
            name, t = op.attrs["name"], op.result.type
            if not t.is_static:
                raise CuvilError(f"constant @{name} has a symbolic type {t}")
            g = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
            shape = list(t.shape)
            if t.dtype.is_float:
                scale = (shape[-1] if shape and shape[-1] else 1) ** -0.5
                data = (torch.randn(shape, generator=g) * scale).to(t.dtype.torch)
            elif t.dtype is DType.bool:
                data = torch.randint(0, 2, shape, generator=g).bool()
            else:
                data = torch.randint(0, 4, shape, generator=g, dtype=t.dtype.torch)
            out[name] = data
    return out
