"""The native compile driver: graph IR (after the pass pipeline) -> kernels -> one LLVM module -> a
program for the native engine.

    groups  = grouping(fn)                       # which ops share a kernel (the fuse pass's groups)
    lowered = lower_function(fn, groups)         # one kernel per group
    compiled = compile_kernels(...)              # one LLVM module, O3, object cache, JIT
    draft   = ProgramDraft(fn, lowered, ...)     # program passes: schedule, plan-memory
    program = build_program(draft, constants)    # cuvil/program.py
    native  = NativeModel(..., Executable(program, load_module(compiled, ...)))

`compile_module(module, pipeline=...)` runs the pass pipeline too and returns a `Compilation`: the
CompileReport (passes, kernels, schedule, memory plan, compile phases) and the `NativeModel`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import time
from dataclasses import dataclass, field
from typing import Sequence

import torch

from .codegen.jit import DISK_CACHE, CompiledKernels, compile_kernels
from .codegen.target import Target
from .codegen.grouping import Grouping, grouping_for, kernel_ops
from .codegen.lower import LoweredKernel, kernel_name, lower_group, op_positions
from .errors import CuvilError
from .ir.core import Builder, Function, Module
from .ir.printer import print_module, value_names
from .passes import Instrument, IRSnapshot, PassManager, PassRecord, Pipeline, VerifyEach, get_pass
from .program import ProgramBuild, ProgramDraft, Sizes, build_program
from .report import CompileReport, source_lines
from .runtime import Executable, Program, Step, load_module

ANCHOR_ATTR = "schedule.max_latency_us"   # on an op: its step should take at most this long

# ----------------------------------------------------------------------------- grouping
# (which ops share a kernel: cuvil/codegen/grouping.py, the fuse pass's groups by default)


PRECISIONS = {"fp32": None, "bf16": "bf16", "fp16": "f16"}     # precision -> mixed-precision's dtype


def pipeline_for(pipeline: "Pipeline | str", disable_passes=(), enable_fusion=True, precision="fp32") -> Pipeline:
    """`pipeline` with the passes named in `disable_passes` switched off, fuse too when
    `enable_fusion` is False, and `mixed-precision` added for a `precision` other than fp32."""
    if precision not in PRECISIONS:
        raise CuvilError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    off = (disable_passes,) if isinstance(disable_passes, str) else tuple(disable_passes)
    passes = Pipeline.of(pipeline)
    if PRECISIONS[precision] and not any(p.name == "mixed-precision" for p in passes):
        passes = passes.insert_by_priority(get_pass("mixed-precision")(dtype=PRECISIONS[precision]))
    return passes.without(off + (("fuse",) if enable_fusion is False else ()))


def for_target(pipeline: Pipeline, target: Target | None) -> Pipeline:
    """A cross compile packs weights for its target: `layout{panel-width=0}` means the host's."""
    if target is None:
        return pipeline
    return Pipeline(tuple(dataclasses.replace(p, panel_width=target.panel_width)
                          if p.name == "layout" and p.panel_width == 0 else p for p in pipeline))


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


# ----------------------------------------------------------------------------- the program


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
    executable: Executable | None        # None: compiled for another machine (a cross target)
    timings: dict[str, float]
    hint_sizes: dict[str, int]
    draft: ProgramDraft             # the program as the program passes left it (`draft.text()`)

    @property
    def program(self) -> Program:
        return self.build.program

    def __call__(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.executable is None:
            raise CuvilError(f"this model was compiled for {self.kernels.target}; it cannot run on this machine "
                             f"({Target.host()}): compile it for the host to run it")
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
        kernel_of = {op.id: lk.kernel.name for lk in self.lowered for op in kernel_ops(lk.ops)}
        for g in report.fusion.get("groups", []):
            g["kernel"] = next((kernel_of[i] for i in g.get("ops", []) if i in kernel_of), None)

    def _kernel_json(self, lk: LoweredKernel, names) -> dict:
        name = lk.kernel.name
        locs = sorted({f"{op.loc.file}:{op.loc.line}" for op in lk.ops if op.loc is not None})
        return {"name": name, "symbol": self.kernels.symbols[name],
                "ops": [{"id": op.id, "name": op.name, "results": ["%" + names[r] for r in op.results]}
                        for op in lk.ops],
                "sources": locs, "splittable": lk.kernel.parallel_loop is not None,
                "kernel_ir": self.kernels.kernel_ir(name), "llvm_ir": self.kernels.llvm_ir(name),
                "asm": self.kernels.asm(name), "op_lines": self.kernels.op_lines(name)}

    def _step_json(self, k: int, st: Step) -> dict:
        infos = self.build.slots
        name = self.lowered[k].kernel.name
        return {"step": k, "kernel": name, "code_of": st.kernel if st.kernel != name else None,
                "slots": [{"slot": s, "kind": infos[s].kind, "name": infos[s].name} for s in st.slots],
                "dims": [str(d) for d in st.dims], "deps": list(st.deps), "priority": st.priority,
                "max_latency_us": self.build.anchors_us.get(k),
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
                   hint_sizes: dict[str, int] | None = None, timings: dict[str, float] | None = None,
                   manager: PassManager | None = None, records: list | None = None,
                   target: Target | None = None) -> NativeModel:
    """Lower, compile and load the main function of `module` (after its graph passes ran); then run
    `manager`'s program passes (schedule, plan-memory) on the program, appending their records to
    `records`. `hint_sizes`: symbol values the planner compares sizes at (default: the upper bounds).
    For a cross `target` the code is generated but not loaded: the model has no executable."""
    fn = module.main
    timings = timings if timings is not None else {}
    hints = {s: hi for s, (lo, hi) in fn.symbols.items()}
    hints.update(hint_sizes or {})
    t = time.perf_counter()
    materialize_outputs(fn)
    groups = (grouping or grouping_for(True))(fn)
    widest = (target or Target.host()).panel_width
    order = op_positions(fn)
    lowered = [lower_group(fn, g, kernel_name(fn, i, g), widest, order) for i, g in enumerate(groups)]
    timings["lowering"] = time.perf_counter() - t
    kernels = compile_kernels([lk.kernel for lk in lowered], target=target, cache=cache, timings=timings)
    timings.update(kernels.timings)
    t = time.perf_counter()
    draft = ProgramDraft(fn, lowered, Sizes(hints), anchors_us=latency_anchors(lowered),
                         same_code=shared_entries(kernels))
    if manager is not None:
        ran = manager.run_program(draft)
        if records is not None:
            records += ran
    build = build_program(draft, module.constants, shared_entries(kernels))
    timings["program"] = time.perf_counter() - t
    executable = None
    if kernels.target.is_host:
        t = time.perf_counter()
        executable = Executable(build.program, load_module(kernels, _unique_by_address(kernels)),
                                step_names=[lk.kernel.name for lk in draft.lowered])
        timings["engine"] = time.perf_counter() - t
    return NativeModel(fn, draft.lowered, kernels, build, executable, timings, hints, draft)


def fusion_decisions(records: list[PassRecord]) -> dict:
    """The decisions of the last fuse pass that ran (its "fusion" statistic), for the report."""
    for r in reversed(records):
        if r.skipped is None and "fusion" in r.statistics:
            return dict(r.statistics["fusion"])
    return {"groups": [], "refused": []}


def latency_anchors(lowered: list[LoweredKernel]) -> dict[int, float]:
    """Step -> the tightest `schedule.max_latency_us` attribute among the ops of its kernel."""
    out = {}
    for k, lk in enumerate(lowered):
        limits = [op.attrs[ANCHOR_ATTR] for op in lk.ops if ANCHOR_ATTR in op.attrs]
        if limits:
            out[k] = float(min(limits))
    return out


# ----------------------------------------------------------------------------- pipeline + native + report

@contextlib.contextmanager
def paused_gc():
    """Python's cycle collector off for a compile: torch.export and the passes make millions of
    short-lived objects, and full collections over them cost 0.1-0.3 s at random points of a BERT
    compile. Nothing is leaked: the next collection after the compile finds the cycles."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


# compile phases in the order they happen (codegen's names; a cache hit skips llvm_ir/optimize/codegen)
NATIVE_PHASES = ("lowering", "cache_lookup", "llvm_ir", "optimize", "codegen", "workers", "load", "program", "engine")


@dataclass
class Compilation:
    report: CompileReport
    native: NativeModel | None = None
    error: CuvilError | None = None        # why there is no native model (when not raised)
    phases: list[dict] = field(default_factory=list)


def compile_module(module: Module, *, pipeline: str = "O1", name: str = "", native: bool = True,
                   grouping: Grouping | None = None, cache=DISK_CACHE, hint_sizes: dict[str, int] | None = None,
                   phases: list[dict] | None = None, raise_errors: bool = True, details: bool = True,
                   instruments: Sequence[Instrument] = (), target: Target | None = None) -> Compilation:
    """Run `pipeline` on `module` (every pass snapshotted and verified, plus `instruments`), then
    compile it natively.

    With `raise_errors=False` a native compile that fails with a CuvilError leaves `native` None
    and the reason in `error` and in the report's phases. `details=False` leaves the report's
    kernels/schedule/memory for `NativeModel.fill_report` (the assembly takes a while). A cross
    `target` (`Target.cross("aarch64")`) generates that machine's code, for the report only."""
    phases = list(phases or [])
    input_ir = print_module(module)
    t = time.perf_counter()
    manager = PassManager(for_target(Pipeline.of(pipeline), target), instruments=[IRSnapshot(), VerifyEach(), *instruments])
    records = manager.run(module)
    program_records: list = []
    phases.append({"name": "passes", "time_s": time.perf_counter() - t})
    report = CompileReport(name=name, input_ir=input_ir, output_ir=print_module(module), pipeline=manager.spec,
                           passes=[r.to_json() for r in records], sources=source_lines(module.main), phases=phases,
                           fusion=fusion_decisions(records))
    out = Compilation(report)
    if native:
        timings: dict[str, float] = {}
        try:
            out.native = compile_native(module, grouping, cache, hint_sizes, timings, manager, program_records,
                                        target)
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
    if out.native is None:
        program_records = [PassRecord(p.name, p.options(), p.spec(), stage="program",
                                      skipped="not compiled natively" if native else "native=False")
                           for p in manager.program_passes]
    report.passes += [r.to_json() for r in program_records]
    report.profile = {**report.profile, "compile": list(phases)}
    return out
