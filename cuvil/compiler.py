"""The native compile driver: graph IR (after the pass pipeline) -> kernels -> one LLVM module -> a
program for the native engine.

    groups  = grouping(fn)                       # which ops share a kernel (pluggable)
    lowered = lower_function(fn, groups)         # one kernel per group
    compiled = compile_kernels(...)              # one LLVM module, O3, object cache, JIT
    program = build_program(fn, constants, lowered)
    native  = NativeModel(..., Executable(program, load_module(compiled, ...)))

The program binds each graph value to a slot: function arguments to input slots, `cuvil.const`
results to constant slots (the module's weights, contiguous), returned values to output slots, and
every other value a kernel writes (and every scratch buffer) to a region of one arena placed by
`memory_plan`. Steps run in program order; a step depends on the steps that wrote what it reads
and, where it takes over an arena region, on the steps that used the region before.

`compile_module(module, pipeline=...)` runs the pass pipeline too and returns a `Compilation`: the
CompileReport (passes, kernels, schedule, memory plan, compile phases) and the `NativeModel`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import sympy
import torch

from .codegen.jit import DISK_CACHE, CompiledKernels, compile_kernels
from .codegen.kernel_ir import Gemm, Kernel, Loop, Reduce
from .codegen.lower import (INLINE_OPS, REMATERIALIZED, SKIP_OPS, LoweredKernel, fusible_operands,
                            group_elementwise_chains, kernel_name, lower_group, needs_memory, op_kind)
from .errors import CuvilError
from .ir.core import Builder, Function, Module, Operation, Value
from .ir.printer import print_module, value_names
from .ir.types import norm_dim, sym
from .memory_plan import BufferUse, MemoryPlan, plan_memory
from .passes import Instrument, IRSnapshot, PassManager, VerifyEach
from .report import CompileReport, source_lines
from .runtime import Executable, Program, Slot, Split, Step, load_module

Grouping = Callable[[Function], "list[list[Operation]]"]

# ----------------------------------------------------------------------------- grouping


def group_single_ops(fn: Function) -> list[list[Operation]]:
    """No fusion: one kernel per op. Views and inline constants still go with the ops that read them
    (they are index arithmetic, recomputed where they are read), except where an op reads an operand
    from memory (a GEMM's operands, a gather's table); a view gets a kernel of its own when
    something needs it in memory (a return, such an operand)."""
    groups = []
    for op in fn.ops:
        if op.name in SKIP_OPS or (op_kind(op) in REMATERIALIZED and not needs_memory(op)):
            continue
        group = [op]
        frontier = fusible_operands(op)
        while frontier:
            p = frontier.pop().owner
            if isinstance(p, Operation) and p not in group and op_kind(p) in REMATERIALIZED:
                group.append(p)
                frontier.extend(fusible_operands(p))
        groups.append(group)
    return groups


GROUPINGS: dict[str, Grouping] = {"fused": group_elementwise_chains, "single": group_single_ops}


def register_grouping(name: str, grouping: Grouping) -> None:
    """Make `grouping` available by name; registering "fused" changes what `enable_fusion=True` uses."""
    GROUPINGS[name] = grouping


def grouping_for(enable_fusion: bool | str | Grouping) -> Grouping:
    if callable(enable_fusion):
        return enable_fusion
    if isinstance(enable_fusion, str):
        if enable_fusion not in GROUPINGS:
            raise CuvilError(f"unknown grouping '{enable_fusion}'; known: {', '.join(GROUPINGS)}")
        return GROUPINGS[enable_fusion]
    return GROUPINGS["fused" if enable_fusion else "single"]


# ----------------------------------------------------------------------------- outputs


def materialize_outputs(fn: Function) -> int:
    """Give every returned value a buffer of its own: a returned argument, constant, or a value
    returned twice is copied (`cuvil.copy`) so that each output slot is written by one kernel."""
    ret = fn.return_op
    seen: set[int] = set()
    added = 0
    for i, v in enumerate(list(ret.operands)):
        borrowed = isinstance(v.owner, Function) or v.owner.name == "cuvil.const"
        if borrowed or id(v) in seen:
            copy = Builder(fn, fn.ops.index(ret)).create("cuvil.copy", [v], loc=ret.loc)
            ret.set_operand(i, copy.result)
            added += 1
        seen.add(id(ret.operands[i]))
    return added


# ----------------------------------------------------------------------------- costs

GEMM_FLOPS_PER_NS = 16     # one core, single precision, conservatively
NS_PER_STATEMENT = 1


def iteration_cost_ns(kernel: Kernel, symbols: set[str]) -> Any:
    """Rough nanoseconds of one iteration of a kernel's parallel loop, as an expression over the
    program's symbols (inner extents that depend on loop variables are taken at variable 0)."""
    expr = sympy.sympify(_work(kernel.parallel_loop.body))
    expr = expr.xreplace({s: sympy.Integer(0) for s in expr.free_symbols if s.name not in symbols})
    return norm_dim(sympy.Max(1, expr))


def _work(stmts) -> Any:
    total = sympy.Integer(0)
    for s in stmts:
        if isinstance(s, Loop):
            total += s.extent * _work(s.body)
        elif isinstance(s, Reduce):
            n = sympy.Integer(1)
            for r in s.loops:
                n *= r.extent
            total += n * (_work(s.body) + NS_PER_STATEMENT)
        elif isinstance(s, Gemm):
            total += sympy.floor(2 * s.m * s.n * s.k / GEMM_FLOPS_PER_NS)
        else:
            total += NS_PER_STATEMENT
    return total


# ----------------------------------------------------------------------------- the program


@dataclass
class SlotInfo:
    """What a program slot holds, for the report."""
    kind: str
    name: str          # the printed IR value (`%x`, `%12`), or `kernel/scratch`


@dataclass
class ProgramBuild:
    program: Program
    plan: MemoryPlan
    slots: list[SlotInfo]


class Sizes:
    """Values of a size expression at fixed symbol values (cached: the planner asks often)."""

    def __init__(self, values: dict[str, int]):
        self.values = {sym(k): sympy.Integer(v) for k, v in values.items()}
        self._cache: dict = {}

    def __call__(self, e) -> int:
        if isinstance(e, int):
            return e
        if e not in self._cache:
            self._cache[e] = int(sympy.sympify(e).xreplace(self.values))
        return self._cache[e]


def build_program(fn: Function, constants: dict[str, torch.Tensor], lowered: list[LoweredKernel],
                  hint: Sizes, entry: dict[str, str] | None = None) -> ProgramBuild:
    """Slots, steps, deps, splits and the arena plan for `lowered` (the kernels of `fn`, in order);
    `entry` renames kernels that share code (`shared_entries`)."""
    entry = entry or {}
    names = value_names(fn)
    slots: list[Slot] = []
    infos: list[SlotInfo] = []
    slot_of: dict[Any, int] = {}

    def add(slot: Slot, info: SlotInfo, key=None) -> int:
        slots.append(slot)
        infos.append(info)
        if key is not None:
            slot_of[key] = len(slots) - 1
        return len(slots) - 1

    for i, a in enumerate(fn.args):
        add(Slot.input(i, a.type), SlotInfo("input", "%" + names[a]), id(a))
    for i, v in enumerate(fn.return_op.operands):
        add(Slot.output(i, v.type), SlotInfo("output", "%" + names[v]), id(v))

    # a planned buffer is keyed by its value's id, or by its name (`kernel/buffer`) for scratch
    producer: dict[Any, int] = {}
    readers: dict[Any, set[int]] = {}
    arena: dict[str, tuple[Any, Any]] = {}     # planned buffer name -> (key, bytes)
    step_keys: list[list] = []
    for k, lk in enumerate(lowered):
        row = []
        for buf, v in zip(lk.kernel.buffers, lk.values):
            if v is None:
                name = f"{lk.kernel.name}/{buf.name}"
                arena[name] = (name, _nbytes(buf.shape, buf.dtype.itemsize))
                producer[name] = k
                row.append(name)
                continue
            if buf.role == "out":
                if id(v) in producer:
                    raise CuvilError(f"internal error: %{names[v]} is written by two kernels "
                                     f"({lowered[producer[id(v)]].kernel.name} and {lk.kernel.name})")
                producer[id(v)] = k
                if id(v) not in slot_of:
                    arena["%" + names[v]] = (id(v), _nbytes(v.type.shape, v.type.dtype.itemsize))
            else:
                readers.setdefault(id(v), set()).add(k)
                if id(v) not in slot_of and id(v) not in producer:
                    if not (isinstance(v.owner, Operation) and v.owner.name == "cuvil.const"):
                        raise CuvilError(f"internal error: kernel {lk.kernel.name} reads %{names[v]}, which no "
                                         f"earlier kernel writes")
                    add(Slot.const(_constant(constants, v)), SlotInfo("const", "@" + v.owner.attrs["name"]), id(v))
            row.append(id(v))
        step_keys.append(row)

    missing = [names[v] for v in fn.return_op.operands if id(v) not in producer]
    if missing:
        raise CuvilError(f"internal error: output(s) %{', %'.join(missing)} are written by no kernel")

    uses = []
    for name, (key, nbytes) in arena.items():
        touched = {producer[key]} | readers.get(key, set())
        uses.append(BufferUse(name, nbytes, producer[key], max(touched), frozenset(touched)))
    plan = plan_memory(uses, hint)
    for b in plan.buffers:
        add(Slot.arena(b.offset, b.use.nbytes), SlotInfo("arena", b.use.name), arena[b.use.name][0])

    deps_of = []
    for k, (lk, keys) in enumerate(zip(lowered, step_keys)):
        reads = {producer[key] for key, buf in zip(keys, lk.kernel.buffers) if buf.role == "in" and key in producer}
        deps_of.append((reads | plan.waits.get(k, set())) - {k})
    symbols = set(fn.symbols)
    steps = []
    for lk, keys, deps, priority in zip(lowered, step_keys, deps_of, _critical_path(deps_of)):
        kernel = lk.kernel
        split = None
        if kernel.parallel_loop is not None:
            split = Split(len(kernel.dim_exprs) - 1, _cost_expr(kernel, symbols, hint))
        steps.append(Step(entry.get(kernel.name, kernel.name), [slot_of[key] for key in keys],
                          list(kernel.dim_exprs), sorted(deps), priority, split))
    program = Program([a.type for a in fn.args], [v.type for v in fn.return_op.operands], slots, steps,
                      plan.arena_bytes, dict(fn.symbols), [a.name or f"arg{i}" for i, a in enumerate(fn.args)])
    return ProgramBuild(program, plan, infos)


def shared_entries(kernels: CompiledKernels) -> dict[str, str]:
    """Kernel name -> the name the engine knows its code by: structurally identical kernels share one
    function (`compile_kernels` names it after the kernel text), registered once, as the first of them."""
    first: dict[str, str] = {}
    return {name: first.setdefault(sym, name) for name, sym in kernels.symbols.items()}


def _unique_by_address(kernels: CompiledKernels) -> list:
    seen: set[int] = set()
    out = []
    for k in kernels.runtime_kernels():
        if k.address not in seen:
            seen.add(k.address)
            out.append(k)
    return out


def _nbytes(shape, itemsize: int):
    n: Any = itemsize
    for d in shape:
        n = n * d
    return norm_dim(n)


def _constant(constants: dict[str, torch.Tensor], v: Value) -> torch.Tensor:
    name = v.owner.attrs["name"]
    if name not in constants:
        raise CuvilError(f"constant @{name} has no data in the module (a module parsed from text carries "
                         f"only the names of its weights); set module.constants[{name!r}]")
    t = constants[name].detach()
    if tuple(t.shape) != tuple(v.type.shape) or t.dtype != v.type.dtype.torch:
        raise CuvilError(f"constant @{name} is {t.dtype}{list(t.shape)} but the IR declares it {v.type}")
    return t.contiguous()


def _cost_expr(kernel: Kernel, symbols: set[str], hint: Sizes):
    from .runtime.exprs import to_postfix
    cost = iteration_cost_ns(kernel, symbols)
    try:
        to_postfix(cost, {s: i for i, s in enumerate(symbols)})
        return cost
    except ValueError:      # an expression the runtime cannot evaluate: take its value at the hint sizes
        return max(1, hint(cost))


def _critical_path(deps_of: list[set[int]]) -> list[int]:
    """Priority of each step: the length of the longest chain of steps that waits for it."""
    depth = [1] * len(deps_of)
    for k in reversed(range(len(deps_of))):
        for d in deps_of[k]:
            depth[d] = max(depth[d], depth[k] + 1)
    return depth


def symbol_sizes(fn: Function, inputs) -> dict[str, int]:
    """The values of `fn`'s dynamic dims in `inputs` (tensors, one per argument)."""
    sizes: dict[str, int] = {}
    for a, x in zip(fn.args, inputs):
        for d, n in zip(a.type.shape, x.shape):
            if not isinstance(d, int) and d.is_Symbol:
                sizes.setdefault(d.name, int(n))
    return sizes


# ----------------------------------------------------------------------------- the native model


@dataclass
class NativeModel:
    """A graph function compiled to native kernels and loaded into the engine."""
    function: Function
    lowered: list[LoweredKernel]
    kernels: CompiledKernels
    build: ProgramBuild
    executable: Executable
    timings: dict[str, float]
    hint_sizes: dict[str, int]

    @property
    def program(self) -> Program:
        return self.build.program

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.executable(*inputs)

    # -- the report's native sections
    def fill_report(self, report: CompileReport, sizes: dict[str, int] | None = None) -> None:
        """Kernels, schedule and memory plan (sizes evaluated at `sizes`, default the hint sizes)."""
        sizes = {**self.hint_sizes, **(sizes or {})}
        at = Sizes(sizes)
        names = value_names(self.function)
        report.kernels = [self._kernel_json(lk, names) for lk in self.lowered]
        report.schedule = [self._step_json(k, st) for k, st in enumerate(self.program.steps)]
        report.memory = self._memory_json(at, sizes)
        if not report.fusion.get("groups"):
            report.fusion = {**report.fusion, "groups": [
                {"name": lk.kernel.name, "ops": [op.id for op in lk.ops],
                 "values": ["%" + names[r] for op in lk.ops if op.name not in INLINE_OPS for r in op.results]}
                for lk in self.lowered]}

    def _kernel_json(self, lk: LoweredKernel, names) -> dict:
        name = lk.kernel.name
        locs = sorted({f"{op.loc.file}:{op.loc.line}" for op in lk.ops if op.loc is not None})
        return {"name": name, "symbol": self.kernels.symbols[name],
                "ops": [{"id": op.id, "name": op.name, "results": ["%" + names[r] for r in op.results]}
                        for op in lk.ops],
                "sources": locs, "splittable": lk.kernel.parallel_loop is not None,
                "kernel_ir": self.kernels.kernel_ir(name), "llvm_ir": self.kernels.llvm_ir(name),
                "asm": self.kernels.asm(name)}

    def _step_json(self, k: int, st: Step) -> dict:
        infos = self.build.slots
        name = self.lowered[k].kernel.name
        return {"step": k, "kernel": name, "code_of": st.kernel if st.kernel != name else None,
                "slots": [{"slot": s, "kind": infos[s].kind, "name": infos[s].name} for s in st.slots],
                "dims": [str(d) for d in st.dims], "deps": list(st.deps), "priority": st.priority,
                "split": None if st.split is None else {"extent": str(st.dims[st.split.extent]),
                                                        "cost_ns": str(st.split.cost_ns)}}

    def _memory_json(self, at: Sizes, sizes: dict[str, int]) -> dict:
        plan = self.build.plan
        return {
            "buffers": [{"name": b.use.name, "size": at(b.use.nbytes), "size_expr": str(b.use.nbytes),
                         "offset": at(b.offset), "offset_expr": str(b.offset), "region": b.region,
                         "first_step": b.use.first, "last_step": b.use.last, "reuses": b.reuses}
                        for b in plan.buffers],
            "arena_bytes": at(plan.arena_bytes), "naive_bytes": at(plan.naive_bytes),
            "arena_bytes_expr": str(plan.arena_bytes), "naive_bytes_expr": str(plan.naive_bytes),
            "regions": len(plan.region_bytes), "sizes": dict(sizes),
        }


def compile_native(module: Module, grouping: Grouping | None = None, cache=DISK_CACHE,
                   hint_sizes: dict[str, int] | None = None, timings: dict[str, float] | None = None) -> NativeModel:
    """Lower, compile and load the main function of `module` (after its pass pipeline ran).
    `hint_sizes`: symbol values the memory planner compares sizes at (default: the upper bounds)."""
    fn = module.main
    timings = timings if timings is not None else {}
    hints = {s: hi for s, (lo, hi) in fn.symbols.items()}
    hints.update(hint_sizes or {})
    t = time.perf_counter()
    materialize_outputs(fn)
    groups = (grouping or grouping_for(True))(fn)
    lowered = [lower_group(fn, g, kernel_name(fn, i, g)) for i, g in enumerate(groups)]
    timings["lowering"] = time.perf_counter() - t
    kernels = compile_kernels([lk.kernel for lk in lowered], cache=cache, timings=timings)
    timings.update(kernels.timings)
    t = time.perf_counter()
    build = build_program(fn, module.constants, lowered, Sizes(hints), shared_entries(kernels))
    timings["program"] = time.perf_counter() - t
    t = time.perf_counter()
    executable = Executable(build.program, load_module(kernels, _unique_by_address(kernels)))
    timings["engine"] = time.perf_counter() - t
    return NativeModel(fn, lowered, kernels, build, executable, timings, hints)


# ----------------------------------------------------------------------------- pipeline + native + report

# compile phases in the order they happen (codegen's names; a cache hit skips llvm_ir/optimize/codegen)
NATIVE_PHASES = ("lowering", "cache_lookup", "llvm_ir", "optimize", "codegen", "load", "program", "engine")


@dataclass
class Compilation:
    report: CompileReport
    native: NativeModel | None = None
    error: CuvilError | None = None        # why there is no native model (when not raised)
    phases: list[dict] = field(default_factory=list)


def compile_module(module: Module, *, pipeline: str = "O1", name: str = "", native: bool = True,
                   grouping: Grouping | None = None, cache=DISK_CACHE, hint_sizes: dict[str, int] | None = None,
                   phases: list[dict] | None = None, raise_errors: bool = True, details: bool = True,
                   instruments: Sequence[Instrument] = ()) -> Compilation:
    """Run `pipeline` on `module` (every pass snapshotted and verified, plus `instruments`), then
    compile it natively.

    With `raise_errors=False` a native compile that fails with a CuvilError leaves `native` None
    and the reason in `error` and in the report's phases. `details=False` leaves the report's
    kernels/schedule/memory for `NativeModel.fill_report` (the assembly takes a while)."""
    phases = list(phases or [])
    input_ir = print_module(module)
    t = time.perf_counter()
    manager = PassManager(pipeline, instruments=[IRSnapshot(), VerifyEach(), *instruments])
    records = manager.run(module)
    phases.append({"name": "passes", "time_s": time.perf_counter() - t})
    report = CompileReport(name=name, input_ir=input_ir, output_ir=print_module(module), pipeline=manager.spec,
                           passes=[r.to_json() for r in records], sources=source_lines(module.main), phases=phases)
    out = Compilation(report)
    if native:
        timings: dict[str, float] = {}
        try:
            out.native = compile_native(module, grouping, cache, hint_sizes, timings)
        except CuvilError as e:
            if raise_errors:
                raise
            out.error = e
        phases += [{"name": p, "time_s": timings[p]} for p in NATIVE_PHASES if p in timings]
        if out.error is not None:
            phases.append({"name": "native", "time_s": 0.0, "error": str(out.error)})
        else:
            report.output_ir = print_module(module)      # with the copies materialize_outputs added
            if details:
                out.native.fill_report(report)
    report.profile = {**report.profile, "compile": list(phases)}
    return out
