"""`cuvil.compile`: a function or `nn.Module` compiled to native code, recompiled when calls need it.

    @cuvil.compile                                   # or cuvil.compile(model, dynamic=..., threads=4)
    def f(x: "f32[B,512]"):                          # B: a dynamic dimension
        return torch.relu(x @ w)

The first call captures the target with the call's inputs (torch.export), runs the pass pipeline,
compiles the kernels and loads the program into the native engine; later calls whose inputs pass
the compiled variant's guard run natively with the GIL released. A guard checks what the variant
was compiled for: dtypes, ranks, static dims, the ranges of the dynamic dims and that every use
of one dynamic dim agrees, and the values of non-tensor arguments. A call no variant accepts
compiles a new variant, and `explain_recompiles()` says why:

- a static dim changed: the new variant makes it dynamic (automatic dynamic shapes), or compiles
  it static when torch.export cannot keep it dynamic or the model was compiled with dynamic=False;
- a dynamic dim left its range: the range grows to include the size;
- a dtype, rank or non-tensor argument changed: the new variant is compiled for the new call.

Size-0/1 dims cannot be captured as dynamic (torch specialises them), so when a dynamic dim is 0
or 1 in the call that triggers a compile, the capture sees the input repeated to size 2.
Weights are compiled in as constants: the model's parameters at the first call.
"""
from __future__ import annotations

import difflib
import functools
import inspect
import struct
import threading
import time
from dataclasses import dataclass, fields, replace
from typing import Any, Callable

import numpy as np
import torch
import torch.utils._pytree as pytree
from torch import nn

from .codegen import workers
from .codegen.grouping import grouping_for
from .codegen.target import CROSS_TARGETS, Target
from .compiler import Compilation, compile_module, paused_gc, pipeline_for, symbol_sizes
from .errors import CuvilError, CuvilIndexError, warn_user
from .index_inputs import index_bounds, size_limits
from .frontend import ImportResult, import_model, unflatten_outputs
from .frontend.annotations import function_annotations
from .fingerprint import Unfingerprintable
from .frontend.export import auto_hints, input_names, inspectable
from .frontend.hf_caches import PAST, flatten_like, static_new_tokens, write_back
from .frontend.random_draws import Draw
from . import imports
from .module_state import ModelState
from .model_cache import ModelKey, call_key, load_entry, model_key, store_entry
from .passes import Pipeline
from .report import CompileReport
from .schedule import anchor_misses
from ._native import TensorCall
from .runtime import get_num_threads, set_num_threads
from .runtime.exprs import binding, evaluate, to_postfix

BACKENDS = ("llvm",)
# Compiles one call may try after the first fails: each takes a narrower range torch.export or a
# size condition suggests (a split's pieces: from (n + 2)//3 = 4, then without n = 10)
MAX_REPLANS = 3
FALLBACKS = ("error", "eager")
CACHES = (True, "objects", False)       # both caches (compiled models and objects), the object cache only, neither


@dataclass(frozen=True)
class CompileOptions:
    backend: str = "llvm"                 # the code generator; LLVM (host CPU) is the one there is
    target: str = "host"                  # "host", or a cross target whose code is generated, not run
    enable_fusion: Any = True             # True: fused groups; False: one kernel per op; or a grouping
    pipeline: str = "O3"                  # the pass pipeline (O0-O3 or a pipeline string)
    disable_passes: tuple = ()            # passes of the pipeline switched off, by name
    precision: str = "fp32"               # "bf16"/"fp16": torch.autocast's numerics (mixed-precision)
    dynamic: Any = None                   # dynamic dims as `import_model` takes them; True: all; False: none
    ranges: dict | None = None            # {"batch": (1, 64)}
    threads: int | None = None            # the engine's thread pool size (process-wide)
    fallback: str = "error"               # "eager": run in PyTorch what Cuvil cannot compile
    cache: Any = True                     # True: object and compiled-model caches; "objects"; False
    max_recompiles: int = 8               # then calls no variant accepts run in eager PyTorch

    @staticmethod
    def of(options: dict[str, Any]) -> "CompileOptions":
        known = [f.name for f in fields(CompileOptions)]
        unknown = [k for k in options if k not in known]
        if unknown:
            hints = [f"'{k}' (did you mean '{m[0]}'?)" if (m := difflib.get_close_matches(k, known, 1)) else f"'{k}'"
                     for k in unknown]
            raise CuvilError(f"cuvil.compile: unknown option {', '.join(hints)}; the options are {', '.join(known)}")
        opts = CompileOptions(**options)
        if opts.backend not in BACKENDS:
            raise CuvilError(f"cuvil.compile: unknown backend {opts.backend!r}; available: {', '.join(BACKENDS)}")
        if opts.target != "host" and opts.target not in CROSS_TARGETS:
            raise CuvilError(f"cuvil.compile: unknown target {opts.target!r}; available: host, "
                             f"{', '.join(CROSS_TARGETS)}")
        if opts.fallback not in FALLBACKS:
            raise CuvilError(f"cuvil.compile: fallback must be one of {', '.join(map(repr, FALLBACKS))}, "
                             f"not {opts.fallback!r}")
        if opts.threads is not None:
            check_threads(opts.threads, "cuvil.compile: threads")
        if opts.cache not in CACHES:
            raise CuvilError(f"cuvil.compile: cache must be one of {', '.join(map(repr, CACHES))}, not {opts.cache!r}")
        _check_dynamic(opts.dynamic)
        if not (isinstance(opts.max_recompiles, int) and opts.max_recompiles >= 0):
            raise CuvilError(f"cuvil.compile: max_recompiles must be an int >= 0, not {opts.max_recompiles!r}")
        grouping_for(opts.enable_fusion)   # a bad grouping or pipeline fails here, not at the first call
        opts.passes()
        return opts

    def passes(self) -> Pipeline:
        return pipeline_for(self.pipeline, self.disable_passes, self.enable_fusion, self.precision)

    def code_options(self) -> dict:
        """What the generated code depends on (the compiled-model cache's share of the options)."""
        return {"backend": self.backend, "target": self.target, "enable_fusion": self.enable_fusion,
                "passes": self.passes(), "precision": self.precision}


def compile(target: Callable | None = None, /, **options) -> "CompiledModel | Callable[[Callable], CompiledModel]":
    """Compile a function or `nn.Module`; `@cuvil.compile` and `@cuvil.compile(option=...)` both work.

    Options: backend ("llvm"), target ("host", or "aarch64"/"riscv64"/"x86_64": code to read, not
    run), enable_fusion (True/False), pipeline ("O3"), disable_passes, precision ("fp32"; "bf16" or
    "fp16" give torch.autocast's numerics, rounding where it would compute in low precision), dynamic
    (`{"x": {0: "batch"}}` or one dict per positional input), ranges (`{"batch": (1, 64)}`),
    threads, fallback ("error" or "eager"), cache (True: the compiled-model cache (cuvil/model_cache.py)
    and the object cache; "objects": the object cache only; False: neither), max_recompiles."""
    opts = CompileOptions.of(options)
    if target is None:
        return lambda t: CompiledModel(t, opts)
    return CompiledModel(target, opts)


# ----------------------------------------------------------------------------- guards


SAVABLE_CONSTANTS = (int, float, bool, str, type(None))


@dataclass(frozen=True)
class _TensorCheck:
    dtype: torch.dtype
    rank: int
    static: tuple      # (axis, size)
    bind: tuple        # (axis, symbol number)
    derived: tuple     # (axis, postfix expression)
    values: tuple | None = None     # an index input: (lo, hi, the gather) its values must lie in
    scaled: tuple = ()  # (axis, symbol number, q): a dim the model needs a multiple of q, q * symbol


class Guard:
    """What one compiled variant accepts. `match` is the per-call fast path (symbol values or None);
    `mismatches` explains a refusal in words (the slow path, only when a call is refused)."""

    def __init__(self, in_spec: pytree.TreeSpec, symbols: dict[str, tuple[int, int]], hints: dict[str, str | None],
                 names: list[str], tensor_positions: list[int], checks: list[_TensorCheck], constants: dict[int, Any],
                 imported: ImportResult | None = None, limits: list[tuple[str, int | None, int | None, str]] = (),
                 draws: list[Draw] = ()):
        self.in_spec, self.imported = in_spec, imported
        self.draws = list(draws)     # the random tensors the program takes after the call's (bound)
        self.symbols = list(symbols)
        self.ranges = [tuple(symbols[s]) for s in self.symbols]
        # (symbol, least value, largest value, why): a size outside eager refuses (`size_limits`)
        self.limits = [limit for limit in limits if limit[0] in symbols]
        self.hints, self.names, self.tensor_positions = hints, names, tensor_positions
        self.checks, self.constants = checks, constants
        self.indices = [(k, c.values) for k, c in enumerate(checks) if c.values is not None]
        self.static_shapes = None if self.symbols else [
            (c.dtype, torch.Size([n for _, n in c.static])) for c in checks]
        # the common case, a flat tuple of tensors: no pytree walk per call
        n = in_spec.num_leaves
        self.positional = n if (not constants and tensor_positions == list(range(n))
                                and in_spec == pytree.tree_structure((tuple(range(n)), {}))) else None

    @staticmethod
    def of(imported: ImportResult, example_leaves: list) -> "Guard":
        """The guard of a compilation: what the imported function's arguments declare, and the
        example call's non-tensor arguments as constants."""
        fn = imported.function
        index = {s: i for i, s in enumerate(fn.symbols)}
        bounds = index_bounds(fn)
        checks = []
        users = fn.args[:len(fn.args) - len(imported.draws)]
        for a in users:
            static, bind, derived, scaled = [], [], [], []
            for axis, d in enumerate(a.type.shape):
                bound = binding(d)
                if isinstance(d, int):
                    static.append((axis, d))
                elif bound is not None and bound[1] == 1:
                    bind.append((axis, index[d.name]))
                elif bound is not None:
                    scaled.append((axis, index[bound[0].name], bound[1]))
                else:
                    derived.append((axis, to_postfix(d, index)))
            b = bounds.get(a.index)
            checks.append(_TensorCheck(a.type.dtype.torch, a.type.rank, tuple(static), tuple(bind), tuple(derived),
                                       None if b is None else (b.lo, b.hi, b.what), tuple(scaled)))
        tensors = set(imported.tensor_positions)
        return Guard(imported.exported.call_spec.in_spec, dict(fn.symbols),
                     {s: (imported.symbols[s].hint if s in imported.symbols else None) for s in fn.symbols},
                     [a.name or f"input {i}" for i, a in enumerate(users)], list(imported.tensor_positions),
                     checks, {i: v for i, v in enumerate(example_leaves) if i not in tensors}, imported,
                     [(lim.symbol, lim.lo, lim.hi, lim.why) for lim in size_limits(fn)],
                     [d.bound(index) for d in imported.draws])

    def is_static(self, name: str, axis: int) -> bool:
        """Input `name`'s dim `axis` has one size in this variant."""
        return any(n == name and any(a == axis for a, _ in c.static) for n, c in zip(self.names, self.checks))

    def state(self) -> dict:
        """The guard as JSON-able data (`Guard.from_state` rebuilds it), for saved models."""
        for i, v in self.constants.items():
            if type(v) not in SAVABLE_CONSTANTS:
                raise CuvilError(f"non-tensor argument {i} is a {type(v).__name__}: a saved model keeps non-tensor "
                                 f"arguments of the types {', '.join(t.__name__ for t in SAVABLE_CONSTANTS)} only")
        return {"in_spec": pytree.treespec_dumps(self.in_spec), "symbols": {s: list(r) for s, r in
                zip(self.symbols, self.ranges)}, "hints": self.hints, "names": self.names,
                "tensor_positions": self.tensor_positions,
                "checks": [[str(c.dtype).removeprefix("torch."), c.rank, c.static, c.bind, c.derived, c.values, c.scaled]
                           for c in self.checks],
                "constants": [[i, v] for i, v in self.constants.items()], "limits": [list(x) for x in self.limits],
                "draws": [d.state() for d in self.draws]}

    @staticmethod
    def from_state(state: dict) -> "Guard":
        checks = [_TensorCheck(getattr(torch, dtype), rank, tuple(map(tuple, static)), tuple(map(tuple, bind)),
                               tuple((axis, e) for axis, e in derived), tuple(more[0]) if more and more[0] else None,
                               tuple(map(tuple, more[1])) if len(more) > 1 else ())
                  for dtype, rank, static, bind, derived, *more in state["checks"]]
        return Guard(pytree.treespec_loads(state["in_spec"]), {s: tuple(r) for s, r in state["symbols"].items()},
                     state["hints"], state["names"], state["tensor_positions"], checks,
                     {i: v for i, v in state["constants"]}, limits=[tuple(x) for x in state.get("limits", [])],
                     draws=[Draw.from_state(d) for d in state.get("draws", [])])

    def leaves(self, args: tuple, kwargs: dict) -> list | None:
        try:
            return flatten_like(self.in_spec, (args, kwargs))
        except (ValueError, TypeError, KeyError, RuntimeError):
            return None

    def match(self, args: tuple, kwargs: dict) -> tuple[list, list[int]] | None:
        """(the input tensors, the symbol values) if this variant accepts the call."""
        if self.positional is not None and not kwargs and len(args) == self.positional:
            tensors = args
        else:
            leaves = self.leaves(args, kwargs)
            if leaves is None or any(not _same_constant(leaves[i], v) for i, v in self.constants.items()):
                return None
            tensors = [leaves[i] for i in self.tensor_positions]
        if self.static_shapes is not None:     # no symbols: compare whole shapes
            for x, (dtype, shape) in zip(tensors, self.static_shapes):
                if not isinstance(x, torch.Tensor) or x.is_nested or x.dtype is not dtype or x.shape != shape \
                        or not x.is_cpu or x.layout is not torch.strided:
                    return None
            return tensors, []
        values = [0] * len(self.symbols)
        for x, c in zip(tensors, self.checks):
            if not isinstance(x, torch.Tensor) or x.is_nested or x.dtype is not c.dtype or x.dim() != c.rank \
                    or not x.is_cpu or x.layout is not torch.strided:
                return None
            shape = x.shape
            for axis, n in c.static:
                if shape[axis] != n:
                    return None
            for axis, s in c.bind:
                if values[s] == 0:
                    values[s] = shape[axis]
                elif values[s] != shape[axis]:
                    return None
            for axis, s, q in c.scaled:
                v, rest = divmod(shape[axis], q)
                if rest or values[s] not in (0, v):
                    return None
                values[s] = v
        for v, (lo, hi) in zip(values, self.ranges):
            if not lo <= v <= hi:
                return None
        for x, c in zip(tensors, self.checks):
            for axis, e in c.derived:
                if x.shape[axis] != evaluate(e, values):
                    return None
        return tensors, values

    def native_ranges(self) -> list[tuple[int, int]]:
        """The symbol ranges the native fast path accepts: those of `match`, within the limits
        (whose calls it leaves to `check_indices` to refuse)."""
        ranges = list(self.ranges)
        for s, lo, hi, _ in self.limits:
            k = self.symbols.index(s)
            ranges[k] = (max(ranges[k][0], lo if lo is not None else ranges[k][0]),
                         min(ranges[k][1], hi if hi is not None else ranges[k][1]))
        return ranges

    def check_indices(self, tensors, values) -> None:
        """Raise as eager would where an index input holds a value its gather has no entry for,
        or a dynamic dim counts an arange past its gather's table (a compiled gather would read
        NaN there: cuvil/index_inputs.py). Apart from `match`: a call refused so is the caller's
        error, not a reason to compile another variant."""
        for s, lo, hi, why in self.limits:
            k = self.symbols.index(s)
            v = values[k]
            if (lo is not None and v < lo) or (hi is not None and v > hi):
                side = f"below {lo}" if lo is not None and v < lo else f"above {hi}"
                raise CuvilIndexError(f"dim {self._symbol_name(k)} is {v}, {side}: {why} (eager PyTorch raises too)")
        for k, (lo, hi, what) in self.indices:
            x = tensors[k]
            if x.numel() and not (lo <= int(x.min()) and int(x.max()) <= hi):
                bad = ((x < lo) | (x > hi)).nonzero()[0].tolist()
                raise CuvilIndexError(f"input '{self.names[k]}' holds {int(x[tuple(bad)])} at {bad}, outside "
                                      f"{what}: indices must lie in [{lo}, {hi}] (eager PyTorch raises too)")

    def mismatches(self, args: tuple, kwargs: dict) -> list["Mismatch"]:
        leaves = self.leaves(args, kwargs)
        if leaves is None:
            return [Mismatch("structure", f"the call's arguments are not structured like the compiled call's "
                                          f"({self.in_spec.num_leaves} values)")]
        out = []
        for i, v in self.constants.items():
            if not _same_constant(leaves[i], v):
                out.append(Mismatch("constant", f"non-tensor argument {i} is {leaves[i]!r}, compiled for {v!r} "
                                                f"(non-tensor arguments are compiled in as constants)"))
        seen: dict[int, tuple[int, str, int]] = {}
        for k, (pos, c) in enumerate(zip(self.tensor_positions, self.checks)):
            x, where = leaves[pos], f"input {k} ({self.names[k]})"
            if not isinstance(x, torch.Tensor):
                out.append(Mismatch("type", f"{where} is a {type(x).__name__}, compiled for a tensor"))
                continue
            if x.device.type != "cpu" or x.layout != torch.strided:
                out.append(Mismatch("device", f"{where} is a {x.layout} tensor on {x.device}; Cuvil runs dense "
                                              f"CPU tensors"))
            if x.dtype != c.dtype:
                out.append(Mismatch("dtype", f"{where} has dtype {x.dtype}, compiled for {c.dtype}", k))
            if x.dim() != c.rank:
                out.append(Mismatch("rank", f"{where} has rank {x.dim()} (shape {list(x.shape)}), compiled for "
                                            f"rank {c.rank}", k))
                continue
            for axis, n in c.static:
                if x.shape[axis] != n:
                    out.append(Mismatch("static", f"{where} dim {axis} is {x.shape[axis]}, compiled for {n} "
                                                  f"(a static dim)", k, axis, x.shape[axis], n))
            for axis, s in c.bind:
                v, (lo, hi), name = x.shape[axis], self.ranges[s], self._symbol_name(s)
                if not lo <= v <= hi:
                    out.append(Mismatch("range", f"{where} dim {axis} is {v}: {name} is outside its compiled "
                                                 f"range [{lo}, {hi}]", k, axis, v, symbol=self.symbols[s]))
                if s in seen and seen[s][2] != v:
                    k0, where0, v0 = seen[s]
                    out.append(Mismatch("inconsistent", f"{where0} and {where} dim {axis} are both {name} but "
                                                        f"differ ({v0} vs {v})", k, axis, v, symbol=self.symbols[s]))
                seen.setdefault(s, (k, where, v))
            for axis, s, q in c.scaled:
                v, (lo, hi), name = x.shape[axis], self.ranges[s], self._symbol_name(s)
                if v % q:
                    out.append(Mismatch("multiple", f"{where} dim {axis} is {v}: the model needs {name} a multiple "
                                                    f"of {q} (compiled as {q}*{self.symbols[s]})", k, axis, v,
                                        symbol=self.symbols[s]))
                elif not lo <= v // q <= hi:
                    out.append(Mismatch("range", f"{where} dim {axis} is {v}: {name} is outside its compiled "
                                                 f"range [{q * lo}, {q * hi}]", k, axis, v, symbol=self.symbols[s]))
        return out

    def size_range(self, symbol: str) -> tuple[int, int]:
        """The sizes an input dim of `symbol` may take: its range, times q where the dim is q times it."""
        s = self.symbols.index(symbol)
        q = next((q for c in self.checks for _, t, q in c.scaled if t == s), 1)
        return self.ranges[s][0] * q, self.ranges[s][1] * q

    def _symbol_name(self, s: int) -> str:
        hint = self.hints[self.symbols[s]]
        return f"{hint} ({self.symbols[s]})" if hint else self.symbols[s]


@dataclass
class Mismatch:
    kind: str            # structure constant type device dtype rank static range multiple inconsistent
    text: str
    input: int | None = None
    axis: int | None = None
    size: int | None = None
    was: int | None = None
    symbol: str | None = None


def _unsupported_input(args: tuple, kwargs: dict) -> str | None:
    """Why Cuvil cannot run a call's tensor input (before compiling for it), or None."""
    for i, x in enumerate(pytree.tree_leaves((args, kwargs))):
        if isinstance(x, torch.Tensor) and (x.is_nested or x.device.type != "cpu" or x.layout != torch.strided):
            what = "a nested tensor" if x.is_nested else f"a {x.layout} tensor on {x.device}"
            return f"input {i} is {what}; Cuvil runs dense CPU tensors"
    return None


def _same_constant(a, b) -> bool:
    """The same value compiled in: floats by their bits (-0.0 is not 0.0: 1/x differs; NaN is
    NaN, though NaN != NaN)."""
    if type(a) is float and type(b) is float:
        return struct.pack("<d", a) == struct.pack("<d", b) or a != a and b != b
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:       # values whose == is not a bool (arrays...) are never the same constant
        return False


# ----------------------------------------------------------------------------- variants


def _numpy_dtype(dtype: torch.dtype) -> np.dtype | None:
    """The numpy dtype of `dtype`, None where numpy lacks it (bfloat16...)."""
    try:
        return torch.empty(0, dtype=dtype).numpy().dtype
    except TypeError:
        return None


def _allocator(dtype: torch.dtype) -> Callable[[tuple], torch.Tensor]:
    """A function that allocates an output of `dtype`: through numpy where it has the dtype, which
    costs ~1 µs less per call than torch.empty (whose argument parsing dominates at these sizes).
    Such a tensor is an ordinary CPU tensor except that its storage cannot be resized."""
    np_dtype = _numpy_dtype(dtype)
    if np_dtype is None:
        return lambda shape: torch.empty(shape, dtype=dtype)
    return lambda shape: torch.from_numpy(np.empty(shape, np_dtype))


class NativeCall:
    """One engine called with torch tensors: allocates the outputs at the call's sizes, runs the
    engine (which releases the GIL) and rebuilds the model's output structure."""

    def __init__(self, engine, outputs: list[tuple[list, torch.dtype]], out_spec: pytree.TreeSpec, symbolic: bool,
                 draws: list[Draw] = ()):
        self.engine, self.out_spec, self.draws = engine, out_spec, list(draws)
        self._outputs = [(shape, _allocator(dtype)) for shape, dtype in outputs]
        self._static = None if symbolic else [(tuple(evaluate(d, []) for d in shape), alloc)
                                              for shape, alloc in self._outputs]
        self.output_dtypes = [dtype for _, dtype in outputs]

    def __call__(self, tensors, symbols: list[int]):
        return self.run(tensors, symbols, False)[0]

    def arguments(self, tensors, symbols: list[int]) -> list:
        """The program's arguments: the call's tensors, then this call's random draws."""
        return [*tensors, *(d.tensor(symbols) for d in self.draws)] if self.draws else tensors

    def run(self, tensors, symbols: list[int], profile: bool):
        """(the model's outputs, the engine's per-step records when `profile`)."""
        inputs = [x.resolve_neg().contiguous() for x in self.arguments(tensors, symbols)]   # (torch's lazy negation)
        if self._static is not None:
            outputs = [alloc(shape) for shape, alloc in self._static]
        else:
            outputs = [alloc(tuple(evaluate(d, symbols) for d in shape)) for shape, alloc in self._outputs]
        records = self.engine.run([(x.data_ptr(), x.nbytes) for x in inputs],
                                  [(y.data_ptr(), y.nbytes) for y in outputs], symbols, profile)
        return unflatten_outputs(self.out_spec, outputs), records


MISS = object()      # what a fast path returns for a call it does not take


def fast_path(guard: Guard, call: NativeCall) -> Callable[[tuple], Any] | None:
    """For a variant called positionally with contiguous CPU tensors only: a native callable
    (`cuvil._native.TensorCall`) that checks the call as the guard would, binds the symbols from
    the input shapes, allocates the outputs and runs the engine, or returns MISS (and the caller
    takes the general path). It is `Guard.match` then `NativeCall.run` with the per-call
    generality taken out, and no Python in between."""
    if guard.positional is None or guard.draws or any(c.scaled for c in guard.checks):   # (a multiple, a draw: the general path)
        return None
    inputs = [(c.dtype, c.rank, list(c.static), list(c.bind), list(c.derived), c.dtype.itemsize,
               None if c.values is None else tuple(c.values[:2])) for c in guard.checks]
    outputs = [(shape, _numpy_dtype(dtype), dtype, dtype.itemsize)
               for (shape, _), dtype in zip(call._outputs, call.output_dtypes)]
    spec = call.out_spec
    if spec.is_leaf():
        result, rebuild = 0, None
    elif spec.type is tuple and all(c.is_leaf() for c in spec.children()):
        result, rebuild = 1, None
    else:
        result, rebuild = 2, functools.partial(unflatten_outputs, spec)
    return TensorCall(call.engine, _tensor_api(), inputs, outputs, guard.native_ranges(), MISS, result, rebuild)


@functools.cache
def _tensor_api() -> dict:
    """What TensorCall reads a tensor with: torch.Tensor's getters and methods as attribute lookup
    would find them (resolved once here), and the allocators."""
    names = ("dtype", "shape", "is_cpu", "layout", "is_contiguous", "is_neg", "data_ptr")
    return {"type": torch.Tensor, "strided": torch.strided, "np_empty": np.empty, "from_numpy": torch.from_numpy,
            "torch_empty": torch.empty, **{n: inspect.getattr_static(torch.Tensor, n) for n in names}}


def fast_paths(variants) -> tuple:
    """The variants' fast paths, in order (a call takes the first that does not return MISS)."""
    return tuple(v.fast for v in variants if v.fast is not None)


class Variant:
    """One compilation: the import, the native program, the guard and the report."""

    def __init__(self, imported: ImportResult, compilation: Compilation, guard: Guard, sizes: dict[str, int]):
        self.imported, self.compilation, self.guard, self.sizes = imported, compilation, guard, sizes
        self.native = compilation.native
        program = self.native.program
        index = {s: i for i, s in enumerate(program.symbols)}
        self.outputs = [([to_postfix(d, index) for d in t.shape], t.dtype.torch) for t in program.outputs]
        executable = self.native.executable
        self._call = None if executable is None else NativeCall(executable.engine, self.outputs,
                                                                imported.output_structure, bool(program.symbols),
                                                                guard.draws)
        self.fast = None if self._call is None else fast_path(guard, self._call)
        self._detailed = False

    def run(self, tensors, symbols: list[int]):
        if self._call is None:
            target = self.native.kernels.target
            raise CuvilError(f"compiled for {target} (target='{target.arch}'): the code is in compiled.report, but "
                             f"it cannot run on this machine; compile with target='host' to run it")
        return self._call(tensors, symbols)

    def profile(self, tensors, symbols: list[int]):
        """Run once, recording every kernel call: (outputs, [StepTiming])."""
        outputs, timings = self.native.executable.profile(*self._call.arguments(tensors, symbols))
        return self.imported.unflatten(list(outputs)), timings

    @property
    def report(self) -> CompileReport:
        if not self._detailed:
            self.native.fill_report(self.compilation.report, self.sizes)
            self._detailed = True
        return self.compilation.report


class CachedVariant:
    """A variant loaded from the compiled-model cache (cuvil/model_cache.py). It runs the cached
    program; what only a compile produces (the report, the torch.export capture, the native
    model) comes from compiling the same call again, the first time one of them is asked for."""

    def __init__(self, saved, compile_again: Callable[[], Variant]):
        self.guard, self.fast, self._saved = saved.guard, saved.fast, saved
        self._compile_again, self._full = compile_again, None

    def run(self, tensors, symbols: list[int]):
        return self._saved.call(tensors, symbols)

    def profile(self, tensors, symbols: list[int]):
        return self._saved.profile(tensors, symbols)

    @property
    def full(self) -> Variant:
        if self._full is None:
            self._full = self._compile_again()
        return self._full

    compilation = property(lambda self: self.full.compilation)
    imported = property(lambda self: self.full.imported)
    native = property(lambda self: self.full.native)
    report = property(lambda self: self.full.report)


class CompiledModel:
    """A compiled function or module: call it like the original. See the module docstring."""

    def __init__(self, target: Callable, options: CompileOptions | None = None,
                 on_fallback: Callable[[str], None] | None = None):
        if not callable(target):
            raise CuvilError(f"cuvil.compile takes a function or an nn.Module, not a {type(target).__name__}")
        if isinstance(target, (torch.jit.ScriptModule, torch.jit.ScriptFunction)):
            raise CuvilError(f"cuvil.compile takes the nn.Module or function itself, not a TorchScript "
                             f"{type(target).__name__} (torch.jit.trace/script): torch.export, which Cuvil "
                             f"captures models with, cannot read TorchScript")
        self.target = inspectable(target)
        self.options = options or CompileOptions()
        self._variants: tuple[Variant, ...] = ()
        self._fast: tuple = ()          # the variants' native fast paths (`fast_path`)
        self._recompiles: list[str] = []
        self._state: ModelState | None = None    # what the variants baked in from the model
        self._dropped = 0                        # variants dropped because the model changed
        self._lock = threading.Lock()
        self._fallback_reason: str | None = None
        self._report: CompileReport | None = None
        self._auto: dict[str, dict[int, str]] = {}          # dims made dynamic after a recompile
        self._all_dynamic = self.options.dynamic is True     # dynamic=True, until a compile cannot keep it
        self._ranges: dict[str, tuple[int, int]] = dict(self.options.ranges or {})
        self._dynamic: dict[str, dict[int, str]] | None = None
        self._signature: inspect.Signature | None = None
        self._on_fallback = on_fallback or (lambda reason: warn_user(
            f"cuvil: {self._name()} runs in eager PyTorch: {reason}"))
        if not isinstance(target, nn.Module):
            functools.update_wrapper(self, target)
        if self.options.threads is not None:
            set_num_threads(self.options.threads)

    # -- calling
    def __call__(self, *args, **kwargs):
        # (inside another compile's trace the model's state is the tracer's: fake tensors in place of weights)
        if self._state is not None and self._state.changed() >= 0 and not torch.compiler.is_compiling():
            self._model_changed()
        if kwargs:
            args, kwargs = self._canonical(args, kwargs)
        else:
            try:
                for fast in self._fast:
                    if (out := fast(args)) is not MISS:
                        return out
            except RuntimeError:    # an input it cannot read (a nested tensor's shape): named below
                pass
        if torch.compiler.is_compiling():   # traced inside another compile (torch.export): the model itself
            return self.target(*args, **kwargs)
        for v in self._variants:
            hit = v.guard.match(args, kwargs)
            if hit is not None:
                v.guard.check_indices(*hit)
                return write_back(args, kwargs, v.run(*hit))
        unsupported = _unsupported_input(args, kwargs)
        if unsupported is not None and self.options.fallback != "eager":
            raise CuvilError(unsupported)
        variant = self._compile_for(args, kwargs) if self._fallback_reason is None and unsupported is None else None
        if variant is None:
            return self.target(*args, **kwargs)
        hit = variant.guard.match(args, kwargs)
        if hit is None:
            raise CuvilError("internal error: a variant compiled for this call does not accept it: "
                             + "; ".join(m.text for m in variant.guard.mismatches(args, kwargs)))
        variant.guard.check_indices(*hit)
        return write_back(args, kwargs, variant.run(*hit))

    def _canonical(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """One form per call, one variant: keyword arguments of leading parameters passed
        positionally; a call that still needs keywords passes every argument by name, the form
        `_as_example` gives torch.export (and so the form the guard's input structure has)."""
        if self._signature is None:
            self._signature = inspect.signature(self._forward())
        return canonical_call(self._signature, args, kwargs, f"{self._name()}'s signature")

    def save(self, path) -> None:
        """Write the compiled variants to `path` for `cuvil.load` (cuvil/saved.py): their programs,
        object code, packed weights and guards. Loading needs neither the model nor torch.export."""
        if self._state is not None and self._state.changed() >= 0:   # its variants answer for the old model
            self._model_changed()
        runnable = [v._saved if isinstance(v, CachedVariant) else v for v in self._variants
                    if isinstance(v, CachedVariant) or v.native.kernels.objects]
        if not runnable:
            raise CuvilError(f"{self._name()}: nothing compiled to save yet (or the model changed since): call "
                             f"the model (or compile_for) first")
        from .saved import save
        save(path, runnable, self._saved_signature())

    def _saved_signature(self) -> inspect.Signature | None:
        try:
            return inspect.signature(self._forward())
        except (TypeError, ValueError):
            return None

    def compile_for(self, *args, **kwargs) -> None:
        """Compile for a call like this one now, without running it (the first call would)."""
        if self._state is not None and self._state.changed() >= 0:
            self._model_changed()
        if kwargs:
            args, kwargs = self._canonical(args, kwargs)
        if not any(v.guard.match(args, kwargs) is not None for v in self._variants):
            self._compile_for(args, kwargs)

    def profile(self, *args, **kwargs):
        """Run once natively, recording each kernel call: (outputs, [StepTiming]); also stored in
        `report.profile["run"]`, with the steps that missed their latency anchor
        (`schedule.max_latency_us`) in `report.profile["anchor_misses"]`."""
        self(*args, **kwargs)      # compiles if needed
        if kwargs:
            args, kwargs = self._canonical(args, kwargs)
        for v in self._variants:
            hit = v.guard.match(args, kwargs)
            if hit is not None:
                outputs, timings = v.profile(*hit)
                v.report.profile["run"] = [t._asdict() for t in timings]
                v.report.profile["anchor_misses"] = [
                    {**vars(m), "over_us": m.over_us} for m in anchor_misses(timings, v.native.build.anchors_us)]
                return outputs, timings
        raise CuvilError(f"this call runs in eager PyTorch ({self._fallback_reason or 'no compiled variant'}); "
                         f"there is no native run to profile")

    # -- what happened
    @property
    def imported(self) -> ImportResult:
        """The import (torch.export capture and graph IR) of the latest compilation."""
        if not self._variants:
            raise CuvilError("nothing compiled yet: the first call compiles")
        return self._variants[-1].imported

    @property
    def report(self) -> CompileReport:
        """The CompileReport of the latest compilation (kernels, schedule and memory plan included)."""
        if self._report is None:
            if self._variants:       # the latest came from the compiled-model cache
                return self._variants[-1].report
            raise CuvilError("nothing compiled yet: the first call compiles")
        owner = self._variant_of(self._report)
        return self._report if owner is None else owner.report

    def _variant_of(self, report: CompileReport) -> Variant | None:
        """The compiled (not cache-loaded) variant whose compilation made `report`."""
        return next((v for v in self._variants if isinstance(v, Variant) and v.compilation.report is report), None)

    def explain_recompiles(self) -> list[str]:
        """Why each compilation after the first happened (and when calls went to eager PyTorch)."""
        return list(self._recompiles)

    @property
    def fallback_reason(self) -> str | None:
        """Why calls that no compiled variant accepts run in eager PyTorch, or None."""
        return self._fallback_reason

    @property
    def num_variants(self) -> int:
        return len(self._variants)

    @property
    def from_model_cache(self) -> bool:
        """Whether the latest variant was loaded from the compiled-model cache (not compiled)."""
        return bool(self._variants) and isinstance(self._variants[-1], CachedVariant)

    @property
    def threads(self) -> int:
        return get_num_threads()

    @threads.setter
    def threads(self, n: int) -> None:
        self.set_threads(n)

    def set_threads(self, n: int) -> None:
        """Threads of the native engine's pool. The pool is shared by the process: this applies to
        every compiled model."""
        check_threads(n, "threads")
        set_num_threads(n)

    # -- compiling
    def _compile_for(self, args: tuple, kwargs: dict) -> Variant | None:
        with self._lock:
            for v in self._variants:         # another thread may have compiled it meanwhile
                if v.guard.match(args, kwargs) is not None:
                    return v
            if self._fallback_reason is not None:
                return None
            reasons = self._variants[-1].guard.mismatches(args, kwargs) if self._variants else []
            if len(self._variants) + self._dropped > self.options.max_recompiles:
                self._fallback_reason = (f"max_recompiles={self.options.max_recompiles} reached; calls no "
                                         f"compiled variant accepts run in eager PyTorch")
                why = "; ".join(m.text for m in reasons) or "the model changed since its variants were compiled"
                self._recompiles.append(f"eager from now on: {self._fallback_reason} (this call: {why})")
                self._on_fallback(self._fallback_reason)
                return None
            note = self._plan(reasons, args, kwargs)
            for attempt in range(MAX_REPLANS + 1):
                try:
                    variant = self._compile(args, kwargs, static=note.get("static_dims", set()) | note["off_multiple"])
                    break
                except CuvilError as e:
                    if attempt == MAX_REPLANS or not self._replan(note, e):
                        return self._fail(e)
                except Exception as e:
                    return self._fail(e)
            narrowed = self._narrowed_past(variant, args, kwargs)
            if narrowed:
                self._variants = (*self._variants, variant)
                try:
                    variant = self._compile(args, kwargs, static=narrowed)
                except Exception as e:
                    return self._fail(e)
                self._recompiles.append(f"variant {len(self._variants)} keeps {', '.join(sorted(narrowed))} dynamic "
                                        f"only at sizes this call's are not (a constant bound of the model, or a "
                                        f"size 1 torch.export saw as 2): variant {len(self._variants) + 1}, for "
                                        f"this call, has them static")
            if reasons:
                text = "; ".join(m.text for m in reasons)
                note["auto"] = [(name, axis) for name, axis in note["auto"] if not variant.guard.is_static(name, axis)]
                static = any(m.axis is None for m in reasons) or \
                    all(variant.guard.is_static(variant.guard.names[m.input], m.axis) for m in reasons)
                action = self._describe(note) or (
                    "a variant for this call's arguments" if all(m.kind == "structure" for m in reasons)
                    else "compiled static again (the model specialises the dim)" if static
                    else "a variant for this call's sizes")
                self._recompiles.append(f"recompiled (variant {len(self._variants) + 1}): {text}"
                                        + (f" -> {action}" if action else ""))
            elif note.get("static"):
                self._recompiles.append(f"variant {len(self._variants) + 1} compiled static: dynamic=True could "
                                        f"not keep its dims dynamic ({note['static']})")
            self._variants = (*self._variants, variant)
            self._fast = fast_paths(self._variants)
            self._state = ModelState.of(self.target)     # after the trace, which may set attributes itself
            self._report = variant.compilation.report if isinstance(variant, Variant) else None
            return variant

    def _model_changed(self) -> None:
        """The model changed since its variants were compiled (`ModelState`): they would answer
        with the old one, so they are dropped, and the next calls compile again."""
        with self._lock:
            index = -1 if self._state is None else self._state.changed()
            if index < 0:           # another thread dropped them meanwhile
                return
            self._recompiles.append(f"the model changed after its compile ({self._state.describe(index)}): "
                                    f"{len(self._variants)} variant(s) dropped, calls compile again")
            self._dropped += len(self._variants)
            self._variants, self._fast, self._state = (), (), None

    def _fail(self, e: Exception) -> None:
        if self.options.fallback != "eager":
            raise e
        reason = f"{type(e).__name__}: {e}"
        self._fallback_reason = reason
        self._on_fallback(reason)
        report = CompileReport(name=self._name(), phases=[{"name": "fallback", "time_s": 0.0, "fallback": "eager",
                                                           "reason": reason}])
        if self._report is not None and self._variant_of(self._report) is None:
            # keep what the failed compilation got to (its IR and passes)
            report = replace(self._report, phases=[*self._report.phases, *report.phases])
        self._report = report
        if self._variants:
            self._recompiles.append(f"eager from now on for calls no compiled variant accepts: {reason}")
        return None

    def _plan(self, reasons: list[Mismatch], args: tuple, kwargs: dict) -> dict:
        """Adjust the dynamic dims and ranges for the mismatches that call for it."""
        note: dict = {"auto": [], "widened": [], "sizes": {}, "was": {}, "all_dynamic": self._all_dynamic,
                      "off_multiple": set()}
        if not self._variants:
            return note
        guard = self._variants[-1].guard
        params = self._param_names(args, kwargs)
        named: dict[tuple[int, int], str] = {}
        for m in reasons:
            if m.kind == "static" and guard.names[m.input] in params and self.options.dynamic is not False:
                name = guard.names[m.input]
                dim = named.setdefault((m.was, m.size), f"{name}_dim{m.axis}")
                self._auto.setdefault(name, {})[m.axis] = dim
                note["auto"].append((name, m.axis))
            elif m.kind == "multiple":      # a size the model takes another way (Swin pads it): static here
                note["off_multiple"].add(guard.hints[m.symbol] or m.symbol)
            elif m.kind == "range" and m.size > 0:     # an empty dim gets a static variant (`_narrowed_past`)
                hint = guard.hints[m.symbol] or m.symbol
                lo, hi = guard.size_range(m.symbol)
                note["was"].setdefault(hint, self._ranges.get(hint))
                # a cache grows a token a step: its length's range doubles, not one step a compile
                self._ranges[hint] = (min(lo, m.size), max(hi, m.size) if hint != PAST else max(2 * hi, m.size))
                note["widened"] = [w for w in note["widened"] if w[0] != hint] + [(hint, self._ranges[hint])]
                note["sizes"][hint] = m.size
        return note

    def _replan(self, note: dict, e: CuvilError) -> bool:
        """After a compile failed on the plan: dims made dynamic automatically (or by dynamic=True)
        become static again, where torch.export or Cuvil cannot keep them dynamic; a widened range
        becomes the range torch suggests around this call's size (the model specialises on the
        size: `x[:, 1:18]` is another program from 18 on). False: no other plan."""
        if note.get("auto"):
            for name, axis in note["auto"]:
                del self._auto[name][axis]
            note["auto"] = []       # a static compile that fails too fails the call (not a KeyError here)
            note["static"] = str(e).splitlines()[0]
            return True
        suggested = getattr(e, "suggested_ranges", {})
        widened = dict(note.get("widened", []) or note.get("suggested", []))
        # (a dim the model needs a multiple of has no range around a size that is none: static below)
        if widened and all(hint in suggested and suggested[hint][0] <= size <= suggested[hint][1]
                           and hint not in getattr(e, "suggested_multiples", {})
                           for hint, size in note["sizes"].items()):
            note["widened"], note["suggested"] = [], [(hint, suggested[hint]) for hint in widened]
            self._ranges.update(note["suggested"])
            return True
        if note.get("all_dynamic"):
            self._all_dynamic = False
            note["static"] = str(e).splitlines()[0]
            return True
        automatic = {d for axes in self._auto.values() for d in axes.values()}
        if automatic and not note.get("static_dims"):     # earlier calls' dynamic dims may not fit this one
            note["static_dims"] = automatic         # (a broadcast input: (8,) where both were (n, 8))
            note["static"] = str(e).splitlines()[0]
            return True
        if note["sizes"] and not note.get("static_dims"):
            # no range around this call's size: torch.export fixes the dim (`x[2:]` at size 1, which
            # its trace sees as 2, an empty slice there): this call's variant has those dims static
            for hint, was in note["was"].items():
                if was is None:
                    self._ranges.pop(hint, None)
                else:
                    self._ranges[hint] = was
            note["static_dims"], note["widened"], note["suggested"] = set(note["sizes"]), [], []
            note["static"] = str(e).splitlines()[0]
            return True
        return False

    @staticmethod
    def _describe(note: dict) -> str:
        parts = [f"{name} dim {axis} made dynamic" for name, axis in note.get("auto", [])]
        parts += [f"range of {hint} widened to [{lo}, {hi}]" for hint, (lo, hi) in note.get("widened", [])]
        parts += [f"range of {hint} set to [{lo}, {hi}], the one torch.export suggests (the model specialises "
                  f"on it)" for hint, (lo, hi) in note.get("suggested", [])]
        parts += [f"{hint} compiled static (a size that is no multiple)" for hint in sorted(note.get("off_multiple", ()))]
        if note.get("static"):
            parts = [f"compiled static (the dims could not stay dynamic: {note['static']})"]
        return ", ".join(parts)

    def _narrowed_past(self, variant, args: tuple, kwargs: dict) -> set[str]:
        """The dynamic dims of this call that the variant compiled for it does not serve at the
        call's size: its import narrowed their range past it (`x[:, 1:2]` holds from 2, as torch's
        trace assumes), or the capture, which sees a size 1 grown to 2, fixed them at 2."""
        guard = variant.guard
        if guard.match(args, kwargs) is not None:
            return set()
        hints = self._hints(_as_example(self._forward(), args, kwargs))
        return {guard.hints[m.symbol] or m.symbol if m.kind == "range" else hints[guard.names[m.input]][m.axis]
                for m in guard.mismatches(args, kwargs) if m.kind == "range" or
                m.kind == "static" and m.axis in hints.get(guard.names[m.input], {})}

    @paused_gc()
    def _compile(self, args: tuple, kwargs: dict, model_cache: bool = True,
                 static: set[str] = frozenset()) -> Variant | CachedVariant:
        """A variant for this call; the dims named in `static` compiled static."""
        phases: list[dict] = []
        self._report = None
        example = _as_example(self._forward(), args, kwargs)
        hints = {name: kept for name, axes in self._hints(example).items()
                 if (kept := {axis: d for axis, d in axes.items() if d not in static})}
        call = self._call_key(example, hints, phases)
        key = model_key(call, self.options.code_options()) \
            if call is not None and model_cache and self.options.cache is True and self.options.target == "host" else None
        if key is not None:
            cached = load_entry(key, args, kwargs)
            if cached is not None:
                return CachedVariant(cached, functools.partial(self._compile_again, args, kwargs))
        workers.prestart()      # the compile workers get LLVM ready while torch.export runs
        imported = self._import(call, example, hints, phases)
        leaves = flatten_like(imported.exported.call_spec.in_spec,
                              (example, {}) if isinstance(example, tuple) else ((), example))
        sizes = symbol_sizes(imported.function, [leaves[i] for i in imported.tensor_positions])
        self._report = CompileReport(name=self._name(), input_ir="", phases=phases)
        compilation = compile_module(imported.module, pipeline=self.options.passes(), name=self._name(),
                                     grouping=grouping_for(self.options.enable_fusion),
                                     cache="disk" if self.options.cache else None, hint_sizes=sizes,
                                     phases=phases, raise_errors=False, details=False,
                                     target=None if self.options.target == "host"
                                     else Target.cross(self.options.target))
        self._report = compilation.report
        if compilation.error is not None:
            raise compilation.error
        variant = Variant(imported, compilation, Guard.of(imported, leaves), sizes)
        if key is not None and variant.native.executable is not None:
            phase = {"name": "model_cache_store", "time_s": 0.0, "background": True}
            compilation.report.phases.append(phase)
            store_entry(key, variant, self._saved_signature(), self._name(), phase)
        return variant

    def _call_key(self, example, hints: dict, phases: list[dict]) -> ModelKey | None:
        """The call's key (`model_cache.call_key`), None when the caches are off or the model
        cannot be fingerprinted (the reason is in the phases)."""
        if not self.options.cache:
            return None
        t = time.perf_counter()
        try:
            key = call_key(self.target, _named(self._forward(), example), hints, self._ranges)
        except Exception as e:      # the caches are an optimisation: whatever stops the digest, compile
            reason = (str(e) if isinstance(e, Unfingerprintable) else "too deep" if isinstance(e, RecursionError)
                      else f"{type(e).__name__} while digesting the model: {e}")
            phases.append({"name": "fingerprint", "time_s": time.perf_counter() - t, "error": f"not cached: {reason}"})
            return None
        phases.append({"name": "fingerprint", "time_s": time.perf_counter() - t})
        return key

    def _import(self, call: ModelKey | None, example, hints: dict, phases: list[dict]) -> ImportResult:
        """torch.export and the import, or a copy of this process's import of the same call."""
        t = time.perf_counter()
        imported = imports.copy_of(call) if call is not None else None
        if imported is not None and _accepts(imported, example):
            phases.append({"name": "import", "time_s": time.perf_counter() - t,
                           "note": "a copy of this process's import of the same call"})
            return imported
        imported = import_model(self.target, _capture_example(self._forward(), example, hints), dynamic=hints or None,
                                ranges=self._ranges or None, name=self._ir_name())
        if call is not None:
            imports.keep(call, self.target, imported)
        phases.append({"name": "import", "time_s": time.perf_counter() - t})
        return imported

    def _compile_again(self, args: tuple, kwargs: dict) -> Variant:
        """The full compile of a call whose variant came from the compiled-model cache."""
        with self._lock:
            keep = self._report
            try:
                return self._compile(args, kwargs, model_cache=False)
            finally:
                self._report = keep

    def _hints(self, example) -> dict[str, dict[int, str]]:
        """Dynamic dims by parameter name: the user's (or the annotations'), plus automatic ones."""
        if self._dynamic is None:
            dynamic = self.options.dynamic
            if isinstance(dynamic, dict):
                ranges = {k: v for k, v in dynamic.items() if isinstance(v, tuple)}
                self._ranges = {**ranges, **self._ranges}
                dynamic = {k: v for k, v in dynamic.items() if not isinstance(v, tuple)}
            elif isinstance(dynamic, bool):
                dynamic = {}
            elif dynamic is not None:
                names = input_names(self._forward(), len(example) if isinstance(example, tuple) else 0)
                dynamic = {n: h for n, h in zip(names, dynamic) if h}
            else:
                dynamic = {n: a.hints() for n, a in function_annotations(self._forward()).items() if a.hints()}
            self._check_names(dynamic)
            self._dynamic = dynamic
        values = _named(self._forward(), example)
        out: dict[str, dict[int, str]] = {}
        if self._all_dynamic:        # the dims earlier variants had dynamic have ranges
            out = auto_hints(values, keep=self._ranges)
        for src in (self._dynamic, self._auto):
            for name, axes in src.items():
                x = values.get(name)
                for axis, dim in axes.items():
                    if isinstance(x, torch.Tensor) and -x.dim() <= axis < x.dim():
                        out.setdefault(name, {})[axis % x.dim()] = dim
                    elif isinstance(x, torch.Tensor) and src is self._dynamic:
                        raise CuvilError(f"dynamic dim {dim!r} is given for axis {axis} of input '{name}', "
                                         f"which has {x.dim()} dims (shape {tuple(x.shape)})")
        return static_new_tokens(values, out)

    def _check_names(self, dynamic: dict) -> None:
        """A typo in `dynamic=` is an error, not a static compile: every input it names is a
        parameter of the forward (any name, where it takes **kwargs). A dim in `ranges=` that no
        hint names is a warning, not an error: one dict of ranges may serve several models."""
        params = inspect.signature(self._forward()).parameters
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            unknown = [n for n in dynamic if n not in params]
            if unknown:
                raise CuvilError(f"dynamic= names input(s) {unknown}, which {self._name()} does not take; its "
                                 f"parameters are {list(params)}")
        dims = {d for axes in dynamic.values() if isinstance(axes, dict) for d in axes.values()}
        stray = sorted(set(self.options.ranges or {}) - dims - {PAST}) if dims else []
        if stray:
            warn_user(f"cuvil: ranges= names dim(s) {stray}, which no dynamic= hint of {self._name()} names "
                      f"(they name {sorted(dims)}): those ranges are not used")

    def _param_names(self, args: tuple, kwargs: dict) -> set[str]:
        return set(_named(self._forward(), _as_example(self._forward(), args, kwargs)))

    def _forward(self) -> Callable:
        return self.target.forward if isinstance(self.target, nn.Module) else self.target

    def _name(self) -> str:
        t = self.target
        return type(t).__name__ if isinstance(t, nn.Module) else getattr(t, "__name__", type(t).__name__)

    def _ir_name(self) -> str:
        name = self._name()
        return name if name.isidentifier() else "forward"

    def __repr__(self) -> str:
        state = f"eager: {self._fallback_reason}" if self._fallback_reason else f"{len(self._variants)} variant(s)"
        return f"<cuvil.CompiledModel {self._name()} ({state})>"


def _check_dynamic(dynamic) -> None:
    """`dynamic` is None, a bool, {input name: {axis: dim name} or (lo, hi) for a dim name}, or one
    {axis: dim name} (or None) per positional input."""
    if dynamic is None or isinstance(dynamic, bool):
        return
    if isinstance(dynamic, dict):
        bad = [(k, v) for k, v in dynamic.items() if not isinstance(v, (dict, tuple))]
    elif isinstance(dynamic, (list, tuple)):
        bad = [(i, v) for i, v in enumerate(dynamic) if not (v is None or isinstance(v, dict))]
    else:
        bad = [(None, dynamic)]
    if bad:
        where, value = bad[0]
        raise CuvilError("cuvil.compile: dynamic must be True (every dim torch.export can keep dynamic), False "
                         "(static dims only, never made dynamic), a dict by input name such as {'x': {0: 'batch'}} "
                         "or one {axis: name} dict per positional input; "
                         + (f"not {value!r}" if where is None else f"the entry for {where!r} is {value!r}"))


def _as_example(fn: Callable, args: tuple, kwargs: dict):
    """The call as torch.export takes it: a positional tuple, or (with keywords) a dict by name."""
    if not kwargs:
        return tuple(args)
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as e:
        raise CuvilError(f"the call does not match {getattr(fn, '__name__', 'the function')}'s signature: {e}") \
            from None
    params = bound.signature.parameters.values()
    if any(p.kind is p.VAR_POSITIONAL for p in params if p.name in bound.arguments):
        raise CuvilError("cuvil.compile: keyword arguments together with a *args parameter are not "
                         "supported; pass the inputs positionally")
    return _flat_arguments(bound)


def canonical_call(signature: inspect.Signature, args: tuple, kwargs: dict, what: str) -> tuple[tuple, dict]:
    """A call with keywords in the one form its variant's guard has (`CompiledModel._canonical`)."""
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as e:
        raise CuvilError(f"the call does not match {what}: {e}") from None
    if not bound.kwargs:
        return bound.args, {}
    spread = next((p.name for p in signature.parameters.values()
                   if p.kind is p.VAR_POSITIONAL and bound.arguments.get(p.name)), None)
    if spread is not None:     # every argument by name is the one form; *args has none
        raise CuvilError(f"the call passes keywords and arguments that land in *{spread} of {what}: "
                         f"pass them all positionally, or compile a function that names its parameters")
    return (), _flat_arguments(bound)


def _flat_arguments(bound: inspect.BoundArguments) -> dict[str, Any]:
    """The bound arguments by name, with what lands in **kwargs named like any other argument."""
    arguments = dict(bound.arguments)
    for p in bound.signature.parameters.values():
        if p.kind is p.VAR_KEYWORD:
            arguments.update(arguments.pop(p.name, {}))
    return arguments


MAX_THREADS = 1024      # the native engine's pool (native/src/bindings.cpp)


def check_threads(n, what: str) -> None:
    if not (isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_THREADS):
        raise CuvilError(f"{what} must be an int from 1 to {MAX_THREADS}, not {n!r}")


def _accepts(imported: ImportResult, example) -> bool:
    """Whether the program of a kept import takes this call: the key it was kept under leaves the
    sizes of dynamic dims out, and the program may need some of them (a multiple of 3 where the
    model branched on `n % 3`), which a call of the same key need not have."""
    args, kwargs = (example, {}) if isinstance(example, tuple) else ((), example)
    leaves = flatten_like(imported.exported.call_spec.in_spec, (args, kwargs))
    return Guard.of(imported, leaves).match(args, kwargs) is not None


def _named(fn: Callable, example) -> dict[str, Any]:
    return dict(example) if isinstance(example, dict) else dict(zip(input_names(fn, len(example)), example))


def _capture_example(fn: Callable, example, hints: dict[str, dict[int, str]]):
    """The example torch.export sees: dims marked dynamic that are 0 or 1 in the call grow to 2
    (repeating the data, so value-dependent code still sees real values)."""
    named = _named(fn, example)
    for name, axes in hints.items():
        x = named[name]
        for axis in axes:
            if x.shape[axis] == 1:
                x = torch.cat([x, x], axis)
            elif x.shape[axis] == 0:
                x = x.new_zeros([2 if k == axis else n for k, n in enumerate(x.shape)])
        named[name] = x
    return named if isinstance(example, dict) else tuple(named.values())
