"""Compile a cell's target to native code, run it in the kernel, check it against a reference
(eager PyTorch for Python code, the input IR for an IR cell), time both and profile one run.

Python code compiles with `cuvil.compile` (IR text with the same driver, `compile_module`). When the
native compile fails, the model runs on Cuvil's reference interpreter instead, and the explorer
says why.
"""
from __future__ import annotations

import statistics
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

import cuvil
from cuvil import CompileReport, CuvilError
from cuvil.codegen.target import Target as CodeTarget
from cuvil.compiler import NativeModel, compile_module
from cuvil.ir.interpreter import random_constants
from cuvil.passes import random_inputs
from cuvil.report_html import Stage, ir_stages

from .bisect import Bisection, bisect_passes
from .cell import Target

TIMING_BUDGET_S = 0.25     # per side, for the medians against the reference
MIN_RUNS, MAX_RUNS = 3, 25


class InterpretedModel:
    """A model Cuvil could not compile natively, run by its reference interpreter (`cuvil.interpret`)
    on the IR the pipeline produced. Call it like the original model."""

    def __init__(self, imported: cuvil.frontend.ImportResult):
        self.imported = imported

    @property
    def module(self) -> cuvil.Module:
        return self.imported.module

    def __call__(self, *args, **kwargs):
        flat = self.imported.flatten_inputs(*args, **kwargs)
        with torch.no_grad():   # inference: weights are parameters, results need no autograd history
            return self.imported.unflatten(cuvil.interpret(self.module, *flat))


class InterpretedIR:
    """An IR module run by the interpreter with fixed constants (random ones: IR text carries no weights)."""

    def __init__(self, module: cuvil.Module, constants: dict[str, torch.Tensor]):
        self.module, self.constants = module, constants

    def __call__(self, *inputs):
        out = cuvil.interpret(self.module, *inputs, constants=self.constants)
        return out[0] if len(out) == 1 else tuple(out)


class NativeIR:
    """An IR module compiled to native code; `profile(*inputs)` records one run in the report."""

    def __init__(self, native: NativeModel, report: CompileReport):
        self.native, self.report = native, report

    def __call__(self, *inputs):
        out = self.native(*inputs)
        return out[0] if len(out) == 1 else tuple(out)

    def profile(self, *inputs):
        outputs, timings = self.native.executable.profile(*inputs)
        self.report.profile["run"] = [t._asdict() for t in timings]
        return outputs, timings


@dataclass
class CellRun:
    """Everything one `%%cuvil` cell produced."""
    target: Target
    report: CompileReport
    compiled: Callable
    engine: str = "native"             # "native", or "interpreter" when the native compile failed
    note: str = ""                     # why the interpreter runs it
    result: Any = None                 # compiled(*example inputs); None with --no-run
    reference: str = ""                # what the result was compared with
    max_abs_err: float | None = None
    cached: bool = False               # True when this display came from the cell cache
    svgs: dict[int, str | None] = field(default_factory=dict)   # graph drawings by stage, drawn on demand
    constants: dict[str, torch.Tensor] = field(default_factory=dict)   # the weights, for the pass bisection
    flat_inputs: list[torch.Tensor] = field(default_factory=list)      # the example inputs, as the IR takes them
    bisection: Bisection | None = None
    _stages: list[Stage] | None = None

    @property
    def stages(self) -> list[Stage]:
        if self._stages is None:
            self._stages = ir_stages(self.report)
        return self._stages

    def bisect(self, rtol: float = 1e-4, atol: float = 1e-5) -> Bisection:
        """Run the pipeline again on the input IR, checking the results after every pass that
        changed the IR (`cuvil.passes.NumericCheck`); the first pass beyond tolerance is named."""
        self.bisection = bisect_passes(self.report, self.constants, self.flat_inputs, rtol, atol)
        return self.bisection


def compile_target(target: Target, pipeline: str, dynamic=None, run: bool = True, machine: str = "host") -> CellRun:
    """`machine`: "host", or a cross target (`cuvil.codegen.target.CROSS_TARGETS`) whose code is
    generated and shown but not run."""
    if target.is_ir:
        out = _compile_ir(target, pipeline, machine)
    else:
        out = _compile_python(target, pipeline, dynamic, machine)
    if machine != "host":
        out.note = f"compiled for {machine}: the code is shown, not run on this machine"
    elif run:
        _run(out)
    return out


def _compile_python(target: Target, pipeline: str, dynamic, machine: str) -> CellRun:
    # the explorer shows the capture and every pass, which a compiled-model cache hit would skip
    compiled = cuvil.compile(target.fn, pipeline=pipeline, dynamic=dynamic, ranges=target.ranges, target=machine,
                             cache="objects")
    with warnings.catch_warnings():   # torch.export's own deprecation notices are not the user's business
        warnings.simplefilter("ignore", FutureWarning)
        try:
            compiled.compile_for(*target.args, **target.kwargs)
        except CuvilError as e:
            if not _native_failed(compiled):
                raise            # the import or a pass failed: the user's code or IR, shown as an error panel
            return _interpret_python(target, pipeline, dynamic, str(e))
    imported = compiled.imported
    report = compiled.report
    report.name = target.label
    return CellRun(target, report, compiled, reference="eager PyTorch", constants=_weights(imported),
                   flat_inputs=list(imported.flatten_inputs(*target.args, **target.kwargs)))


def _weights(imported: cuvil.frontend.ImportResult) -> dict[str, torch.Tensor]:
    """The weights the input IR names. The pipeline ran on `imported.module`, whose constants lost
    those it folded away (batch norms into convolutions), so take them from the exported program."""
    exported = imported.exported
    return {name: t.detach() for name, t in {**exported.state_dict, **exported.constants,
                                             **imported.module.constants}.items()}


def _native_failed(compiled: cuvil.CompiledModel) -> bool:
    try:
        report = compiled.report
    except CuvilError:           # nothing got as far as the pipeline
        return False
    return any(ph["name"] == "native" and ph.get("error") for ph in report.phases)


def _interpret_python(target: Target, pipeline: str, dynamic, reason: str) -> CellRun:
    example = target.kwargs if target.kwargs else target.args
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        imported = cuvil.import_model(target.fn, example, dynamic=dynamic, ranges=target.ranges)
    constants = dict(imported.module.constants)
    report = cuvil.explain(imported, pipeline=pipeline, name=target.label, native=False)
    report.phases.append({"name": "native", "time_s": 0.0, "error": reason})
    return CellRun(target, report, InterpretedModel(imported), engine="interpreter",
                   note=f"native compile failed: {reason}", reference="eager PyTorch", constants=constants,
                   flat_inputs=list(imported.flatten_inputs(*target.args, **target.kwargs)))


def _compile_ir(target: Target, pipeline: str, machine: str) -> CellRun:
    module = cuvil.parse(target.ir_text, filename=target.filename)
    constants = random_constants(module)
    inputs = list(target.args) or random_inputs(module, None, 0, {})
    module.constants.update(constants)
    compilation = compile_module(module, pipeline=pipeline, name=module.main.name, raise_errors=False,
                                 target=None if machine == "host" else CodeTarget.cross(machine))
    reference = "the input IR (random constants)"
    if compilation.native is None:
        reason = str(compilation.error)
        return CellRun(target, compilation.report, InterpretedIR(module, constants), engine="interpreter",
                       note=f"native compile failed: {reason}", reference=reference, constants=constants,
                       flat_inputs=inputs)
    return CellRun(target, compilation.report, NativeIR(compilation.native, compilation.report),
                   reference=reference, constants=constants, flat_inputs=inputs)


def _run(out: CellRun) -> None:
    """Run the compiled model on the example inputs, compare with the reference, time both (medians
    of a few runs), and profile one native run."""
    t = out.target
    if t.is_ir:
        args, kwargs = tuple(out.flat_inputs), {}
        source = cuvil.parse(t.ir_text, filename=t.filename)

        def reference():
            return cuvil.interpret(source, *args, constants=out.constants)
    else:
        args, kwargs = t.args, t.kwargs

        def reference():
            with torch.no_grad():
                return t.fn(*args, **kwargs)

    def compiled():
        return out.compiled(*args, **kwargs)

    expected = reference()
    check: dict[str, Any] = {"engine": _engine_label(out), "reference": out.reference}
    if not t.is_ir:                    # speed against eager; the input IR runs on the interpreter
        check["reference_median_s"], check["reference_runs"] = _median(reference)
    out.result = compiled()
    out.max_abs_err = check["max_abs_err"] = max_abs_error(expected, out.result)
    check["compiled_median_s"], check["runs"] = _median(compiled)
    out.report.profile["vs_eager"] = check
    if out.engine == "native":
        out.compiled.profile(*args, **kwargs)


def _engine_label(out: CellRun) -> str:
    if out.engine == "native":
        return f"native code ({len(out.report.kernels)} kernels)"
    return f"the reference interpreter ({out.note})"


def _median(fn: Callable) -> tuple[float, int]:
    """The median time of `fn` over MIN_RUNS to MAX_RUNS calls (as many as TIMING_BUDGET_S allows),
    and the number of calls."""
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < MIN_RUNS or (len(times) < MAX_RUNS and time.perf_counter() - start < TIMING_BUDGET_S):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), len(times)


def max_abs_error(expected: Any, actual: Any) -> float:
    """The largest absolute difference over the tensors of two results of the same structure."""
    want = [t for t in pytree.tree_leaves(expected) if isinstance(t, torch.Tensor)]
    got = [t for t in pytree.tree_leaves(actual) if isinstance(t, torch.Tensor)]
    if len(want) != len(got):
        raise CuvilError(f"the compiled model returned {len(got)} tensors, the reference {len(want)}")
    worst = 0.0
    for i, (e, a) in enumerate(zip(want, got)):
        if e.shape != a.shape:
            raise CuvilError(f"result {i} has shape {list(a.shape)}, the reference {list(e.shape)}")
        if e.numel():
            worst = max(worst, float((e.double() - a.double()).abs().max()))
    return worst
