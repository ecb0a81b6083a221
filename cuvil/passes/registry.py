"""Passes and named pipelines by name.

Built-in passes are imported lazily, on first lookup, from the modules listed in `BUILTIN_PASSES`;
user passes register themselves with `@register_pass` (a class or a plain function) and are then
indistinguishable from built-in ones.
"""
from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
from typing import Any, Callable

from ..errors import CuvilPipelineError
from .base import ModulePass, PassResult

# pass name -> module that defines (and registers) it
BUILTIN_PASSES: dict[str, str] = {
    "verify": "cuvil.passes.verify",
    "shape-infer": "cuvil.passes.shape_infer",
    "mixed-precision": "cuvil.passes.mixed_precision",
    "canonicalize": "cuvil.passes.canonicalize",
    "cse": "cuvil.passes.cse",
    "dce": "cuvil.passes.dce",
    "fold-batchnorm": "cuvil.passes.fold_batchnorm",
    "fold-constants": "cuvil.passes.fold_constants",
    "fuse-attention": "cuvil.passes.fuse_attention",
    "concat-linears": "cuvil.passes.concat_linears",
    "layout": "cuvil.passes.layout",
    "fuse": "cuvil.passes.fuse",
    "schedule": "cuvil.passes.schedule",
    "plan-memory": "cuvil.passes.plan_memory",
}

_PASSES: dict[str, type[ModulePass]] = {}
_PIPELINES: dict[str, str] = {}


def register_pass(target: Any = None, *, name: str | None = None, replace: bool = False, **class_attrs):
    """Register a pass class, or wrap a plain function `fn(module) -> bool | dict | None` as one.

        @register_pass
        @dataclass(frozen=True)
        class MyPass(ModulePass):
            name = "my-pass"
            ...

        @register_pass("double-relu")
        def double_relu(module, times: int = 2): ...   # keyword parameters become options

    `class_attrs` (priority, requires, provides, invalidates) apply to wrapped functions. Returns
    the pass class (for a function, the generated one: `double_relu(times=3)` is a pass instance).
    Registering a different pass under a taken name is an error unless `replace=True`; redefining
    the same class or function (a re-run notebook cell) replaces the old one.
    """
    if isinstance(target, str):
        return lambda obj: register_pass(obj, name=target, replace=replace, **class_attrs)
    if target is None:
        return lambda obj: register_pass(obj, name=name, replace=replace, **class_attrs)
    if isinstance(target, type):
        if not issubclass(target, ModulePass):
            raise TypeError(f"@register_pass: {target.__name__} is not a ModulePass subclass")
        cls = _checked_dataclass(target)
        if name is not None:
            cls.name = name
    elif callable(target):
        cls = _wrap_function(target, name or target.__name__.replace("_", "-"), class_attrs)
    else:
        raise TypeError(f"@register_pass expects a ModulePass subclass or a function, got {target!r}")
    _add(cls, replace)
    return target if isinstance(target, type) else cls


def _checked_dataclass(cls: type[ModulePass]) -> type[ModulePass]:
    if "__dataclass_fields__" not in cls.__dict__:
        raise TypeError(f"pass class {cls.__name__} must be decorated with @dataclass(frozen=True) "
                        f"(put @register_pass above @dataclass)")
    return cls


def _wrap_function(fn: Callable[..., PassResult], name: str, class_attrs: dict) -> type[ModulePass]:
    """A ModulePass subclass whose options are the function's keyword parameters."""
    params = list(inspect.signature(fn, eval_str=True).parameters.values())
    if not params:
        raise TypeError(f"pass function {fn.__name__} must take the module as its first parameter")
    fields = []
    for p in params[1:]:
        if p.default is inspect.Parameter.empty:
            raise TypeError(f"pass function {fn.__name__}: option '{p.name}' needs a default value")
        annotation = p.annotation if p.annotation is not inspect.Parameter.empty else type(p.default)
        fields.append((p.name, annotation, dataclasses.field(default=p.default)))

    def run(self, module):
        return fn(module, **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)})

    namespace = {"name": name, "run": run, "__doc__": fn.__doc__, "__module__": fn.__module__,
                 "_wrapped": fn, **_class_attrs(class_attrs)}
    cls_name = "".join(part.capitalize() for part in name.split("-")) + "Pass"
    return dataclasses.make_dataclass(cls_name, fields, bases=(ModulePass,), namespace=namespace, frozen=True)


def _class_attrs(attrs: dict) -> dict:
    allowed = {"priority", "requires", "provides", "invalidates"}
    unknown = set(attrs) - allowed
    if unknown:
        raise TypeError(f"@register_pass: unknown argument(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
    return {k: (frozenset(v) if k != "priority" else v) for k, v in attrs.items()}


def _origin(cls: type) -> tuple[str, str]:
    fn = cls.__dict__.get("_wrapped")
    obj = fn if fn is not None else cls
    return obj.__module__, obj.__qualname__


def _add(cls: type[ModulePass], replace: bool) -> None:
    name = cls.name
    if not name or name != name.lower() or "_" in name or " " in name:
        raise ValueError(f"pass {cls.__name__}: name must be kebab-case, e.g. 'my-pass' (got {name!r})")
    if name in _PIPELINES:
        raise ValueError(f"pass name '{name}' is already the name of a registered pipeline")
    builtin = BUILTIN_PASSES.get(name)
    if builtin is not None and cls.__module__ != builtin and not replace:
        raise ValueError(f"pass '{name}' is a built-in pass (defined in {builtin}); pick another name")
    old = _PASSES.get(name)
    if old is not None and old is not cls and not replace and _origin(old) != _origin(cls):
        raise ValueError(f"pass '{name}' is already registered by {'.'.join(_origin(old))}; "
                         f"pick another name or pass replace=True")
    _PASSES[name] = cls


def unregister_pass(name: str) -> None:
    _PASSES.pop(name, None)


def get_pass(name: str) -> type[ModulePass] | None:
    """The pass class registered under `name`, importing a built-in one on first use."""
    if name not in _PASSES and name in BUILTIN_PASSES:
        importlib.import_module(BUILTIN_PASSES[name])
    return _PASSES.get(name)


def all_passes() -> dict[str, type[ModulePass]]:
    """Every pass by name (imports all built-in passes)."""
    for name in BUILTIN_PASSES:
        get_pass(name)
    return dict(sorted(_PASSES.items()))


def suggest(name: str) -> str:
    """' (did you mean 'x'?)' for the closest pass or pipeline name, or ''."""
    candidates = sorted(set(_PASSES) | set(BUILTIN_PASSES) | set(_PIPELINES))
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def providers_of(condition: str) -> list[str]:
    """Names of the passes that establish `condition`."""
    return [n for n, cls in all_passes().items() if condition in cls.provides]


# ----------------------------------------------------------------------------- named pipelines

def register_pipeline(name: str, text: str, replace: bool = False) -> None:
    """Register a named pipeline (`O1`); a pipeline string can then use the name as an element."""
    if name in _PASSES or name in BUILTIN_PASSES:
        raise ValueError(f"pipeline name '{name}' is already the name of a pass")
    if name in _PIPELINES and not replace and _PIPELINES[name] != text:
        raise ValueError(f"pipeline '{name}' is already registered as '{_PIPELINES[name]}'; pass replace=True")
    from .pipeline import parse_pipeline
    try:
        parse_pipeline(text)
    except CuvilPipelineError as e:
        raise CuvilPipelineError(f"named pipeline '{name}': {e}") from None
    _PIPELINES[name] = text


def get_pipeline(name: str) -> str | None:
    return _PIPELINES.get(name)


def all_pipelines() -> dict[str, str]:
    return dict(_PIPELINES)
