"""Hugging Face key/value caches (`transformers.Cache`) in a model's outputs and inputs.

A decoder called the default way (`use_cache=True`) returns a `DynamicCache` holding each layer's
keys and values. transformers registers its `ModelOutput`s with torch's pytree itself but leaves
its caches to its exporters, so torch.export stopped at "DynamicCache in output, which is not a
known type". Cuvil registers them the way transformers' own exporter does
(`transformers.exporters.exporter_dynamo`): a capture of a transformers model registers its cache
classes, and the compiled call returns a real cache built around Cuvil's outputs, which eager
transformers can go on decoding from. Loading a saved model whose outputs hold a cache registers
them too (the output structure names the class).

A cache passed *in* (a decoding step) compiles: each `DynamicLayer`'s keys and values have one
dynamic length, `past`, shared by every layer, so one program serves every step; an input that
spans the past and the new tokens (an attention mask) gets the size `past` + new tokens. The
model appends the step's keys and values to the cache it is given, in place, while a compiled
call returns new tensors: `write_back` moves them into the caller's cache, and the output holds
the caller's object, as in eager PyTorch (an empty cache given with the prompt is filled so).
A sliding window's layers (`DynamicSlidingWindowLayer`: Mistral, Gemma 2 and 3, Phi-3) compile
the same way until the window fills: while a layer holds fewer tokens than its window, it holds
every token it has seen and behaves as a full one. Such a layer counts the tokens seen in a Python
int, `cumulative_length`, which torch.export would take as a constant of the program; while a
step is captured (`windows_as_full_layers`), the count is read from the keys' length instead,
which is `past`, and `past`'s range ends where the step would fill the smallest window
(`sliding_window_limit`). After a call, the count is set from the keys again (`write_back`). A
window that is full (its layer drops the oldest tokens, so that its count and its length part) is
refused by name, as are other caches (a static cache writes into fixed buffers).
"""
from __future__ import annotations

import contextlib
import sys

import torch
import torch.utils._pytree as pytree
from torch import nn

from ..errors import CuvilError

CACHE_MODULE = "transformers.cache_utils"


class CacheInputError(CuvilError):
    """A transformers cache among a call's inputs that Cuvil cannot compile with (see the module's
    docstring)."""


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


PAST = "past"      # the dynamic dim of a cache's keys and values: the tokens before this call's


def cache_inputs(values: dict) -> dict:
    """The inputs (by parameter name) that are a transformers cache Cuvil compiles with: a
    `DynamicCache` of full-attention layers, empty (the prompt fills it) or holding keys and
    values whose length is the dynamic dim `PAST`. Raises `CacheInputError` for any other cache
    among them."""
    found = {}
    for name, value in values.items():
        if not _holds(value):
            continue
        if not _growing_cache(value):
            layers = sorted({type(layer).__name__ for layer in getattr(value, "layers", ())})
            what = f"a {type(value).__name__}" + (f" of {', '.join(layers)} layers" if layers else "")
            raise CacheInputError(
                f"input '{name}' is {what}, which Cuvil does not compile with: only a DynamicCache whose "
                f"layers are all DynamicLayer (full attention, holding keys and values) or DynamicSlidingWindowLayer "
                f"(a window not yet full) is supported. The model updates the cache it is given in place; Cuvil "
                f"writes the keys and values a call returns back into those layers, but others keep more state (a "
                f"full window's position, a fixed buffer). Pass fallback='eager' to run the calls with this cache "
                f"in PyTorch")
        found[name] = value
    return found


def _growing_cache(value) -> bool:
    """A DynamicCache of full-attention layers, or of sliding-window ones whose window is not yet
    full, that all hold keys and values (a decoding step's), or none (an empty cache the prompt
    fills)."""
    from transformers.cache_utils import DynamicLayer
    if not _is_dynamic_cache(value) or \
            any(type(layer) is not DynamicLayer and not _window_not_full(layer) for layer in value.layers):
        return False
    return len({layer.is_initialized for layer in value.layers}) <= 1


def _is_window(layer) -> bool:
    return type(layer).__name__ == "DynamicSlidingWindowLayer" and type(layer).__module__ == CACHE_MODULE


def _window_not_full(layer) -> bool:
    """A sliding-window layer that still holds every token it has counted."""
    return _is_window(layer) and not layer.record_past and \
        layer.cumulative_length == (layer.keys.shape[-2] if layer.is_initialized else 0) < layer.sliding_window


def sliding_window_limit(caches: dict, new_tokens: int) -> int | None:
    """The longest past that a call adding `new_tokens` keeps within every sliding window of the
    caches (a window layer keeps its last `sliding_window` − 1 tokens), or None without one.
    Raises `CacheInputError` where the example's step already fills a window."""
    windows = [layer.sliding_window for c in caches.values() for layer in c.layers if _is_window(layer)]
    if not windows:
        return None
    limit = min(windows) - 1 - new_tokens
    past = max(cache_length(c) for c in caches.values())
    if past > limit:
        raise CacheInputError(
            f"this call fills a sliding window: the cache holds {past} tokens and the call adds {new_tokens}, and the "
            f"smallest window keeps {min(windows) - 1}. Cuvil compiles a window's steps until it is full; a full "
            f"window drops its oldest tokens, which Cuvil does not compile yet. Pass fallback='eager' to run these "
            f"calls in PyTorch")
    return limit


@contextlib.contextmanager
def windows_as_full_layers(caches: dict):
    """While a step with sliding-window caches is captured, each window layer acts as the full
    layer it is until its window fills: its count of tokens seen is its keys' length (a dynamic
    size, not the example's int; the model's `+=` to it is dropped, the keys grow instead), and it
    keeps every token (its crop to the window's last tokens keeps them all over the range of
    `past`, but torch.export would fix `past` deciding where the crop starts). The counts are set
    aside from the inputs' structure (`flatten_like`)."""
    if not any(_is_window(layer) for c in caches.values() for layer in c.layers):
        yield
        return
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer as Window
    update = Window.__dict__["update"]

    # only the captured step's layers act so (their count is the mark, rebuilt from the structure):
    # another thread's eager layers keep their own count, and crop
    def count(layer):
        value = layer.__dict__.get("cumulative_length", 0)
        return (layer.keys.shape[-2] if layer.is_initialized else 0) if _marked(value) else value

    def set_count(layer, value):
        if not _marked(layer.__dict__.get("cumulative_length")):
            layer.__dict__["cumulative_length"] = value

    def update_as_full(layer, *args, **kwargs):
        full = _marked(layer.__dict__.get("cumulative_length"))
        return (DynamicLayer.update if full else update)(layer, *args, **kwargs)
    Window.cumulative_length = property(count, set_count)
    Window.update = update_as_full
    try:
        with _counts_set_aside(list(caches.values())):
            yield
    finally:
        del Window.cumulative_length
        Window.update = update


def flatten_like(spec: pytree.TreeSpec, tree) -> list:
    """`spec.flatten_up_to(tree)`, the sliding-window layers' counts of tokens set aside as they
    were when the program was captured (`windows_as_full_layers`): transformers' flattening keeps
    every attribute of a layer, and a count that differs would make each step's cache a structure
    of its own."""
    with _counts_set_aside(tree):
        return spec.flatten_up_to(tree)


# a window layer's count while it is set aside: the same in every step's structure
COUNTED_BY_LENGTH = "cuvil: the keys' length"


def _marked(count) -> bool:
    return isinstance(count, str) and count == COUNTED_BY_LENGTH


@contextlib.contextmanager
def _counts_set_aside(tree):
    windows = [layer for c in pytree.tree_leaves(tree, is_leaf=_is_dynamic_cache) if _is_dynamic_cache(c)
               for layer in c.layers if _is_window(layer)]
    counts = [layer.__dict__.get("cumulative_length") for layer in windows]
    for layer in windows:
        layer.__dict__["cumulative_length"] = COUNTED_BY_LENGTH
    try:
        yield
    finally:
        for layer, value in zip(windows, counts):
            layer.__dict__["cumulative_length"] = value


def cache_length(cache) -> int:
    """The tokens a supported cache holds (0: an empty one)."""
    return cache.layers[0].keys.shape[-2] if cache.layers and cache.layers[0].is_initialized else 0


def new_tokens_axis(values: dict) -> tuple[str, int] | None:
    """Where a call counts its new tokens: `input_ids`' last axis or `inputs_embeds`' second."""
    ids, embeds = values.get("input_ids"), values.get("inputs_embeds")
    if isinstance(ids, torch.Tensor) and ids.dim() >= 1:
        return "input_ids", ids.dim() - 1
    if isinstance(embeds, torch.Tensor) and embeds.dim() == 3:
        return "inputs_embeds", 1
    return None


def spans_past_and_new(values: dict, past: int) -> dict[str, dict[int, int]]:
    """Axes of the other tensor inputs that span the cache and this call's new tokens (an attention
    mask over both), whose size is then `past` + the new tokens: {input name: {axis: new tokens}}."""
    where = new_tokens_axis(values)
    if where is None:
        return {}
    new = values[where[0]].shape[where[1]]
    return {name: axes for name, x in values.items() if isinstance(x, torch.Tensor) and name != where[0]
            if (axes := {axis: new for axis, n in enumerate(x.shape) if n == past + new})}


def static_new_tokens(values: dict, hints: dict) -> dict:
    """`hints` without the new tokens' axis when a cache is given with an input that spans the past
    and the new tokens: that input's size would be past + new tokens, both dynamic, which is no
    size torch.export can declare (a derived dim has one root). Such a step's new tokens stay
    static (before an example grows a dynamic size 1 to 2, which would break the sum)."""
    caches = [v for v in values.values() if _is_dynamic_cache(v) and _growing_cache(v) and cache_length(v)]
    where = new_tokens_axis(values)
    if not caches or where is None or where[1] not in hints.get(where[0], {}) \
            or not spans_past_and_new(values, cache_length(caches[0])):
        return hints
    kept = {a: d for a, d in hints[where[0]].items() if a != where[1]}
    return {n: h for n, h in {**hints, where[0]: kept}.items() if h}


def cache_dynamic_shapes(cache, past) -> list:
    """torch.export's dynamic shapes for a cache input: one entry per pytree leaf, the keys' and
    values' sequence axis (-2 of [batch, heads, tokens, head dim]) as `past`."""
    return [{2: past} if leaf.dim() == 4 else None for leaf in pytree.tree_leaves(cache)]


def write_back(args: tuple, kwargs: dict, out):
    """`out` with each cache the call was given in place of the one the compiled call returned,
    after giving it the returned one's state. The model appended this call's keys and values to the
    cache it was given, in place; a compiled call returns new tensors, so the caller's cache
    becomes what eager PyTorch would have left: the same object, holding the longer keys and values."""
    given = [x for x in (*args, *kwargs.values()) if _is_dynamic_cache(x)]
    if not given:
        return out
    returned = [x for x in pytree.tree_leaves(out, is_leaf=_is_dynamic_cache) if _is_dynamic_cache(x)]
    for mine, new in zip(given, returned, strict=True):
        if not mine.layers:         # an empty cache (made without a config): the model made its layers
            mine.layers.extend(new.layers)
        for layer, state in zip(mine.layers, new.layers, strict=True):
            layer.__dict__.update(state.__dict__)
            if _is_window(layer):    # counted by length while captured: the program's count is the example's
                layer.cumulative_length = layer.keys.shape[-2]
    swap = dict(zip(map(id, returned), given))
    return pytree.tree_map(lambda x: swap.get(id(x), x), out, is_leaf=_is_dynamic_cache)


def returns_each_cache(out_spec, caches: dict) -> None:
    """Raise `CacheInputError` unless the model's outputs hold as many DynamicCaches as it is
    given: the caller's caches are brought up to date from the returned ones."""
    returned = _count_caches(out_spec)
    if caches and returned != len(caches):
        raise CacheInputError(
            f"the model is given {len(caches)} DynamicCache(s) ({', '.join(map(repr, caches))}), which it updates in "
            f"place, but its outputs hold {returned}: Cuvil could not bring the caller's cache up to date. Pass "
            f"fallback='eager' to run these calls in PyTorch")


def _count_caches(spec) -> int:
    if spec.type is not None and _is_dynamic_cache_type(spec.type):
        return 1
    return sum(_count_caches(c) for c in spec.children())


def _is_dynamic_cache_type(cls) -> bool:
    return cls.__name__ == "DynamicCache" and cls.__module__ == CACHE_MODULE


def _is_dynamic_cache(x) -> bool:
    return _is_dynamic_cache_type(type(x))


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
