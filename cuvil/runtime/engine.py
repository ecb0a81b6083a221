"""Programs as Python objects, and running them on the native engine (`cuvil._native`).

Kernel ABI: every kernel is `void kernel(char **bufs, const int64_t *dims)`. `bufs` holds one
pointer per slot of the step, in the step's slot order. A *splittable* kernel gets
`dims = [begin, end, d0, d1, ...]` and computes outer iterations `[begin, end)`; the runtime
splits `[0, d[extent])` into chunks across its threads when the step is big enough. Any other
kernel gets `dims = [d0, d1, ...]`.

The engine is built from a JIT module and a plain-data program (`Program.describe()` makes it):

    module = cuvil._native.JitModule(owner, [(name, address, n_slots, n_dims, splittable), ...])
        owner: any object that keeps the machine code alive (the llvmlite execution engine);
        n_dims counts the declared dims (without begin/end).

    program = {
      "symbols": n,            # runtime symbol values, numbered 0..n-1 (optional, default 0)
      "inputs": n, "outputs": n,
      "arena_bytes": EXPR,     # one arena per call, 64-byte aligned
      "slots": [               # the buffers the steps refer to, by index into this list
        {"kind": "input",  "index": i, "bytes": EXPR, "dtype": "f32"},
        {"kind": "output", "index": i, "bytes": EXPR, "dtype": "f32"},
        {"kind": "arena",  "offset": EXPR, "bytes": EXPR},
        {"kind": "const",  "data": TENSOR, "dtype": "f32"},  # any contiguous CPU DLPack tensor;
                                                              # the engine keeps it alive
        {"kind": "status", "errors": [MESSAGE, ...]},   # an i32 zeroed before every call; a kernel
      ],           # sets bit k there to fail the call: CuvilIndexError(errors[k]) after it, lowest k
      "steps": [
        {"kernel": ADDRESS,    # must be a kernel of the module
         "slots": [slot, ...], "dims": [EXPR, ...],
         "deps": [step, ...],  # earlier steps that must finish first (optional)
         "priority": int,      # among ready steps, higher runs first (optional, default 0)
         "split": {"extent": k, "cost_ns": EXPR, "align": int},  # iff the kernel is splittable:
        },                     # outer range [0, dims[k]), ~cost_ns per iteration, chunk multiple of align
      ],
    }
    EXPR: an int or a postfix token list over the symbols (see cuvil.runtime.exprs).

The engine refuses (ProgramError) a kernel address its module did not produce, a slot, dep,
offset or size out of range, a slot or dim count that does not match the kernel, an unbound
output. `Engine.run(inputs, outputs, symbols, profile)` takes `(address, nbytes)` pairs or
DLPack tensors, checks sizes (RunError), releases the GIL, and runs independent steps
concurrently on the pool; it is reentrant. Ready tasks run by priority; a worker prefers its own
chunk of a split step (chunk c is worker c's; the caller is worker 0), so that a step's chunk reads
what the same core wrote as the same chunk of the step before. With one thread (or one step) and
one chunk per step, the calling thread runs the steps in the order the queue would, without the
queue or the pool.
A thread out of work (a pool worker, or a caller waiting on the pool) polls for `spin_us()`
microseconds before it sleeps: `$CUVIL_SPIN_US` when the pool starts, default 50. `Engine.capsule()` exports the engine to C
(`native/include/cuvil/engine_capi.h`).
"""
from __future__ import annotations

import importlib.resources
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Sequence

import torch

from cuvil import _native
from cuvil.ir.types import DType, TensorType
from cuvil.runtime.exprs import binding, evaluate, to_postfix


@dataclass(frozen=True)
class Kernel:
    """One kernel of a JIT module, with the ABI facts the engine checks steps against."""
    name: str
    address: int
    n_slots: int
    n_dims: int
    splittable: bool = False


def load_module(owner: Any, kernels: Sequence[Kernel]) -> _native.JitModule:
    """Register the kernels of a JIT module; `owner` keeps their code alive as long as an engine uses it."""
    return _native.JitModule(owner, [(k.name, k.address, k.n_slots, k.n_dims, k.splittable) for k in kernels])


@dataclass(frozen=True)
class Slot:
    kind: str  # "input" | "output" | "arena" | "const" | "status"
    index: int | None = None        # input / output position
    type: TensorType | None = None  # input / output
    offset: Any = 0                 # arena: bytes from the arena start (int or sympy)
    bytes: Any = 0                  # arena
    data: torch.Tensor | None = None  # const
    errors: tuple[str, ...] = ()    # status: what the call refused where the status word has bit k

    @staticmethod
    def input(index: int, type: TensorType) -> "Slot":
        return Slot("input", index=index, type=type)

    @staticmethod
    def output(index: int, type: TensorType) -> "Slot":
        return Slot("output", index=index, type=type)

    @staticmethod
    def arena(offset, nbytes) -> "Slot":
        return Slot("arena", offset=offset, bytes=nbytes)

    @staticmethod
    def const(data: torch.Tensor) -> "Slot":
        return Slot("const", data=data)

    @staticmethod
    def status(errors) -> "Slot":
        """One step's status word (an i32 the engine zeroes before each call): bit k set after
        the call raises `CuvilIndexError(errors[k])` (the lowest such k)."""
        return Slot("status", errors=tuple(errors))


@dataclass(frozen=True)
class Split:
    extent: int    # index into Step.dims: the outer range is [0, dims[extent])
    cost_ns: Any   # estimated nanoseconds of one outer iteration (int or sympy)
    align: int = 1


@dataclass(frozen=True)
class Step:
    kernel: str
    slots: Sequence[int]
    dims: Sequence[Any] = ()
    deps: Sequence[int] = ()
    priority: int = 0
    split: Split | None = None


@dataclass
class Program:
    """What codegen hands the runtime. Symbols are numbered in the order of `symbols`."""
    inputs: Sequence[TensorType]
    outputs: Sequence[TensorType]
    slots: Sequence[Slot]
    steps: Sequence[Step]
    arena_bytes: Any = 0
    symbols: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> [lo, hi]
    input_names: Sequence[str] = ()

    def describe(self, kernels: dict[str, int]) -> dict:
        """The plain-data description `_native.Engine` takes; `kernels` maps names to addresses."""
        index = {name: i for i, name in enumerate(self.symbols)}
        post = lambda d: to_postfix(d, index)  # noqa: E731
        slots = []
        for s in self.slots:
            if s.kind in ("input", "output"):
                nbytes = post(s.type.numel() * s.type.dtype.itemsize)
                slots.append({"kind": s.kind, "index": s.index, "bytes": nbytes, "dtype": s.type.dtype.value})
            elif s.kind == "arena":
                slots.append({"kind": "arena", "offset": post(s.offset), "bytes": post(s.bytes)})
            elif s.kind == "const":
                slots.append({"kind": "const", "data": s.data, "dtype": DType.from_torch(s.data.dtype).value})
            elif s.kind == "status":
                slots.append({"kind": "status", "errors": list(s.errors)})
            else:
                raise ValueError(f"slot kind '{s.kind}' is not input, output, arena, const or status")
        steps = []
        for i, st in enumerate(self.steps):
            if st.kernel not in kernels:
                raise _native.ProgramError(f"invalid program: steps[{i}]: no kernel named '{st.kernel}' "
                                           f"in the JIT module")
            step = {"kernel": kernels[st.kernel], "slots": list(st.slots), "dims": [post(d) for d in st.dims],
                    "deps": list(st.deps), "priority": st.priority}
            if st.split is not None:
                step["split"] = {"extent": st.split.extent, "cost_ns": post(st.split.cost_ns),
                                 "align": st.split.align}
            steps.append(step)
        return {"symbols": len(self.symbols), "inputs": len(self.inputs), "outputs": len(self.outputs),
                "arena_bytes": post(self.arena_bytes), "slots": slots, "steps": steps}


class StepTiming(NamedTuple):
    step: int
    kernel: str
    chunk: int
    thread: int    # 0: the calling thread; 1..: pool workers
    start_ns: int  # time.monotonic_ns() clock
    end_ns: int


class Executable:
    """A program loaded into the native engine, called with torch tensors.

    Symbols bind from the input shapes (each symbol must appear in some input dim bare, or times
    an integer: `exprs.binding`); inputs are
    checked (dtype, rank, dims, symbol ranges), made contiguous, and outputs allocated here.
    """

    def __init__(self, program: Program, module: _native.JitModule, *, min_chunk_ns: int | None = None,
                 step_names: Sequence[str] | None = None):
        self.program = program
        self.module = module
        kernels = {name: address for name, address, *_ in module.kernels}
        options = {} if min_chunk_ns is None else {"min_chunk_ns": min_chunk_ns}
        self.engine = _native.Engine(module, program.describe(kernels), **options)
        index = {name: i for i, name in enumerate(program.symbols)}
        self._ranges = [program.symbols[name] for name in program.symbols]
        self._binders: dict[int, tuple[int, int, int]] = {}  # symbol -> (input, axis, q): the size over q
        for i, t in enumerate(program.inputs):
            for axis, d in enumerate(t.shape):
                bound = binding(d)
                if bound is not None and bound[0].name in index:
                    self._binders.setdefault(index[bound[0].name], (i, axis, bound[1]))
        unbound = [name for name, i in index.items() if i not in self._binders]
        if unbound:
            raise _native.ProgramError(f"invalid program: symbol(s) {', '.join(unbound)} appear in no input "
                                       f"shape as a plain dimension (or an integer times one), so no call can "
                                       f"bind them")
        self._in_shapes = [[to_postfix(d, index) for d in t.shape] for t in program.inputs]
        self._out_shapes = [[to_postfix(d, index) for d in t.shape] for t in program.outputs]
        # what profiles call each step: its own kernel, also where it runs code it shares with another
        self._kernel_names = list(step_names) if step_names is not None else [st.kernel for st in program.steps]

    def _input_name(self, i: int) -> str:
        names = self.program.input_names
        return f"input {i} ({names[i]})" if i < len(names) else f"input {i}"

    def _bind(self, inputs: Sequence[torch.Tensor]) -> list[int]:
        if len(inputs) != len(self.program.inputs):
            raise _native.RunError(f"expected {len(self.program.inputs)} inputs, got {len(inputs)}")
        for i, (x, t) in enumerate(zip(inputs, self.program.inputs)):
            if not isinstance(x, torch.Tensor):
                raise _native.RunError(f"{self._input_name(i)}: expected a torch.Tensor, got {type(x).__name__}")
            if x.device.type != "cpu":
                raise _native.RunError(f"{self._input_name(i)}: expected a CPU tensor, got device {x.device}")
            if x.dtype != t.dtype.torch:
                raise _native.RunError(f"{self._input_name(i)}: expected dtype {t.dtype.torch}, got {x.dtype}")
            if x.dim() != t.rank:
                raise _native.RunError(f"{self._input_name(i)}: expected {t.rank} dims {t}, got shape "
                                       f"{tuple(x.shape)}")
        symbols = [inputs[i].shape[axis] // q for i, axis, q in (self._binders[s] for s in range(len(self._ranges)))]
        for (name, (lo, hi)), v in zip(self.program.symbols.items(), symbols):
            if not lo <= v <= hi:
                raise _native.RunError(f"dimension {name} = {v} is outside its range [{lo}, {hi}]")
        for i, (x, shape) in enumerate(zip(inputs, self._in_shapes)):
            want = tuple(evaluate(d, symbols) for d in shape)
            if tuple(x.shape) != want:
                raise _native.RunError(f"{self._input_name(i)}: expected shape {want} "
                                       f"({self.program.inputs[i]}), got {tuple(x.shape)}")
        return symbols

    def _run(self, inputs: Sequence[torch.Tensor], profile: bool):
        symbols = self._bind(inputs)
        inputs = [x.resolve_neg().contiguous() for x in inputs]      # values as they read (torch's lazy negation)
        outputs = [torch.empty([evaluate(d, symbols) for d in shape], dtype=t.dtype.torch)
                   for shape, t in zip(self._out_shapes, self.program.outputs)]
        records = self.engine.run([(x.data_ptr(), x.nbytes) for x in inputs],
                                  [(y.data_ptr(), y.nbytes) for y in outputs], symbols, profile)
        return tuple(outputs), records

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self._run(inputs, False)[0]

    def profile(self, *inputs: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], list[StepTiming]]:
        """Run once, recording every kernel call (a split step records one per chunk)."""
        outputs, records = self._run(inputs, True)
        return outputs, [StepTiming(s, self._kernel_names[s], c, t, b, e) for s, c, t, b, e in records]

    def capsule(self):
        """A PyCapsule named 'cuvil.engine' for C extensions (native/include/cuvil/engine_capi.h)."""
        return self.engine.capsule()


def include_dir() -> str:
    """The directory holding cuvil/engine_capi.h, for C extensions that call engines via capsules."""
    return str(importlib.resources.files("cuvil") / "include")
