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
dynamic length, `past`, shared by every layer, so one program serves every step (from a length of
2: torch.export fixes a size of 1, so a one-token prompt's first step compiles static). An
encoder-decoder model's `EncoderDecoderCache` holds two DynamicCaches: its self-attention's keys
grow with `past`, its cross-attention's stay the encoder's length (static), and which layers have
computed theirs (`is_updated`) is part of its structure; an input that
spans the past and the new tokens (an attention mask) gets the size `past` + new tokens. The
model appends the step's keys and values to the cache it is given, in place, while a compiled
call returns new tensors: `write_back` moves them into the caller's cache, and the output holds
the caller's object, as in eager PyTorch (an empty cache given with the prompt is filled so).
A sliding window's layers (`DynamicSlidingWindowLayer`: Mistral, Gemma 2 and 3, Phi-3) count
the tokens seen in a Python int, `cumulative_length`, which torch.export would take as a constant of
the program. A layer is in one of two states, and each state's steps share a program:
- growing: it holds every token it has seen (at most `sliding_window` − 1), and behaves as a full
  layer. While a step is captured (`windows_as_captured`) its count is read from the keys' length,
  which is `past`, whose range ends at the smallest such window less one (`sliding_window_range`);
  after the call its keys are cropped to the window's last tokens, as eager's are, so a step may
  fill the window part way;
- full: it holds its last `sliding_window` − 1 tokens, a static length, of more counted. Its count,
  `past`, is the length of a tensor of no elements put in the int's place while the step is captured
  and at each call (`_counts_set_aside`), and the count after the step the length of another that
  the program returns; `past`'s range starts at the window's size.
The counts are set aside from the inputs' structure (`flatten_like`) so that each step's cache has
the same one, and after a call they are set from the keys or the returned length (`write_back`).
Other caches are refused by name (a static cache writes into fixed buffers).
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
                f"input '{name}' is {what}, which Cuvil does not compile with: only a DynamicCache (or an "
                f"EncoderDecoderCache of two) whose layers are all DynamicLayer (full attention, holding keys and values) or DynamicSlidingWindowLayer "
                f"(not recording its past) is supported. The model updates the cache it is given in place; Cuvil "
                f"writes the keys and values a call returns back into those layers, but others keep more state (a "
                f"fixed buffer, or the past states a window records for a later crop). Pass fallback='eager' to run "
                f"the calls with this cache in PyTorch")
        found[name] = value
    return found


def _growing_cache(value) -> bool:
    """A DynamicCache of full-attention layers, or of sliding-window ones that are growing or full,
    that all hold keys and values (a decoding step's), or none (an empty cache the prompt fills);
    or an encoder-decoder cache of two such (its decoder's self-attention and cross-attention)."""
    from transformers.cache_utils import DynamicLayer
    if _is_encoder_decoder_cache(value):
        return all(map(_growing_cache, _parts(value)))
    if not _is_dynamic_cache(value) or \
            any(type(layer) is not DynamicLayer and not _window_growing(layer) and not _window_full(layer)
                for layer in value.layers):
        return False
    return len({layer.is_initialized for layer in value.layers}) <= 1


def _is_window(layer) -> bool:
    return type(layer).__name__ == "DynamicSlidingWindowLayer" and type(layer).__module__ == CACHE_MODULE


def _window_growing(layer) -> bool:
    """A sliding-window layer that still holds every token it has counted (at most its window less one)."""
    return _is_window(layer) and not layer.record_past and \
        layer.cumulative_length == (layer.keys.shape[-2] if layer.is_initialized else 0)


def _window_full(layer) -> bool:
    """A sliding-window layer that holds its last `sliding_window` − 1 tokens, of more."""
    return _is_window(layer) and not layer.record_past and layer.is_initialized and \
        layer.keys.shape[-2] == layer.sliding_window - 1 < layer.cumulative_length


def sliding_window_range(caches: dict) -> tuple[int, int | None] | None:
    """The range of `past` over which each sliding-window layer of the caches stays in its state,
    as (lowest, highest or None), or None without a window layer: a growing layer holds every token
    up to its `sliding_window` − 1, and a full one has seen more."""
    layers = [layer for c in _dynamic_caches(list(caches.values())) for layer in c.layers if _is_window(layer)]
    if not layers:
        return None
    return (max((layer.sliding_window for layer in layers if _window_full(layer)), default=0),
            min((layer.sliding_window - 1 for layer in layers if not _window_full(layer)), default=None))


@contextlib.contextmanager
def windows_as_captured(caches: dict):
    """While a step with sliding-window caches is captured, each window layer counts the tokens it
    has seen in a size: a growing layer acts as the full-attention layer it is until its window
    fills (its count is its keys' length; the model's `+=` to it is dropped, the keys grow
    instead, and it keeps every token: torch.export would fix `past` deciding where the crop to
    the window's last tokens starts, so `write_back` crops after the call); a full
    layer's count is the length of the tensor in its place, its `+=` makes another, and its mask
    sizes are those of a full window (its `>=` test would fix `past`). The counts are set aside
    from the inputs' structure (`_counts_set_aside`)."""
    if not any(_is_window(layer) for c in _dynamic_caches(list(caches.values())) for layer in c.layers):
        yield
        return
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer as Window
    update, mask_sizes = Window.__dict__["update"], Window.__dict__["get_mask_sizes"]

    # only the captured step's layers act so (their count is the mark, rebuilt from the structure):
    # another thread's eager layers keep their own count, and crop
    def count(layer):
        value = layer.__dict__.get("cumulative_length", 0)
        if _marked(value):
            return layer.keys.shape[-2] if layer.is_initialized else 0
        return value.shape[0] if isinstance(value, torch.Tensor) else value

    def set_count(layer, value):
        held = layer.__dict__.get("cumulative_length")
        if isinstance(held, torch.Tensor):      # a full window's: the new count, the length of an output
            layer.__dict__["cumulative_length"] = held.new_zeros((value, 0))
        elif not _marked(held):
            layer.__dict__["cumulative_length"] = value

    def update_as_captured(layer, *args, **kwargs):
        growing = _marked(layer.__dict__.get("cumulative_length"))
        return (DynamicLayer.update if growing else update)(layer, *args, **kwargs)

    def mask_sizes_as_captured(layer, query_length):
        if isinstance(layer.__dict__.get("cumulative_length"), torch.Tensor):     # full over the range of past
            return layer.sliding_window - 1 + query_length, layer.cumulative_length - layer.sliding_window + 1
        return mask_sizes(layer, query_length)
    Window.cumulative_length = property(count, set_count)
    Window.update, Window.get_mask_sizes = update_as_captured, mask_sizes_as_captured
    try:
        with _counts_set_aside(list(caches.values())):
            yield
    finally:
        del Window.cumulative_length
        Window.update, Window.get_mask_sizes = update, mask_sizes


def flatten_like(spec: pytree.TreeSpec, tree) -> list:
    """`spec.flatten_up_to(tree)`, the sliding-window layers' counts of tokens set aside as they
    were when the program was captured (`windows_as_captured`): transformers' flattening keeps
    every attribute of a layer, and a count that differs would make each step's cache a structure
    of its own."""
    with _counts_set_aside(tree):
        return spec.flatten_up_to(tree)


# a growing window layer's count while it is set aside: the same in every step's structure
COUNTED_BY_LENGTH = "cuvil: the keys' length"


def _marked(count) -> bool:
    return isinstance(count, str) and count == COUNTED_BY_LENGTH


@contextlib.contextmanager
def _counts_set_aside(tree):
    """A growing window layer's count replaced by the mark, a full one's by a tensor of no
    elements as long as the count (an input whose size is `past`)."""
    windows = [layer for c in _dynamic_caches(tree) for layer in c.layers if _is_window(layer)]
    counts = [layer.__dict__.get("cumulative_length") for layer in windows]
    for layer, count in zip(windows, counts):
        layer.__dict__["cumulative_length"] = torch.empty((count, 0)) if _window_full(layer) else COUNTED_BY_LENGTH
    try:
        yield
    finally:
        for layer, value in zip(windows, counts):
            layer.__dict__["cumulative_length"] = value


def cache_length(cache) -> int:
    """The tokens a supported cache has seen (0: an empty one): its length, `past` (an
    encoder-decoder cache's: its self-attention's; the cross-attention's is the encoder's length)."""
    cache = _parts(cache)[0]
    if not cache.layers or not cache.layers[0].is_initialized:
        return 0
    first = cache.layers[0]
    return first.cumulative_length if _is_window(first) else first.keys.shape[-2]


def new_tokens_axis(values: dict) -> tuple[str, int] | None:
    """Where a call counts its new tokens: `input_ids`' last axis or `inputs_embeds`' second (an
    encoder-decoder model's `decoder_input_ids` and `decoder_inputs_embeds`)."""
    decoder = "decoder_input_ids" in values or "decoder_inputs_embeds" in values
    ids, embeds = (values.get("decoder_input_ids"), values.get("decoder_inputs_embeds")) if decoder else \
        (values.get("input_ids"), values.get("inputs_embeds"))
    names = ("decoder_input_ids", "decoder_inputs_embeds") if decoder else ("input_ids", "inputs_embeds")
    if isinstance(ids, torch.Tensor) and ids.dim() >= 1:
        return names[0], ids.dim() - 1
    if isinstance(embeds, torch.Tensor) and embeds.dim() == 3:
        return names[1], 1
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
    caches = [v for v in values.values() if _is_cache(v) and _growing_cache(v) and cache_length(v)]
    where = new_tokens_axis(values)
    if not caches or where is None or where[1] not in hints.get(where[0], {}) \
            or not spans_past_and_new(values, cache_length(caches[0])):
        return hints
    kept = {a: d for a, d in hints[where[0]].items() if a != where[1]}
    return {n: h for n, h in {**hints, where[0]: kept}.items() if h}


def cache_dynamic_shapes(cache, past) -> list:
    """torch.export's dynamic shapes for a cache input (its window layers' counts set aside): one
    entry per pytree leaf, the keys' and values' sequence axis (-2 of [batch, heads, tokens, head
    dim]) as `past`, but a full window's (static) and an encoder-decoder cache's cross-attention's
    (the encoder's length, static), and the length of a full window's count."""
    parts = _parts(cache)
    full = [layer for c in parts for layer in c.layers if isinstance(layer.__dict__.get("cumulative_length"), torch.Tensor)]
    static = {id(t) for layer in full + (parts[1].layers if len(parts) > 1 else [])
              if getattr(layer, "is_initialized", False) for t in (layer.keys, layer.values)}
    counts = {id(layer.__dict__["cumulative_length"]) for layer in full}
    return [{0: past} if id(leaf) in counts else None if id(leaf) in static or leaf.dim() != 4 else {2: past}
            for leaf in pytree.tree_leaves(cache)]


def write_back(args: tuple, kwargs: dict, out):
    """`out` with each cache the call was given in place of the one the compiled call returned,
    after giving it the returned one's state. The model appended this call's keys and values to the
    cache it was given, in place; a compiled call returns new tensors, so the caller's cache
    becomes what eager PyTorch would have left: the same object, holding the longer keys and values."""
    given = [x for x in (*args, *kwargs.values()) if _is_cache(x)]
    if not given:
        return out
    returned = [x for x in pytree.tree_leaves(out, is_leaf=_is_cache) if _is_cache(x)]
    for mine, new in zip(given, returned, strict=True):
        for part, state in zip(_parts(mine), _parts(new), strict=True):
            _take_state(part, state)
        if _is_encoder_decoder_cache(mine):     # which layers' cross-attention keys are computed
            mine.is_updated = dict(new.is_updated)
    swap = dict(zip(map(id, returned), given))
    return pytree.tree_map(lambda x: swap.get(id(x), x), out, is_leaf=_is_cache)


def _take_state(mine, new) -> None:
    """A DynamicCache's layers given the state of the returned one's."""
    if not mine.layers:         # an empty cache (made without a config): the model made its layers
        mine.layers.extend(new.layers)
    for layer, state in zip(mine.layers, new.layers, strict=True):
        layer.__dict__.update(state.__dict__)
        if _is_window(layer):    # a growing one's count is its length, a full one's the length returned
            count = layer.__dict__["cumulative_length"]
            layer.cumulative_length = count.shape[0] if isinstance(count, torch.Tensor) else layer.keys.shape[-2]
            keep = layer.sliding_window - 1     # and a growing one keeps its window's last tokens, as eager's
            layer.keys, layer.values = layer.keys[:, :, -keep:, :], layer.values[:, :, -keep:, :]


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
    if spec.type is not None and _is_cache_type(spec.type):
        return 1
    return sum(_count_caches(c) for c in spec.children())


def _is_cache_type(cls) -> bool:
    """A cache type Cuvil compiles with: DynamicCache, or EncoderDecoderCache (of two DynamicCaches)."""
    return cls.__name__ in ("DynamicCache", "EncoderDecoderCache") and cls.__module__ == CACHE_MODULE


def _is_cache(x) -> bool:
    return _is_cache_type(type(x))


def _is_dynamic_cache(x) -> bool:
    return type(x).__name__ == "DynamicCache" and type(x).__module__ == CACHE_MODULE


def _is_encoder_decoder_cache(x) -> bool:
    return type(x).__name__ == "EncoderDecoderCache" and type(x).__module__ == CACHE_MODULE


def _parts(cache) -> list:
    """The DynamicCaches of a cache: itself, or an encoder-decoder cache's self- and cross-attention."""
    return [cache.self_attention_cache, cache.cross_attention_cache] if _is_encoder_decoder_cache(cache) else [cache]


def _dynamic_caches(tree) -> list:
    """The DynamicCaches in a pytree of inputs, those inside encoder-decoder caches too."""
    return [part for c in pytree.tree_leaves(tree, is_leaf=_is_cache) if _is_cache(c) for part in _parts(c)]


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
