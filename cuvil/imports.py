"""Imports kept in this process: a compile of a call imported before (the same model, code, weights,
input shapes and dynamic dims: `model_cache.call_key`) starts from a copy of that import instead
of running torch.export again, whatever its compile options. Switching pipelines, precisions or
targets on one model (a notebook exploring passes) then costs the passes and the code generation
only.

The last `SIZE` imports are kept, and an import no longer than its model: when the model (or
function) is collected, so is its entry, with the weights it refers to. A model whose tensors pass
the compiled-model cache's limit (`$CUVIL_MODEL_CACHE_MAX_GIB`) is not kept: the key hashes them.

An import's constants are the model's own tensors, not copies: weights changed in place after the
import (`p.add_(...)`, `load_state_dict`) change the kept import too, under a key that still
names the weights before. So a kept import is used only while its tensors still hash to its key.
"""
from __future__ import annotations

import dataclasses
import threading
import weakref
from collections import OrderedDict

import torch

from .fingerprint import contents_digest
from .frontend import ImportResult
from .model_cache import ModelKey, max_entry_bytes

SIZE = 4


@dataclasses.dataclass
class _Kept:
    imported: ImportResult
    tensors: list[torch.Tensor]     # what the key's weights digest hashed, which the constants may share


_kept: OrderedDict[tuple[str, str], _Kept] = OrderedDict()
_lock = threading.Lock()


def _key(call: ModelKey) -> tuple[str, str] | None:
    if sum(t.nbytes for t in call.tensors) > max_entry_bytes():
        return None
    return call.name, call.weights()


def copy_of(call: ModelKey) -> ImportResult | None:
    """A copy of the kept import of `call` (its module is the passes' to change), or None."""
    key = _key(call)
    with _lock:
        kept = _kept.get(key) if key is not None else None
        if kept is None:
            return None
        _kept.move_to_end(key)
    if contents_digest(kept.tensors) != key[1]:     # changed in place since it was kept
        _drop(key)
        return None
    return dataclasses.replace(kept.imported, module=kept.imported.module.copy())


def keep(call: ModelKey, model, imported: ImportResult) -> None:
    """Keep a copy of `imported` (before any pass changes it) while `model` lives."""
    key = _key(call)
    if key is None:
        return
    try:
        weakref.finalize(model, _drop, key)
    except TypeError:       # an object without weak references: kept until pushed out
        pass
    kept = _Kept(dataclasses.replace(imported, module=imported.module.copy()), list(call.tensors))
    with _lock:
        _kept[key] = kept
        while len(_kept) > SIZE:
            _kept.popitem(last=False)


def _drop(key: tuple[str, str]) -> None:
    with _lock:
        _kept.pop(key, None)


def clear() -> None:
    with _lock:
        _kept.clear()
