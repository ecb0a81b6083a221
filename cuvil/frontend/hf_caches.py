"""Hugging Face key/value caches (`transformers.Cache`) in a model's outputs and inputs.

A decoder called the default way (`use_cache=True`) returns a `DynamicCache` holding each layer's
keys and values. transformers registers its `ModelOutput`s with torch's pytree itself but leaves
its caches to its exporters, so torch.export stopped at "DynamicCache in output, which is not a
known type". Cuvil registers them the way transformers' own exporter does
(`transformers.exporters.exporter_dynamo`): a capture of a transformers model registers its cache
classes, and the compiled call returns a real cache built around Cuvil's outputs, which eager
transformers can go on decoding from. Loading a saved model whose outputs hold a cache registers
them too (the output structure names the class).

A cache passed *in* is refused: the model appends the new token's keys and values to it in
place, and a compiled call returns new tensors instead, so the caller's cache would silently keep
the old ones.
"""
from __future__ import annotations

import sys

from torch import nn

from ..errors import CuvilError

CACHE_MODULE = "transformers.cache_utils"


class CacheInputError(CuvilError):
    """A transformers cache among a call's inputs (see the module's docstring)."""


def register_model_caches(module: nn.Module) -> None:
    """Make the cache types a transformers model can return pytree nodes (once per type)."""
    if "transformers" not in sys.modules:
        return
    by_file = {}        # transformers looks for model-specific caches in the model class's file
    for m in module.modules():
        if type(m).__module__.startswith("transformers."):
            by_file.setdefault(type(m).__module__, m)
    exporter = _exporter() if by_file else None
    for m in by_file.values() if exporter else ():
        exporter.register_cache_pytrees_for_model(m)


def register_all_caches() -> None:
    """Every `transformers.Cache` class as a pytree node: a saved model's outputs name theirs."""
    from transformers.cache_utils import Cache
    exporter = _exporter()
    todo = [Cache] if exporter else []
    while todo:
        cls = todo.pop()
        exporter.register_pytree_node(cls)
        todo += cls.__subclasses__()


def refuse_cache_inputs(values: dict) -> None:
    """Raise `CacheInputError` for the first input (by parameter name) that holds a cache."""
    for name, value in values.items():
        if _holds(value):
            raise CacheInputError(
                f"input '{name}' is a {type(value).__name__} (or holds one): the model updates a cache it is "
                f"given in place (it appends the new keys and values), which a compiled call cannot do. "
                f"Compile the calls without one (the prompt: its outputs hold the cache to decode from), "
                f"or pass fallback='eager' to run the calls that have one in PyTorch")


def _holds(value) -> bool:
    if type(value).__module__.startswith("transformers."):
        exporter = _exporter()
        return exporter is not None and exporter.is_cache_object(value)
    if isinstance(value, (list, tuple)):
        return any(map(_holds, value))
    if isinstance(value, dict):
        return any(map(_holds, value.values()))
    return False


def _exporter():
    """transformers' torch.export helpers (5.x); None in versions without them, whose caches then
    stay unknown to torch.export as before."""
    try:
        from transformers.exporters import exporter_dynamo
    except ImportError:
        return None
    return exporter_dynamo
