"""Capture: a module or function + example inputs + dynamic-dimension hints -> a core-ATen
ExportedProgram, through torch.export and `run_decompositions`.

Hints name the dynamic dims of each input, per position (`[{0: "batch", 1: "seq"}]`) or per
parameter name (`{"x": {0: "batch"}}`); the same name in two places is the same dimension.
Ranges are `{"batch": (1, 64)}`, given with `ranges=` or inside the `dynamic` dict; a dim without
one gets `DEFAULT_RANGE`, or the smaller range torch.export suggests where the model allows less. A
plain function's string annotations (`x: "f32[B,512]"`) are hints too.
"""
from __future__ import annotations

import contextlib
import inspect
import io
import logging
import os
import re
import sys
import threading
import types
from dataclasses import dataclass, field
from typing import Any, Container

import torch
import torch.utils._pytree as pytree
from torch import nn
from torch.export import Dim
from torch.utils._sympy.value_ranges import ValueRanges

from ..errors import CuvilError, warn_user
from .annotations import check_example, examples_from_annotations, function_annotations, signature
from .aten_table import ATEN_TABLE, decomposition_table
from .hf_caches import (PAST, cache_dynamic_shapes, cache_inputs, cache_length, register_model_caches,
                        returns_each_cache, sliding_window_range, spans_past_and_new, static_new_tokens,
                        windows_as_captured)
from .complex_pairs import complex_as_pairs
from .inplace import functionalize_local_inplace
from .local_decompositions import decompose_locally
from .masked_updates import rewrite_masked_updates
from .random_draws import rewrite_random_ops
from .locations import exception_frame, record_user_frames, user_stack_traces
from ..runtime.exprs import binding
from .size_conditions import SizeConditionError, check_kept_guards, check_size_conditions

DEFAULT_RANGE = (1, 4096)
# torch.export keeps its tracing state in the process (a dispatch mode, the module being
# exported): two threads exporting at once broke each other's trace ("ProxyTorchDispatchMode slot
# already occupied"). Re-entrant: a model may compile another inside its own export.
_TRACING = threading.RLock()
# Exports one capture may try with the narrower ranges the last one suggested (each condition
# found can narrow a range again: a reshape's A*B % 4 == 0 after a split's bound on A)
MAX_FIXES = 3

Hints = dict[str, dict[int, str]]   # input name -> {axis: dim name}


@dataclass
class Captured:
    program: torch.export.ExportedProgram
    hints: Hints
    multiples: dict[str, int] = field(default_factory=dict)   # dim name -> q: the dim is asked as q*_name


class CuvilExportError(CuvilError):
    """torch.export could not capture the model; carries torch's reason, the user's line, and the
    ranges torch suggests for dynamic dims it could not keep over the asked ones ({name: (lo, hi)})."""

    def __init__(self, reason: str, source: str | None, suggested_ranges: dict[str, tuple[int, int]] | None = None,
                 suggested_multiples: dict[str, int] | None = None):
        self.reason, self.source = reason, source
        self.suggested_ranges = suggested_ranges or {}
        self.suggested_multiples = suggested_multiples or {}    # {name: q}: the model needs the dim a multiple of q
        text = f"torch.export could not capture the model: {reason}"
        super().__init__(text + (f"\n  at {source}" if source else ""))


def inspectable(target):
    """`target`, or where Python cannot read its signature (a builtin such as `torch.tanh`), a
    function of positional arguments that calls it (defined here, so that no source location
    names it)."""
    if isinstance(target, nn.Module):
        return target
    try:
        inspect.signature(target)
        return target
    except (TypeError, ValueError):
        def call(*args):
            return target(*args)
        call.__name__ = call.__qualname__ = getattr(target, "__name__", "forward")
        return call


def as_module(fn) -> nn.Module:
    """Wrap a plain function as a module for torch.export, keeping its parameter names (torch
    names the graph inputs after `forward`'s signature)."""
    def forward(self, *args, **kwargs):
        return fn(*args, **kwargs)

    sig = signature(fn)
    positional_only = any(p.kind is p.POSITIONAL_ONLY for p in sig.parameters.values())    # operator.add
    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY if positional_only
                                   else inspect.Parameter.POSITIONAL_OR_KEYWORD)
    forward.__signature__ = sig.replace(parameters=[self_param, *sig.parameters.values()])
    return type(getattr(fn, "__name__", "function"), (nn.Module,), {"forward": forward})()


def capture(model_or_fn, example_inputs, dynamic=None, ranges=None) -> Captured:
    """`example_inputs`: a tuple of positional inputs, one tensor, or a dict of keyword inputs."""
    fn = model_or_fn.forward if isinstance(model_or_fn, nn.Module) else model_or_fn
    annotations = function_annotations(fn)
    dynamic, ranges = _split_ranges(dynamic, ranges)
    if example_inputs is None:
        example_inputs = _examples_from(annotations, fn, ranges)
    if isinstance(example_inputs, dict):
        args, kwargs = (), dict(example_inputs)
    else:
        args, kwargs = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,), {}
    args, kwargs = _one_tensor_per_input(args, kwargs)
    named = input_names(fn, len(args)) + list(kwargs)
    values = dict(zip(named, (*args, *kwargs.values())))
    for name, ann in annotations.items():
        if name in values:
            check_example(name, ann, values[name])
    if dynamic is None and annotations:
        dynamic = {name: ann.hints() for name, ann in annotations.items()}
    hints = _hints_by_name(dynamic, named, values, positional=len(args))
    module = model_or_fn if isinstance(model_or_fn, nn.Module) else as_module(model_or_fn)
    _check_inference_mode(module)
    caches = cache_inputs(values)
    # `past` is dynamic from 2 tokens on (torch.export fixes a size of 1: a one-token prompt's first step)
    growing = {name: c for name, c in caches.items() if cache_length(c) > 1}
    spans = spans_past_and_new(values, cache_length(next(iter(growing.values())))) if growing else {}
    hints = static_new_tokens(values, hints)
    owner = getattr(model_or_fn, "__self__", None)     # a bound method (`model.forward`): its model's caches
    register_model_caches(owner if isinstance(owner, nn.Module) else module)
    record_user_frames(model_or_fn)
    sizes = {d: values[name].shape[ax] for name, h in hints.items() for ax, d in h.items()}
    for name, h in hints.items():
        for ax, d in h.items():
            lo, hi = ranges.get(d, (None, None))
            if lo is not None and not lo <= values[name].shape[ax] <= hi:
                raise CuvilError(f"input '{name}' dim {ax} ({d}) is {values[name].shape[ax]}, outside the range "
                                 f"[{lo}, {hi}] that ranges= declares for {d}")
    sizes.update({PAST: cache_length(c) for c in growing.values()})
    window = sliding_window_range(growing) if growing else None
    if window is not None:      # each sliding window stays growing, or full (hf_caches.py)
        lo, hi = ranges.get(PAST, (DEFAULT_RANGE[0], max(DEFAULT_RANGE[1], 2 * sizes[PAST])))
        ranges = {**ranges, PAST: (max(lo, window[0]), hi if window[1] is None else min(hi, window[1]))}
    open_dims = set() if growing or not _alike_sizes_agree(hints, values) else \
        {d for h in hints.values() for d in h.values() if not isinstance(d, AutoDim)}
    fixes: dict[str, tuple[int, int]] = {}
    multiples: dict[str, int] = {}
    for attempt in range(MAX_FIXES + 1):
        try:
            with windows_as_captured(caches):
                ep = _export(module, args, kwargs, named, hints, {**ranges, **fixes}, sizes, growing, spans,
                             open_dims - set(multiples), multiples)
            break
        except CuvilExportError as e:
            # a dim without a declared range asked for DEFAULT_RANGE; where the model allows less
            # (BERT's positions end at 512), take the range torch suggests if the example lies in it
            suggested, more = _of_base_dims(e, multiples)
            new = {d: r for d, r in suggested.items() if d in sizes and d not in ranges and fixes.get(d) != r}
            # where it needs a multiple of q (Swin's patches: h = 4*_h), ask for the multiples of q
            # that the example is one of (a declared range is the user's: its failures are said)
            more = {d: q for d, q in more.items()
                    if d in sizes and d not in ranges and sizes[d] % q == 0 and multiples.get(d) != q}
            if attempt == MAX_FIXES or not (new or more) or \
                    not all(lo <= sizes[d] <= hi for d, (lo, hi) in new.items()):
                raise
            fixes.update(new)
            multiples.update(more)
    _warn_pinned(hints, [d for d, (lo, hi) in fixes.items() if lo == hi and not isinstance(d, AutoDim)])
    returns_each_cache(ep.call_spec.out_spec, caches)
    return Captured(ep, {**hints, **_cache_hints(ep, growing)}, multiples)


def _of_base_dims(e: CuvilExportError, multiples: dict[str, int]) -> tuple[dict, dict]:
    """torch's suggested ranges and multiples, those of a base dim `_h` of a dim asked as `q*_h`
    said of `h`."""
    base = {f"_{d}": d for d in multiples}
    ranges = {base.get(n, n): (r if n not in base else (r[0] * multiples[base[n]], r[1] * multiples[base[n]]))
              for n, r in e.suggested_ranges.items()}
    more = {base.get(n, n): q * multiples.get(base.get(n), 1) for n, q in e.suggested_multiples.items()}
    return ranges, more


def _warn_pinned(hints: Hints, pinned: list[str]) -> None:
    """Dims the user asked dynamic that torch.export found the model specialises (CANINE's
    character length): compiled static at the example's size, said, not left silent."""
    for d in pinned:    # (no size in the text: Python shows a warning once per line and text)
        where = ", ".join(f"{name} dim {axis}" for name, h in hints.items() for axis, n in h.items() if n == d)
        warn_user(f"cuvil: dynamic dim '{d}' ({where}) is compiled static: torch.export found that the model "
                  f"specialises it to the example's size; each other size compiles a variant of its own")


def _alike_sizes_agree(hints: Hints, values: dict) -> bool:
    """Whether each dim name has one size over the inputs it names (torch.export checks this for a
    named `Dim`, and says which inputs differ)."""
    seen: dict[str, int] = {}
    return all(seen.setdefault(d, values[name].shape[ax]) == values[name].shape[ax]
               for name, h in hints.items() for ax, d in h.items())


def _export(module, args, kwargs, named: list[str], hints: Hints, ranges, sizes: dict[str, int],
            caches: dict, spans: dict, open_dims: set[str], multiples: dict[str, int]) -> torch.export.ExportedProgram:
    """One torch.export. An open dim (named by the user, no range declared) is asked as
    `Dim.DYNAMIC` first, so that torch settles its range where the model allows less than
    DEFAULT_RANGE (BERT's positions) in the same trace; where that does not give each such dim a
    plain symbol of its own, or fails, every dim is asked by name, whose errors say what to declare."""
    open_dims = open_dims - set(ranges)
    if open_dims:
        try:
            return _export_once(module, args, kwargs, named, hints, ranges, sizes, caches, spans, open_dims, multiples)
        except CuvilExportError as e:
            if e.suggested_ranges or e.suggested_multiples:     # to declare (`capture` exports again with it)
                raise
    return _export_once(module, args, kwargs, named, hints, ranges, sizes, caches, spans, set(), multiples)


def _export_once(module, args, kwargs, named: list[str], hints: Hints, ranges, sizes: dict[str, int],
                 caches: dict, spans: dict, open_dims: set[str], multiples: dict[str, int]) -> torch.export.ExportedProgram:
    dims = _make_dims(hints, ranges, open_dims, multiples)
    specs = {name: {ax: dims[d] for ax, d in h.items()} for name, h in hints.items()}
    if caches:
        past = Dim(PAST, min=ranges.get(PAST, DEFAULT_RANGE)[0], max=ranges.get(PAST, DEFAULT_RANGE)[1])
        specs.update({name: cache_dynamic_shapes(c, past) for name, c in caches.items()})
        for name, axes in spans.items():
            specs[name] = {**{ax: past + new for ax, new in axes.items()}, **specs.get(name, {})}
    values = dict(zip(named, (*args, *kwargs.values())))
    static = {n: _static_spec(pytree.tree_structure(values[n])) for n in named} if specs else {}
    shapes = {n: specs.get(n, static.get(n)) for n in named} if kwargs else \
        tuple(specs.get(n, static.get(n)) for n in named)
    if kwargs and specs:
        module = _keywords_as_parameters(module, named)
    def export(**options) -> torch.export.ExportedProgram:
        ep = torch.export.export(module, args, kwargs, dynamic_shapes=shapes if specs else None, **options)
        if open_dims or any(isinstance(d, AutoDim) for h in hints.values() for d in h.values()):
            check_kept_guards(ep, _dim_names(ep, hints), sizes)
        elif multiples:     # torch checks the guards on a dim asked as q*_h less than on one by name
            check_kept_guards(ep, *_base_dims(ep, hints, multiples, sizes))
        if open_dims:
            _settle_open_dims(ep, hints, open_dims)
        return ep
    try:
        with _TRACING, torch.no_grad(), _uncached_fake_tensors(), user_stack_traces(), _quiet_torch_logs():
            # guards on sizes that are not bounds (wav2vec2's `1 % (n//20 - 1) != 0`), which torch's
            # solver cannot prove over the range, fail the export: export again with them as
            # `_assert_scalar` nodes, and decide them at every size (size_conditions.py). HF's mask
            # sizes with a cache passed in make such guards: those exports defer them at once.
            deferred = bool(caches)
            if not deferred:
                try:
                    ep = export()
                except Exception as e:
                    if not _unprovable_guards(e):
                        raise
                    deferred = True
            if deferred:
                ep = export(prefer_deferred_runtime_asserts_over_guards=True)
                check_size_conditions(ep, _dim_names(ep, {**hints, **_cache_hints(ep, caches)}), sizes)
            if functionalize_local_inplace(ep.graph):
                ep.graph_module.recompile()
            if needs_decomposition(ep) and decompose_locally(ep.graph, decomposition_table(), _has_no_row):
                ep.graph_module.recompile()
            if needs_decomposition(ep):
                ep = ep.run_decompositions(decomposition_table())
            complex_as_pairs(ep)
            if rewrite_masked_updates(ep.graph) | rewrite_random_ops(ep.graph):
                ep.graph_module.recompile()
    except CuvilError:
        raise
    except SizeConditionError as e:
        raise CuvilExportError(e.reason, e.source, e.suggested, e.multiples) from None
    except Exception as e:   # torch raises many kinds; all mean "could not capture"
        frame = exception_frame(e)
        raise CuvilExportError(summarise(e), str(frame) if frame else None, suggested_ranges(e),
                               suggested_multiples(e)) from None
    return ep


def _one_tensor_per_input(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """torch.export takes a tensor passed twice (`f(x, x)`) as one input read in both places, so
    its program would answer a later call with two different tensors from the first alone. A
    repeated tensor is exported as a copy: two inputs that happen to be equal."""
    leaves = [x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
    if len({id(x) for x in leaves}) == len(leaves):
        return args, kwargs
    seen = set()

    def distinct(x):
        if isinstance(x, torch.Tensor):
            if id(x) in seen:
                return x.clone()
            seen.add(id(x))
        return x
    return pytree.tree_map(distinct, (args, kwargs))


def _uncached_fake_tensors():
    """FakeTensorMode's dispatch cache off. On a miss it builds an entry and then rebuilds the
    output from it: with symbolic sizes that is most of an export's shape arithmetic, and an export
    misses on nearly every op (a transformer block's export: 0.39 -> 0.21 s without it). A new patch
    each call: one patch object entered twice (a nested export) restores the wrong value."""
    return torch._dynamo.config.patch(fake_tensor_cache_enabled=False)


# torch's loggers that print, during an export Cuvil reports on itself, a traceback for a shape
# error ("failed while attempting to run meta") and the code around a data-dependent size
_NOISY_LOGGERS = ("torch._subclasses.fake_tensor", "torch.fx.experimental.symbolic_shapes")


@contextlib.contextmanager
def _quiet_torch_logs():
    """Errors only as Cuvil's own (their reason and the user's line): torch's loggers above quiet,
    and the partial graph torch.export prints to stderr with a data-dependent error left out (what
    else went to stderr meanwhile is written after). With TORCH_LOGS set, torch's output as asked."""
    if os.environ.get("TORCH_LOGS"):
        yield
        return
    loggers = [logging.getLogger(name) for name in _NOISY_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    stderr, graph = io.StringIO(), None
    try:
        with contextlib.redirect_stderr(stderr):
            yield
    except Exception as e:
        graph = getattr(e, "partial_fx_graph", None)
        raise
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
        text = stderr.getvalue()
        sys.stderr.write(text.replace(f"{graph}\n", "") if graph else text)


def _static_spec(tree: pytree.TreeSpec):
    """torch.export's dynamic shapes for an input kept static, in its own structure: torch takes a
    bare None for a tensor, but for a container (an encoder's `BaseModelOutput` beside a cache) a
    dict by key, or a list of its children's."""
    if tree.is_leaf():
        return None
    children = [_static_spec(c) for c in tree.children()]
    return dict(zip(tree.context, children)) if tree.type is dict else children


def _keywords_as_parameters(module: nn.Module, names: list[str]) -> nn.Module:
    """`module`, or where keywords of the call land in forward's **kwargs, a module around it whose
    forward names every argument of the call: torch.export's check of dynamic shapes fails on the
    nested dict of a **kwargs parameter ("Must provide a tree_name"). Its weights are then named
    `model.*`. (A copy of the module with its own forward would keep the names, but Hugging Face's
    output recording keeps per-call state on the instance and records the copy's layers wrongly.)"""
    params = signature(module.forward).parameters
    if all(n in params for n in names) or not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return module

    def forward(self, **kwargs):
        return self.model(**kwargs)
    forward.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in ["self", *names]])
    wrapper = nn.Module()
    wrapper.model = module
    wrapper.forward = types.MethodType(forward, wrapper)
    return wrapper


def _dim_names(ep: torch.export.ExportedProgram, hints: Hints) -> dict:
    """torch's symbol for each dynamic input dim -> the user's name for it."""
    out = {}
    for node in ep.graph.nodes:
        if node.op == "placeholder" and node.name in hints and isinstance(node.meta.get("val"), torch.Tensor):
            for ax, d in hints[node.name].items():
                size = node.meta["val"].shape[ax]
                if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                    out[size.node.expr] = str(d)
    return out


def _base_dims(ep: torch.export.ExportedProgram, hints: Hints, multiples: dict[str, int],
               sizes: dict[str, int]) -> tuple[dict, dict[str, int]]:
    """For the dims asked as q*_h: torch's symbol of each base dim -> its name `_h`, and the base
    dims' example sizes."""
    names = {}
    for node in ep.graph.nodes:
        if node.op == "placeholder" and node.name in hints and isinstance(node.meta.get("val"), torch.Tensor):
            for ax, d in hints[node.name].items():
                size = node.meta["val"].shape[ax]
                bound = binding(size.node.expr) if isinstance(size, torch.SymInt) and d in multiples else None
                if bound is not None:
                    names[bound[0]] = f"_{d}"
    return names, {f"_{d}": sizes[d] // q for d, q in multiples.items()}


def _cache_hints(ep: torch.export.ExportedProgram, caches: Container[str]) -> Hints:
    """Hints for the dynamic axes of the cache inputs (placeholders named after the input): the
    keys' and values' length, or a full window's count (hf_caches.py), is `PAST` (which a recompile
    then widens by that name)."""
    return {n.name: axes for n in ep.graph.nodes if n.op == "placeholder"
            and isinstance(n.meta.get("val"), torch.Tensor) and any(n.name.startswith(f"{c}_") for c in caches)
            if (axes := {ax: PAST for ax, size in enumerate(n.meta["val"].shape) if isinstance(size, torch.SymInt)})}


def needs_decomposition(ep: torch.export.ExportedProgram) -> bool:
    """Whether the exported graph has ops Cuvil does not import directly (or any mutation, or an
    op in training mode), so that `run_decompositions` must rewrite it first. Skipping it when it
    is not needed saves seconds: it traces the whole model again."""
    for node in ep.graph.nodes:
        if node.op != "call_function":
            continue
        target = node.target
        if _has_no_row(node) or (isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable):
            return True
        if target in _INFERENCE_ONLY and not _INFERENCE_ONLY[target](node):
            return True
    return False


def _has_no_row(node) -> bool:
    """A call of an op without mutation that the importer has no row for (a decomposition's to
    rewrite)."""
    target = node.target
    return target not in ATEN_TABLE and not (isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable)


def _rank(node) -> int:
    val = node.meta.get("val")
    return val.dim() if isinstance(val, torch.Tensor) else -1


# ops torch.export keeps whole before decompositions, which Cuvil imports in inference mode only
_INFERENCE_ONLY = {
    torch.ops.aten.batch_norm.default: lambda n: not n.args[5] and _rank(n.args[0]) >= 2,
    torch.ops.aten.dropout.default: lambda n: not n.args[2],
}


def input_names(fn, count: int) -> list[str]:
    """Names of the first `count` positional inputs as torch.export names them (`*args` -> args_0, ...)."""
    names = []
    for p in signature(fn).parameters.values():
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            names += [f"{p.name}_{i}" for i in range(count - len(names))]
        elif p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
    if count > len(names):
        raise CuvilError(f"{count} example inputs for {len(names)} positional parameters")
    return names[:count]


def _examples_from(annotations, fn, ranges) -> tuple:
    params = list(signature(fn).parameters)
    if not annotations or list(annotations) != params:
        raise CuvilError("no example inputs given, and not every parameter has a shape annotation "
                         "such as x: \"f32[B,512]\"")
    return examples_from_annotations(annotations, ranges)


_TRAINING_SENSITIVE = (nn.modules.dropout._DropoutNd, nn.modules.batchnorm._BatchNorm)


def _check_inference_mode(module: nn.Module) -> None:
    for name, m in module.named_modules():
        if m.training and isinstance(m, _TRAINING_SENSITIVE):
            raise CuvilError(f"{type(m).__name__} '{name or type(module).__name__}' is in training mode; call "
                             ".eval() on the model first (Cuvil compiles inference: dropout off, batch norm on "
                             "running statistics)")


def _split_ranges(dynamic, ranges) -> tuple[Any, dict[str, tuple[int, int]]]:
    """Ranges may ride inside a `dynamic` dict as `name: (lo, hi)`; pull them out."""
    ranges = dict(ranges or {})
    if isinstance(dynamic, dict):
        inside = {k: v for k, v in dynamic.items() if isinstance(v, tuple)}
        ranges.update(inside)
        dynamic = {k: v for k, v in dynamic.items() if k not in inside} or None
    for name, r in ranges.items():
        if not (len(r) == 2 and all(isinstance(x, int) for x in r) and 1 <= r[0] <= r[1]):
            raise CuvilError(f"range for '{name}' must be (min, max) integers with 1 <= min <= max, got {r!r}")
    return dynamic, ranges


def _hints_by_name(dynamic, named: list[str], values: dict, positional: int) -> Hints:
    """Hints per input name, from a dict keyed by name or a list over the positional inputs (True:
    every dim, `auto_hints`; False: none)."""
    if dynamic is True:
        return auto_hints(values)
    if dynamic is None or dynamic is False:
        return {}
    if isinstance(dynamic, dict):
        unknown = [k for k in dynamic if k not in values]
        if unknown:
            raise CuvilError(f"dynamic hints name unknown input(s) {unknown}; the inputs are {named}")
    else:
        dynamic = list(dynamic)
        if len(dynamic) > positional:
            raise CuvilError(f"{len(dynamic)} dynamic hints for {positional} positional inputs")
        dynamic = dict(zip(named, dynamic))
    return {name: _normalise_axes(h, values[name], name) for name, h in dynamic.items() if h}


class AutoDim(str):
    """The name of a dim that `dynamic=True` marks: torch.export keeps it dynamic where the model
    allows and fixes it to the example's size where not (`Dim.AUTO`); a dim named by the user must
    stay dynamic, or the export fails."""


def auto_hints(values: dict, keep: Container[str] = ()) -> Hints:
    """`dynamic=True`: every dim of every tensor in `values` (by input name), named `<input>_dim<axis>`,
    as an AutoDim, but for sizes 0 and 1, which torch.export specialises. A name in `keep` (a dim an
    earlier variant had dynamic) stays a plain name, which must stay dynamic, whatever its size (the
    capture sees sizes 0 and 1 grown to 2)."""
    hints: Hints = {}
    for name, x in values.items():
        for axis, n in enumerate(x.shape if isinstance(x, torch.Tensor) else ()):
            dim = f"{name}_dim{axis}"
            if dim in keep:
                hints.setdefault(name, {})[axis] = dim
            elif n > 1:
                hints.setdefault(name, {})[axis] = AutoDim(dim)
    return hints


def _normalise_axes(hint, x, where: str) -> dict[int, str]:
    if not isinstance(x, torch.Tensor):
        raise CuvilError(f"dynamic hint {hint} given for '{where}', which is not a tensor")
    if not isinstance(hint, dict):
        raise CuvilError(f"dynamic hint {hint!r} for '{where}' must be a dict of axis: dim name, "
                         f"such as {{0: \"batch\"}}")
    out = {}
    for axis, name in hint.items():
        if not -x.dim() <= axis < x.dim():
            raise CuvilError(f"dynamic hint for '{where}' names axis {axis}, but it has rank {x.dim()}")
        name = name.__name__ if isinstance(name, Dim) else name
        if not (isinstance(name, str) and name.isidentifier()):
            raise CuvilError(f"dynamic dim name {name!r} for '{where}' axis {axis} must be an identifier")
        out[axis % x.dim()] = name
    return out


def _make_dims(hints: Hints, ranges: dict[str, tuple[int, int]], open_dims: Container[str] = (),
               multiples: dict[str, int] | None = None) -> dict[str, Any]:
    names = {n for h in hints.values() for n in h.values()}
    dims = {}
    for n in sorted(names):
        lo, hi = ranges.get(n, DEFAULT_RANGE)
        q = (multiples or {}).get(n)
        if q and max(1, -(-lo // q)) < hi // q:     # the multiples of q in [lo, hi]: q * _n, as torch suggests
            dims[n] = q * Dim(f"_{n}", min=max(1, -(-lo // q)), max=hi // q)
            continue
        dims[n] = (Dim.STATIC if lo == hi else       # one size (a range torch suggests, or the user's)
                   Dim.AUTO(min=lo, max=hi) if isinstance(n, AutoDim) else
                   Dim.DYNAMIC(min=lo, max=hi) if n in open_dims else Dim(n, min=lo, max=hi))
    return dims


class _UnsettledDims(Exception):
    """An open dim torch.export did not keep as a plain symbol of its own (the export is redone
    with every dim by name)."""


def _settle_open_dims(ep: torch.export.ExportedProgram, hints: Hints, open_dims: Container[str]) -> None:
    """Check that each open dim is a plain symbol in every input it names, and none names two dims;
    its range starts at DEFAULT_RANGE's start. torch's ranges start at 2 for `Dim.DYNAMIC`,
    whose trace assumes sizes 0 and 1 away, as it does for a `Dim` asked from 1, whose range then
    starts at 1: the program is the same."""
    names: dict = {}
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    for name, axes in hints.items():
        for axis, d in axes.items():
            if d not in open_dims:
                continue
            size = placeholders[name].meta["val"].shape[axis]
            symbol = size.node.expr if isinstance(size, torch.SymInt) else None
            if symbol is None or not symbol.is_Symbol or names.setdefault(symbol, d) != d:
                raise _UnsettledDims(f"{d} is {size} in input '{name}'")
            vr = ep.range_constraints[symbol]
            if DEFAULT_RANGE[0] < vr.lower == 2:
                ep.range_constraints[symbol] = ValueRanges(DEFAULT_RANGE[0], vr.upper)


_STOP = re.compile(r"^(The following call raised this error|The error above occurred|from user code|"
                   r"User code traceback)")
_NOISE = re.compile(r"^(For more information|For more debugging help|For extended logs|If you suspect|"
                    r"For C\+\+ stack trace|consider using|Caused by:)")
_DIM_FIX = re.compile(r"(\w+) = Dim\('(\w+)'(?:, min=(\d+))?(?:, max=(\d+))?\)")
_STATIC_FIX = re.compile(r"^\s*(\w+) = (\d+)\s*$", re.MULTILINE)     # `C = 2`: the model needs that one size
_MULTIPLE_FIX = re.compile(r"^\s*(\w+) = (\d+)\*(\w+)\s*$", re.MULTILINE)    # `h = 4*_h`: a multiple of 4


# torch's report of a guard a declared range fails crashes on a bound its solver derives from a floor
# division (`11/2 <= n`, from `(1 + n)//3 != 1`), and loses the guard
_UNREPORTED_GUARD = re.compile(r"Expected op to be '==', got \S+ for ")
_VIOLATION = re.compile(r"Not all values of (\w+) = (\S+) in the specified range .*? satisfy the generated guard (.*)")
_BOUND = re.compile(r"(?:(\d+) <= (\S+)|(\S+) <= (\d+))")


def _violated_guards(e: BaseException) -> list[tuple[str, tuple[int, int] | None]]:
    """(dim name, (lo, hi) where the guard is only bounds on the dim, else None) for each guard
    that torch.export says not all values of a dim's range satisfy."""
    out = []
    for name, source, guard in _VIOLATION.findall(str(e)):
        bounds = [_BOUND.fullmatch(part) for part in guard.strip().rstrip(".").split(" and ")]
        if not all(b and source in (b[2], b[3]) for b in bounds):
            out.append((name, None))
            continue
        lo = max([int(b[1]) for b in bounds if b[1]], default=DEFAULT_RANGE[0])
        hi = min([int(b[4]) for b in bounds if b[4]], default=DEFAULT_RANGE[1])
        out.append((name, (lo, hi)))
    return out


def _unprovable_guards(e: BaseException) -> bool:
    return any(r is None for _, r in _violated_guards(e))


def suggested_ranges(e: BaseException) -> dict[str, tuple[int, int]]:
    """The ranges torch's suggested fixes give dims (`x_dim1 = Dim('x_dim1', min=100, max=150)`), or
    where it suggests no range for a dim (it may suggest `n = 20*_n` instead), the bounds of a
    violated guard made only of them (`60 <= L['x'].size()[1] and L['x'].size()[1] <= 4096`)."""
    out = {name: r for name, r in _violated_guards(e) if r is not None}
    out.update({m[2]: (int(m[3] or DEFAULT_RANGE[0]), int(m[4] or DEFAULT_RANGE[1]))
                for m in _DIM_FIX.finditer(str(e))})
    out.update({m[1]: (int(m[2]), int(m[2])) for m in _STATIC_FIX.finditer(str(e))})
    return out


def suggested_multiples(e: BaseException) -> dict[str, int]:
    """The dims torch's suggested fixes make multiples (`h = 4*_h`, or `_h = 2*__h` of a dim asked
    as `4*_h`): {name: q}."""
    return {m[1]: int(m[2]) for m in _MULTIPLE_FIX.finditer(str(e))}


def summarise(e: BaseException, max_lines: int = 10) -> str:
    """torch's reason in a few lines (suggested fixes included), without its debugging boilerplate."""
    out = []
    for line in str(e).strip().splitlines():
        text = line.strip()
        if _STOP.match(text):
            break
        if text and not _NOISE.match(text):
            out.append(re.sub(r"\s*For more information, run with TORCH_LOGS=\S+", "", line.rstrip()))
    if len(out) > max_lines:
        out = out[:max_lines] + ["..."]
    if "data-dependent" in str(e):
        out.insert(0, "the model branches on, or sizes a tensor by, tensor values (data-dependent control flow); "
                      "torch.compile(model, backend=\"cuvil\") runs such a branch in Python and compiles the "
                      "graphs around it with Cuvil. torch.export said:")
    if _UNREPORTED_GUARD.search(str(e)):
        out.insert(0, "the model needs a condition on its dynamic sizes that fails somewhere in their declared "
                      "ranges, and torch.export's report of which one crashed (a fractional bound, from a floor "
                      "division). Declare a narrower range around the example's size, or none (Cuvil then finds "
                      "the range itself). torch said:")
    text = "\n".join(out) or type(e).__name__
    # torch suggests its own API; say it in Cuvil's: ranges={"n": (3, 64)}
    return _DIM_FIX.sub(lambda m: f'ranges={{"{m[2]}": ({m[3] or DEFAULT_RANGE[0]}, {m[4] or DEFAULT_RANGE[1]})}}', text)
