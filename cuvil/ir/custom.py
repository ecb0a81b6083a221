"""User ops declared from Python. They go into the same registry as the built-ins, so the
builder, printer, parser, verifier and interpreter treat them alike.

    @custom_op("mylib.scale", operands=("x",), attrs={"factor": optional("float", 1.0)},
               tags={"elementwise"})
    def scale(x, *, factor):          # reference semantics, eager torch
        return x * factor

`infer=fn(types, attrs) -> TensorType | list[TensorType]` gives the result types; it defaults to
broadcasting the operands (dtype promoted like torch) for ops tagged `elementwise`.
"""
from __future__ import annotations

import inspect
from typing import Callable, Iterable

from .core import OP_REGISTRY, Attr, OpDef, register_op, required
from .ops.common import broadcast_shapes, promote
from .types import TensorType

_KNOWN_TAGS = {"elementwise", "injective", "view", "reduction", "opaque", "commutative"}
_AMP = ("always", "follow", "never")


def custom_op(name: str, *, operands: Iterable[str] = ("x",), attrs: dict[str, Attr | str] | None = None,
              tags: Iterable[str] = (), infer: Callable | None = None, amp: str = "never",
              replace: bool = False) -> Callable[[Callable], type[OpDef]]:
    """Decorator that declares the op `name` with the decorated function as its reference semantics.

    `attrs` maps names to `optional(kind, default)` / `required(kind)` or just a kind (required).
    Declaring the same name again with the same definition is a no-op (re-running a notebook
    cell); a different definition is an error unless `replace=True`. Returns the op class.
    """
    operands, tags = tuple(operands), frozenset(tags)
    attr_decls = {k: required(a) if isinstance(a, str) else a for k, a in (attrs or {}).items()}
    _check_declaration(name, operands, attr_decls, tags, infer, amp)

    def decorate(fn: Callable) -> type[OpDef]:
        cls = _make_class(name, operands, attr_decls, tags, infer, amp, fn)
        old = OP_REGISTRY.get(name)
        if old is not None:
            if getattr(old, "fingerprint", None) == cls.fingerprint:
                return old
            if not replace:
                raise ValueError(f"op '{name}' is already registered with a different definition "
                                 f"(pass replace=True to redefine it)")
            del OP_REGISTRY[name]
        return register_op(cls)

    return decorate


def _check_declaration(name, operands, attrs, tags, infer, amp) -> None:
    if not isinstance(name, str) or "." not in name.strip(".") or " " in name:
        raise ValueError(f"custom op name {name!r} must be dotted, such as 'mylib.my_op'")
    if name.startswith("cuvil."):
        raise ValueError(f"custom op '{name}' cannot use the reserved 'cuvil.' namespace")
    for i, o in enumerate(operands):
        base = o.rstrip("?*")
        if not base.isidentifier() or len(o) - len(base) > 1:
            raise ValueError(f"operand name {o!r} of '{name}' must be an identifier, optionally ending in ? or *")
        if o.endswith(("?", "*")) and any(not later.endswith(("?", "*")) for later in operands[i:]):
            raise ValueError(f"optional and variadic operands of '{name}' must come last")
    for k, a in attrs.items():
        if not isinstance(a, Attr):
            raise ValueError(f"attribute {k!r} of '{name}' must be declared with optional(kind, default) "
                             f"or required(kind), got {a!r}")
    unknown = tags - _KNOWN_TAGS
    if unknown:
        raise ValueError(f"unknown tags {sorted(unknown)} for '{name}' (known: {sorted(_KNOWN_TAGS)})")
    if amp not in _AMP:
        raise ValueError(f"amp of '{name}' must be one of {_AMP}, got {amp!r}")
    if infer is None and "elementwise" not in tags:
        raise ValueError(f"custom op '{name}' needs infer=fn(types, attrs) unless it is tagged elementwise")


def _broadcast_infer(types, attrs) -> list[TensorType]:
    if not types:
        raise ValueError("an elementwise op needs at least one operand")
    return [TensorType(promote(*types), broadcast_shapes(*types))]


def _code_key(fn: Callable | None):
    if fn is None:
        return None
    code = fn.__code__
    return code.co_code, code.co_consts, code.co_names


def _make_class(name, operands, attrs, tags, infer, amp, fn) -> type[OpDef]:
    user_infer = infer or _broadcast_infer
    parameters = inspect.signature(fn).parameters
    takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())

    def infer_types(types, attr_values):
        try:
            out = user_infer(list(types), dict(attr_values))
        except ValueError:
            raise
        except Exception as e:
            raise ValueError(f"the shape function of '{name}' raised {type(e).__name__}: {e}") from e
        out = [out] if isinstance(out, TensorType) else list(out)
        if not all(isinstance(t, TensorType) for t in out):
            raise ValueError(f"the shape function of '{name}' must return TensorType(s), got {out!r}")
        return out

    def evaluate(attr_values, *tensors):
        kwargs = {k: v for k, v in attr_values.items() if takes_all or k in parameters}
        return fn(*tensors, **kwargs)

    return type(_class_name(name), (OpDef,), {
        "name": name, "operands": operands, "attrs": attrs, "tags": tags, "amp": amp, "sandbox": "trusted",
        "doc": inspect.getdoc(fn) or "", "__doc__": inspect.getdoc(fn), "__module__": fn.__module__,
        "infer": staticmethod(infer_types), "evaluate": staticmethod(evaluate), "reference": staticmethod(fn),
        "fingerprint": (operands, tuple(attrs.items()), tags, amp, _code_key(fn), _code_key(infer)),
    })


def _class_name(name: str) -> str:
    return "".join(p.capitalize() for p in name.replace(".", "_").split("_") if p) + "Op"
