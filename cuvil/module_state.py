"""The model state a compiled variant baked in, watched on every call.

A compile turns the model's weights into packed constants and its attribute values, submodules
and hooks into code. A change after the compile (an in-place weight update, `load_state_dict`, a
parameter or submodule replaced, an attribute rebound, a hook registered, `.train()`) would be
answered with the old model. `ModelState.of(target)` records what the compile read:
- for a module and every submodule: its `__dict__`, `_parameters`, `_buffers`, `_modules` and
  forward (pre-)hooks, entry by entry; the tensors among them by version counter and data pointer;
- for the user's functions: the globals their code loads (and their nested code's), by value, and
  their closures, followed into the modules, tensors, functions, bound methods, partials and
  compiled models among them;
- torch's global forward (pre-)hooks.

`changed()` (native: `cuvil._native.StateSnapshot`) answers in a few µs for BERT-small, and the
compiled model drops its variants and compiles again (cuvil/compiled.py). What it does not see:
an in-place change made through `.data` (`p.data.mul_(2)`) or to an inference tensor (made under
`torch.inference_mode`): torch counts no versions for either (a new tensor in place is seen);
state inside other objects the model holds (a config object's fields, a list's items); the
globals of installed packages' functions; and methods replaced on a class.
"""
from __future__ import annotations

import functools
import inspect
import struct
import types
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.modules import module as torch_module

from ._native import StateSnapshot
from .fingerprint import global_names, is_user_code

# the dicts of a module that torch.export reads, and how a change to each is told
_MODULE_DICTS = {"__dict__": "attribute", "_parameters": "parameter", "_buffers": "buffer",
                 "_modules": "submodule", "_forward_hooks": "forward hook", "_forward_pre_hooks": "forward pre-hook"}


@dataclass(frozen=True)
class _Watched:
    owner: str          # who holds the dict: "model.encoder.layer.0" or "globals of f"
    kind: str           # what its entries are: a key of _MODULE_DICTS, "globals" or "global hooks"
    whole: bool         # every entry (else only the snapshot's keys)


class ModelState:
    """A snapshot of a compiled model's state. `changed()` (native) is -1 while it holds, else an
    index for `describe` (see the module docstring)."""

    def __init__(self, watched: list[tuple[_Watched, dict, dict]], tensors: dict[str, torch.Tensor]):
        """watched: (what, the dict, the entries to watch: all of the dict's, or a part of a function's globals)."""
        self._watched = watched
        self._names = list(tensors)
        # the native snapshot borrows these: kept here, where the garbage collector sees them
        self._items = [list(e.items()) for _, _, e in watched]
        self._tensors = list(tensors.values())
        native = StateSnapshot([d for _, d, _ in watched], self._items, [w.whole for w, _, _ in watched],
                               self._tensors, [not t.is_inference() for t in self._tensors],
                               inspect.getattr_static(torch.Tensor, "_version"),
                               inspect.getattr_static(torch.Tensor, "data_ptr"))
        self.changed = native.changed

    @staticmethod
    def of(target) -> "ModelState":
        hooks = _Watched("torch", "global hooks", True)
        watched = [(hooks, d, dict(d)) for d in (torch_module._global_forward_hooks,
                                                  torch_module._global_forward_pre_hooks)]
        tensors: dict[str, torch.Tensor] = {}
        modules: dict[str, nn.Module] = {}
        _reach(target, "model", watched, tensors, modules, set())
        seen: set[int] = set()
        for root, module in modules.items():
            for path, m in module.named_modules(prefix=root):
                if id(m) in seen:
                    continue
                seen.add(id(m))
                for kind in _MODULE_DICTS:
                    d = vars(m) if kind == "__dict__" else getattr(m, kind, None)
                    if isinstance(d, dict):
                        watched.append((_Watched(path, kind, True), d, dict(d)))
                        if kind in ("__dict__", "_parameters", "_buffers"):
                            tensors.update({f"{path}.{k}": v for k, v in d.items() if _watchable(v)})
        return ModelState(watched, tensors)

    def describe(self, index: int) -> str:
        """What changed, for the recompile's reason: the entry or tensor behind `changed()`'s index."""
        if index >= len(self._watched):
            return f"{self._names[index - len(self._watched)]} was modified in place"
        w, d, old = self._watched[index]
        if w.kind == "global hooks":
            return "a global forward hook was registered or removed"
        if w.kind in ("_forward_hooks", "_forward_pre_hooks"):
            return f"a {_MODULE_DICTS[w.kind]} of {w.owner} was registered or removed"
        now = d if w.whole else {k: d[k] for k in old if k in d}
        keys = [k for k in (*old, *now) if k not in old or k not in now or not _same(old[k], now[k])]
        what = _MODULE_DICTS.get(w.kind, "global")
        if not keys:
            return f"the {what}s of {w.owner} were reordered"
        key = keys[0]
        name = f"{w.owner}.{key}" if w.kind in _MODULE_DICTS else f"{key} ({w.owner})"
        if key not in now:
            return f"{what} {name} was deleted"
        return f"{what} {name} was {'added' if key not in old else 'rebound'}"


def _reach(value, name: str, watched: list, tensors: dict, modules: dict, seen: set) -> None:
    """Collect what `value` (the compiled target, or something its code reaches) bakes in: modules
    (their dicts are watched after), tensors, and for the user's functions the globals they load
    and their closures, followed into the functions, bound methods, partials and compiled models
    among them."""
    from .compiled import CompiledModel
    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, CompiledModel):        # traced as the model it wraps
        _reach(value.target, name, watched, tensors, modules, seen)
    elif isinstance(value, nn.Module):
        modules.setdefault(name, value)
    elif _watchable(value):
        tensors.setdefault(name, value)
    elif isinstance(value, types.MethodType):
        _reach(value.__self__, name, watched, tensors, modules, seen)
        _reach(value.__func__, name, watched, tensors, modules, seen)
    elif isinstance(value, functools.partial):
        for i, v in enumerate([value.func, *value.args, *value.keywords.values()]):
            _reach(v, f"{name}'s partial argument {i}" if i else name, watched, tensors, modules, seen)
    elif isinstance(value, types.FunctionType) and is_user_code(value.__code__.co_filename):
        names = global_names(value.__code__)
        found = {n: v for n, v in value.__globals__.items() if n in names}
        watched.append((_Watched(f"globals of {value.__qualname__}", "globals", False), value.__globals__, found))
        cells = [c.cell_contents for c in value.__closure__ or () if _has_contents(c)]
        for n, v in [*found.items(), *((f"{value.__qualname__}'s closure", v) for v in cells)]:
            _reach(v, n, watched, tensors, modules, seen)


def _same(a, b, depth: int = 0) -> bool:
    """The native check's rule: the same object, an equal exact float (by bits), int or str, or
    exact tuples, lists and dicts of the same items by this rule."""
    if a is b:
        return True
    if type(a) is not type(b) or depth > 8:
        return False
    if type(a) is float:
        return struct.pack("<d", a) == struct.pack("<d", b)
    if type(a) in (int, str):
        return a == b
    if type(a) in (tuple, list):
        return len(a) == len(b) and all(_same(x, y, depth + 1) for x, y in zip(a, b))
    if type(a) is dict:
        return len(a) == len(b) and all(_same(ka, kb, depth + 1) and _same(va, vb, depth + 1)
                                        for (ka, va), (kb, vb) in zip(a.items(), b.items()))
    return False


def _watchable(x) -> bool:
    """A tensor with memory of its own to watch: not a sparse or meta tensor, nor a fake one a
    trace left in an attribute (reading their address raises)."""
    if not isinstance(x, torch.Tensor):
        return False
    try:
        x.data_ptr()
    except RuntimeError:
        return False
    return True


def _has_contents(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:      # a cell not yet assigned
        return False
    return True
